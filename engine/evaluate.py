"""Greedy evaluation on held-out seeds: the same EnvManager loop, temperature 0, no training."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from typing import Any

from engine.envs.registry import make_env
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import EnvManager, Generator
from engine.rollout.scheduler import TaskSpec
from engine.types import Trajectory


async def evaluate(
    tasks: list[TaskSpec],
    chat: ChatFormat,
    gen: Generator,
    seeds: dict[str, list[int]],
    concurrency: int = 32,
) -> dict[str, dict[str, Any]]:
    """Per task: {"success", "reward", "episodes"} over its seeds (success = env said so, else reward > 0)."""
    sem = asyncio.Semaphore(concurrency)

    async def episode(spec: TaskSpec, seed: int) -> Trajectory:
        async with sem:
            limits = dataclasses.replace(spec.limits, temperature=0.0)
            env = make_env(spec.env, **spec.env_args)
            try:
                return await EnvManager(env, chat, gen, limits, spec.profile).run(
                    Trajectory(f"eval-{spec.name}-{seed}", "eval", spec.name, seed)
                )
            finally:
                await env.close()

    out: dict[str, dict[str, Any]] = {}
    for spec in tasks:
        trajs = await asyncio.gather(*(episode(spec, s) for s in seeds.get(spec.name, [])))
        if not trajs:
            continue
        out[spec.name] = {
            "success": statistics.fmean(bool(t.info.get("success", t.env_return > 0)) for t in trajs),
            "reward": statistics.fmean(t.env_return for t in trajs),
            "episodes": len(trajs),
        }
    return out
