"""Evaluation on held-out problems, with the numbers that say whether anything was learned.

Each task with `eval_problems = n` plays its env's `eval` split (`engine.envs.split`): seeds 0..n-1 are n
distinct problems whose text no training env ever poses, through the same EnvManager loop and generation
workers as training. Decoding is greedy by default; with `eval_temperature > 0` each problem is played
`eval_samples` times by sampling, which measures the policy's own success rate (a policy that learned a
mixed strategy, e.g. "down or right" on FrozenLake, can fail every greedy episode). Reported per task:

* `success`: the env's exact-match success over all episodes (one that fails to run counts as a failure);
  `lenient` (right answer anywhere in the output) and `partial` (graded score) where the env has them;
* `n_eval`: distinct problems actually posed (by their text), and their ids for the overlap count;
* `versions`: the policy versions that produced the answers (a final eval must show the last one).

`majority_baseline` is the best *constant* answer on the same problems (the most common answer, or the
one move repeated every turn): a score at or below it shows nothing was learned about the problems.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from typing import Any

from engine.envs.base import Env
from engine.envs.registry import make_env
from engine.envs.split import problem_id
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import EnvManager, Generator
from engine.rollout.scheduler import TaskSpec
from engine.types import Trajectory, TrajStatus


def eval_env(spec: TaskSpec) -> Env:
    return make_env(spec.env, **{**spec.env_args, "split": "eval"})


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


async def evaluate(
    tasks: list[TaskSpec], chat: ChatFormat, gen: Generator, concurrency: int = 32
) -> dict[str, dict[str, Any]]:
    """Per task with `eval_problems > 0`: success, reward, lenient, partial, n_eval, problem ids, versions."""
    sem = asyncio.Semaphore(concurrency)

    async def episode(spec: TaskSpec, seed: int, sample: int) -> Trajectory:
        async with sem:
            limits = dataclasses.replace(spec.limits, temperature=spec.eval_temperature)
            env = eval_env(spec)
            try:
                return await EnvManager(env, chat, gen, limits, spec.profile).run(
                    Trajectory(f"eval-{spec.name}-{seed}.{sample}", "eval", spec.name, seed)
                )
            finally:
                await env.close()

    out: dict[str, dict[str, Any]] = {}
    for spec in tasks:
        if not spec.eval_problems:
            continue
        trajs = await asyncio.gather(
            *(episode(spec, s, k) for s in range(spec.eval_problems) for k in range(spec.eval_samples))
        )
        played = [t for t in trajs if t.turns]
        ok = [t for t in trajs if t.status in (TrajStatus.DONE, TrajStatus.TRUNCATED)]
        out[spec.name] = {
            "success": statistics.fmean(bool(t.info.get("success")) for t in trajs),
            "reward": statistics.fmean(t.env_return for t in trajs),
            "lenient": _mean([float(t.info["lenient"]) for t in ok if "lenient" in t.info]),
            "partial": _mean([float(t.info["partial"]) for t in ok if "partial" in t.info]),
            "episodes": len(trajs),
            "failed": len(trajs) - len(ok),
            "n_eval": len({t.turns[0].observation for t in played}),
            "problems": sorted({problem_id(t.turns[0].observation) for t in played}),
            "versions": sorted({turn.version for t in played for turn in t.turns}),
        }
    return out


async def majority_baseline(spec: TaskSpec) -> dict[str, Any]:
    """The best constant answer on the task's eval problems: {"answer", "success"}."""
    probe = eval_env(spec)
    candidates: list[str] = probe.answer_candidates()  # type: ignore[attr-defined]
    await probe.close()
    best: dict[str, Any] = {"answer": None, "success": 0.0}
    for answer in candidates:
        wins = 0
        for seed in range(spec.eval_problems):
            env = eval_env(spec)
            await env.reset(seed)
            for _ in range(spec.limits.max_turns):
                step = await env.step(env.format_answer(answer))
                if step.done:
                    wins += bool(step.info.get("success"))
                    break
            await env.close()
        success = wins / spec.eval_problems
        if success > best["success"] or best["answer"] is None:
            best = {"answer": answer, "success": success}
    return best
