"""A task's config: its environment, group size, budgets, held-out split and how it is scored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.config.base import Strict
from engine.envs.base import unknown_choice
from engine.envs.registry import ENV_NAMES, SPLIT_ENVS
from engine.envs.split import MAX_EVAL_FRACTION
from engine.types import Profile

JUDGE_FIELDS = ("model", "serverless", "idle_s", "max_replicas", "max_tokens")


class RewardConfig(Strict):
    """How a task's finished trajectories are scored: by the environment's rule (its return), or by an LLM
    judge on a scale-to-zero Ray Serve endpoint (engine/rollout/judge_endpoints.py). Held-out evaluation
    always uses the environment's rule: a judge is what is trained on, not what success is measured by."""

    kind: Literal["rule", "llm-judge"] = "rule"
    model: str | None = Field(
        None, description="llm-judge: an HF model directory, or 'policy' for the run's own base model"
    )
    serverless: bool = Field(
        True, description="llm-judge: on a serverless endpoint (the one way a judge runs here)"
    )
    idle_s: float = Field(10.0, gt=0, description="seconds without a call before a judge replica stops")
    max_replicas: int = Field(1, ge=1, description="judge replicas at most (each a reward-pool unit)")
    max_tokens: int = Field(4, ge=1, description="the judge's reply budget; its first word is the verdict")

    @model_validator(mode="after")
    def _judge_fields(self) -> RewardConfig:
        if self.kind == "rule":
            # by value, not by presence: the resolved form (every default written out) loads back
            given = [k for k in JUDGE_FIELDS if getattr(self, k) != type(self).model_fields[k].default]
            if given:
                raise ValueError(f"{given[0]}: only an llm-judge reward takes it (kind is rule)")
            return self
        if not self.model:
            raise ValueError("model: an llm-judge reward names its judge (an HF model directory, or policy)")
        if not self.serverless:
            raise ValueError(
                "serverless: a judge runs on a scale-to-zero endpoint (infra/serve.py); an in-process "
                "judge is not implemented"
            )
        return self


class TaskConfig(Strict):
    name: str = ""  # label in metrics; defaults to env (+ a distinguishing arg)
    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    weight: float = Field(1.0, gt=0)
    group_size: int = Field(8, ge=2, description="G: GRPO group size")
    max_turns: int = Field(10, ge=1)
    max_tokens: int = Field(16, ge=1, description="generation budget per turn")
    profile: Profile = Profile.PREFILL_HEAVY
    response_prefix: str = Field(
        "",
        description="text each reply starts with, prefilled into the prompt (e.g. '<answer>'); the env "
        "scores prefix + generated text, and only the generated tokens are trained",
    )
    reward: RewardConfig = Field(default_factory=RewardConfig)
    eval_problems: int = Field(
        0, ge=0, description="distinct held-out problems (maps) evaluated; 0 = no evaluation of this task"
    )
    eval_fraction: float | None = Field(
        None,
        gt=0,
        le=MAX_EVAL_FRACTION,
        description="share of the problem space held out by text (default 0.2 when eval_problems > 0)",
    )
    eval_temperature: float = Field(
        0.0, ge=0, description="0: greedy evaluation; > 0: sampled, the policy's own success rate"
    )
    eval_samples: int = Field(1, ge=1, description="episodes per held-out problem (a sampled evaluation)")

    @field_validator("env")
    @classmethod
    def _known_env(cls, v: str) -> str:
        if v not in ENV_NAMES:
            raise unknown_choice("environment", v, ENV_NAMES)
        return v

    @field_validator("env_args")
    @classmethod
    def _sandbox_is_a_backend(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "sandbox" in v:
            raise ValueError("sandbox: set backends.sandbox (and backends.kubernetes_sandbox), not a task's")
        return v

    @model_validator(mode="after")
    def _attempts_fit(self) -> TaskConfig:
        attempts = self.env_args.get("attempts", 1)
        if isinstance(attempts, int) and attempts > self.max_turns:
            raise ValueError(
                f"env_args.attempts: {attempts} answers need max_turns >= {attempts}, not {self.max_turns}"
            )
        return self

    @model_validator(mode="after")
    def _eval_split(self) -> TaskConfig:
        if self.eval_samples > 1 and self.eval_temperature == 0:
            raise ValueError(
                "eval_samples: greedy evaluation plays each problem one way; set eval_temperature"
            )
        if self.eval_problems == 0:
            # by value, not by presence: a resolved config writes every field, its defaults included
            fields = type(self).model_fields
            unused = [
                k
                for k in ("eval_fraction", "eval_temperature", "eval_samples")
                if getattr(self, k) != fields[k].default
            ]
            if unused:
                raise ValueError(f"{unused[0]}: set eval_problems too (nothing is evaluated without it)")
            return self
        if self.env not in SPLIT_ENVS:
            raise ValueError(
                f"eval_problems: env {self.env!r} has no held-out split; "
                f"tasks with one: {', '.join(SPLIT_ENVS)}"
            )
        if self.env == "frozenlake" and not self.env_args.get("random_map"):
            raise ValueError(
                "eval_problems: FrozenLake needs env_args.random_map: true (one fixed map is one problem)"
            )
        if self.eval_fraction is None:
            self.eval_fraction = 0.2
        return self

    @model_validator(mode="after")
    def _default_name(self) -> TaskConfig:
        if not self.name:
            arg = self.env_args.get("dataset") or self.env_args.get("game_id")
            self.name = f"{self.env}/{arg}" if arg else self.env
        return self
