"""What an experiment config becomes at the actor edge: task specs, thread counts, weight-store sizes."""

from __future__ import annotations

import os
from pathlib import Path

from engine.config import ExperimentConfig
from engine.rollout.env_manager import TurnLimits
from engine.rollout.scheduler import TaskSpec


def store_bytes(model_dir: Path, versions: int = 3) -> int:
    """Room for `versions` copies of the model's weights (their safetensors size), at least 256 MiB."""
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    return max(256 << 20, versions * weights + (64 << 20))


def threads(n: int, mode: str, pool_cores: list[int] | None = None) -> int:
    """A role's CPU threads: `n`, else one per core of its pool where the pool lists them, else every
    core of this machine where training and generation take turns (sync, sync+), half of them where they
    run at once (each busy role spinning on every core made a 1.2M-parameter train step 3x slower on 2
    cores than one thread each)."""
    if n or pool_cores:
        return n or len(pool_cores or [])
    cores = os.cpu_count() or 1
    return cores if mode in ("sync", "sync+") else max(1, cores // 2)


def task_specs(cfg: ExperimentConfig) -> list[TaskSpec]:
    return [
        TaskSpec(
            t.name,
            t.env,
            {**t.env_args, "eval_fraction": t.eval_fraction} if t.eval_problems else dict(t.env_args),
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
