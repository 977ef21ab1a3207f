"""What an experiment config becomes at the actor edge: task specs (with their sandbox), the trainer's and
the rollout's arguments, thread counts, weight-store sizes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import modes
from engine.config import ExperimentConfig, TaskConfig
from engine.envs.base import Env
from engine.envs.registry import SANDBOX_ENVS
from engine.faults import FaultyEnvFactory, FaultyScore
from engine.rollout.env_manager import TurnLimits
from engine.rollout.reward import RewardScorer, ScoreFn
from engine.rollout.scheduler import TaskSpec
from infra.sandbox.k8s_objects import kubeconfig_path


def store_bytes(model_dir: Path, versions: int = 3) -> int:
    """Room for `versions` copies of the model's weights (their safetensors size), at least 256 MiB."""
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    return max(256 << 20, versions * weights + (64 << 20))


def threads(n: int, mode: modes.Mode, pool_cores: list[int] | None = None) -> int:
    """A role's CPU threads: `n`, else one per core of its pool where the pool lists them, else every
    core of this machine where training and generation take turns (`ModePolicy.on_policy`: sync, sync+),
    half of them where they run at once (each busy role spinning on every core made a 1.2M-parameter
    train step 3x slower on 2 cores than one thread each)."""
    if n or pool_cores:
        return n or len(pool_cores or [])
    cores = os.cpu_count() or 1
    return cores if modes.policy(mode).on_policy else max(1, cores // 2)


def sandbox_args(cfg: ExperimentConfig) -> dict[str, Any]:
    """`make_sandbox`'s arguments (infra/sandbox): the backend and its settings, the kubeconfig path
    resolved here on the driver, so that the rollout actor reads the file its warm-up checked."""
    k8s = cfg.backends.kubernetes_sandbox
    if k8s is None:
        return {"backend": cfg.backends.sandbox}
    return {
        "backend": cfg.backends.sandbox,
        **k8s.model_dump(),
        "kubeconfig": kubeconfig_path(k8s.kubeconfig),
    }


def _env_args(cfg: ExperimentConfig, t: TaskConfig) -> dict[str, Any]:
    """A task's env arguments plus those the run decides: its held-out share, the sandbox."""
    args = dict(t.env_args)
    if t.eval_problems:
        args["eval_fraction"] = t.eval_fraction
    if t.env in SANDBOX_ENVS:
        args["sandbox"] = sandbox_args(cfg)
    return args


def task_specs(cfg: ExperimentConfig) -> list[TaskSpec]:
    return [
        TaskSpec(
            t.name,
            t.env,
            _env_args(cfg, t),
            t.weight,
            t.group_size,
            TurnLimits(
                t.max_turns,
                t.max_tokens,
                cfg.model.max_context,
                cfg.rollout.temperature,
                cfg.rollout.env_timeout_s,
                t.response_prefix,
            ),
            t.profile.value,
            t.eval_problems,
            t.eval_temperature,
            t.eval_samples,
        )
        for t in cfg.tasks
    ]


def trainer_args(cfg: ExperimentConfig) -> dict[str, Any]:
    """The train workers' `TrainerConfig` settings, under the trainer's names."""
    t = cfg.train
    return {
        "lr": t.lr,
        "warmup_steps": t.warmup_steps,
        "micro_batch_size": t.micro_batch,
        "max_grad_norm": t.grad_clip,
        "weight_decay": t.weight_decay,
        "betas": t.betas,
        "clip_low": t.clip_low,
        "clip_high": t.clip_high,
        "clip_to": t.clip_to,
        "is_cap": t.is_cap,
        "kl_beta": t.kl_beta,
        "seed": t.seed,
        "temperature": cfg.rollout.temperature,
        "dtype": cfg.model.dtype,
    }


def rollout_args(
    cfg: ExperimentConfig,
    model_dir: str,
    proxy: Any,
    env_factory: Callable[[TaskSpec], Env],
    score: ScoreFn,
) -> dict[str, Any]:
    """The environment worker's `RolloutService` arguments (fault injection wrapped in where asked)."""
    faults = cfg.faults
    return {
        "tasks": task_specs(cfg),
        "tokenizer_dir": model_dir,
        "proxy": proxy,
        "mode": cfg.train.mode,
        "alpha": cfg.train.alpha,
        "concurrency": cfg.rollout.concurrency,
        "redundancy": cfg.rollout.redundancy,
        "batch_groups": cfg.train.batch_groups,
        "seed": cfg.train.seed,
        "granularity": cfg.rollout.granularity,
        "env_factory": FaultyEnvFactory(faults, env_factory) if faults.env_faults else env_factory,
        "reward": RewardScorer(
            FaultyScore(faults, score) if faults.reward_faults else score,
            retries=cfg.rollout.reward_retries,
            timeout_s=cfg.rollout.reward_timeout_s,
        ),
        "drop_uniform": cfg.train.drop_uniform_groups,
    }
