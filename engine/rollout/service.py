"""RolloutService: the env loops, scheduler, reward and SampleBuffer of a run, in one async actor.

It talks to the LLMProxy (another actor, or a local object in tests) through `ProxyClient`, and to the
trainer side only through `get_batch` (or `take_batch`) / `advance` / `release_wave`. In a run it is the
environment role's worker (`engine/rollout/rollout_worker.py`, built by a Cluster); as an actor it needs
a high `max_concurrency` — all methods are async, one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections import Counter, defaultdict
from typing import Any

from engine import modes
from engine.core.handles import acall
from engine.envs.base import Env
from engine.envs.registry import make_env
from engine.envs.split import problem_id
from engine.rollout.assembly import RolloutSpec, build_rollout
from engine.rollout.chat import ChatFormat
from engine.rollout.reward import RewardScorer
from engine.rollout.scheduler import TaskSpec
from engine.rollout.selection import SelectionBias
from engine.types import GenOutput, GenRequest, Group, Trajectory, TrajStatus


class ProxyClient:
    """The scheduler's generator: forwards to the LLMProxy (actor handle or local object)."""

    def __init__(self, proxy: Any):
        self.proxy = proxy

    async def generate(self, request: GenRequest) -> GenOutput:
        return await acall(self.proxy.generate, request)

    def release(self, trajectory_id: str) -> None:
        if hasattr(self.proxy.release, "remote"):
            self.proxy.release.remote(trajectory_id)  # fire and forget
        else:
            self.proxy.release(trajectory_id)


def default_env_factory(spec: TaskSpec) -> Env:
    return make_env(spec.env, **spec.env_args)


class RolloutService:
    def __init__(
        self,
        tasks: list[TaskSpec],
        tokenizer_dir: str,
        proxy: Any,
        mode: modes.Mode,
        alpha: int,
        concurrency: int,
        redundancy: int,
        batch_groups: int,
        seed: int = 0,
        granularity: str = "trajectory",
        env_factory: Any = default_env_factory,
        reward: RewardScorer | None = None,
        drop_uniform: bool = False,
    ):
        from engine.models.tokenizer import load_tokenizer  # transformers: in the actor, not the driver

        tokenizer = load_tokenizer(tokenizer_dir)
        self.reward = reward or RewardScorer()
        spec = RolloutSpec(
            tasks=tuple(tasks),
            concurrency=concurrency,
            mode=mode,
            alpha=alpha,
            redundancy=redundancy,
            batch_groups=batch_groups,
            seed=seed,
            granularity=granularity,
            drop_uniform=drop_uniform,
        )
        self.buffer, self.scheduler = build_rollout(
            spec, ChatFormat(tokenizer), ProxyClient(proxy), env_factory, self.reward
        )
        self._runner: asyncio.Task[None] | None = None
        self._problems: dict[str, set[str]] = defaultdict(set)  # task -> ids of the problems rolled out
        self.bias = SelectionBias()

    async def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.ensure_future(self.scheduler.run())

    async def stop(self) -> None:
        self.scheduler.stop()
        if self._runner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner

    async def get_batch(self, num_groups: int, version: int, timeout_s: float | None = None) -> list[Group]:
        """Wait for a batch — or for the rollout to end, whose reason is raised instead of hanging."""
        batch = asyncio.ensure_future(self.buffer.get_batch(num_groups, version, timeout_s))
        if self._runner is not None:
            await asyncio.wait({batch, self._runner}, return_when=asyncio.FIRST_COMPLETED)
        if self._runner is None or batch.done():
            groups = await batch
            self.bias.trained(groups)
            return groups
        batch.cancel()
        self._runner.result()  # re-raises if the scheduler crashed
        raise RuntimeError(f"rollout stopped: {self.scheduler.ledger.fatal or 'the scheduler ended'}")

    async def take_batch(
        self, num_groups: int, version: int, timeout_s: float | None = None
    ) -> tuple[dict[str, int], list[Group]]:
        """`get_batch` for the trainer: (its size, the groups). The iteration protocol calls it through
        `acall_split`, so on Ray the groups go from this actor's object store straight to the trainer and
        only the size passes through the driver."""
        groups = await self.get_batch(num_groups, version, timeout_s)
        return {"action_tokens": sum(m.num_action_tokens for g in groups for m in g.members)}, groups

    async def advance(self, version: int) -> int:
        return await self.scheduler.advance(version)

    def release_wave(self, n: int = 1) -> None:
        self.scheduler.release_wave(n)

    def scheduler_state(self) -> dict[str, Any]:
        """Saved with each checkpoint: a resumed run draws the problems that come next, not the first ones
        again (the groups in flight at the save are skipped, not replayed)."""
        return self.scheduler.state()

    def restore_scheduler(self, state: dict[str, Any]) -> None:
        if self._runner is not None:
            raise RuntimeError("restore the scheduler before the rollout starts")
        self.scheduler.restore(state)

    def _drain(self) -> list[Trajectory]:
        finished = self.scheduler.ledger.drain_finished()
        self.bias.ended(finished)
        for t in finished:
            if t.turns:
                self._problems[t.task].add(problem_id(t.turns[0].observation))
        return finished

    def problems(self) -> dict[str, list[str]]:
        """Per task, the ids of every problem (first observation) rolled out so far: what evaluation's
        overlap count compares the held-out problems against."""
        self._drain()
        return {task: sorted(ids) for task, ids in self._problems.items()}

    def stats(self) -> dict[str, Any]:
        """Counters since the start, plus per-task outcomes of trajectories finished since the last call."""
        finished = self._drain()
        by_task: dict[str, list[Trajectory]] = defaultdict(list)
        for t in finished:
            by_task[t.task].append(t)
        per_task = {}
        for task, trajs in by_task.items():
            ok = [
                t
                for t in trajs
                if t.status in (TrajStatus.DONE, TrajStatus.TRUNCATED) and t.reward is not None
            ]
            per_task[task] = {
                "finished": len(trajs),
                "reward_mean": statistics.fmean(t.reward for t in ok) if ok else None,  # type: ignore[misc]
                "success_rate": statistics.fmean(bool(t.info.get("success")) for t in ok) if ok else None,
                "turns_mean": statistics.fmean(len(t.turns) for t in trajs),
                "status": dict(Counter(t.status.value for t in trajs)),
            }
        return {
            "counts": dict(self.scheduler.ledger.counts),
            "buffer": self.buffer.stats.as_dict(),
            "buffered": len(self.buffer),
            "reward": dict(self.reward.counts),
            "tasks": per_task,
            "tokens": sum(t.num_action_tokens for t in finished),
            "bias": self.bias.metrics(),
        }
