"""Reward: score each trajectory the moment it finishes, without blocking rollout (paper §6.2).

`RewardScorer` wraps any score function — a rule run in-process (the env's own return, a
reasoning-gym scorer), a Ray actor, or a serverless endpoint (`infra.serverless.ServerlessClient`,
e.g. an LLM judge on a scale-to-zero Ray Serve deployment). A failing call is retried with
exponential backoff; after the last attempt the trajectory is marked FAILED with the reason, and a
NaN or infinite score is a failure too (it would poison the group's advantages).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from engine.types import Failure, FailureReason, Trajectory, TrajStatus

ScoreFn = Callable[[Trajectory], "float | Awaitable[float]"]


def env_return(traj: Trajectory) -> float:
    """The rule reward: what the environment paid out over the episode."""
    return traj.env_return


def judge_payload(traj: Trajectory) -> dict[str, Any]:
    """What a remote scorer (serverless endpoint, LLM judge) receives: JSON, no token ids."""
    return {
        "task": traj.task,
        "seed": traj.seed,
        "status": traj.status.value,
        "env_return": traj.env_return,
        "turns": [{"observation": t.observation, "action": t.action_text} for t in traj.turns],
    }


class TaskScores:
    """A score function per task (e.g. an LLM judge's endpoint), `default` (the env's rule) for the others."""

    def __init__(self, by_task: Mapping[str, ScoreFn], default: ScoreFn = env_return) -> None:
        self.by_task, self.default = dict(by_task), default

    def __call__(self, traj: Trajectory) -> float | Awaitable[float]:
        return self.by_task.get(traj.task, self.default)(traj)


class RewardScorer:
    def __init__(
        self, score: ScoreFn = env_return, retries: int = 3, backoff_s: float = 0.1, timeout_s: float = 60.0
    ):
        self.score, self.retries, self.backoff_s, self.timeout_s = score, retries, backoff_s, timeout_s
        self.counts: Counter[str] = Counter()

    async def _once(self, traj: Trajectory) -> float:
        value = self.score(traj)
        if inspect.isawaitable(value):
            async with asyncio.timeout(self.timeout_s):
                value = await value
        return float(value)

    async def __call__(self, traj: Trajectory) -> Trajectory:
        """Set `traj.reward`, or mark the trajectory FAILED with the reason."""
        last = Failure(FailureReason.REWARD_FAILED)
        for attempt in range(self.retries + 1):
            if attempt:
                self.counts["retries"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                value = await self._once(traj)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any scorer failure is retried, then counted
                last = Failure(FailureReason.REWARD_FAILED, str(e)[:200], type(e).__name__)
                continue
            if not math.isfinite(value):
                self.counts["failed_not_finite"] += 1
                traj.status = TrajStatus.FAILED
                traj.failure = Failure(FailureReason.REWARD_NOT_FINITE, str(value))
                return traj
            traj.reward = value
            self.counts["scored"] += 1
            return traj
        self.counts["failed"] += 1
        traj.status, traj.failure = TrajStatus.FAILED, last
        return traj
