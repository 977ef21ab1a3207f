"""RolloutScheduler: keeps E environments busy, one trajectory each, and streams them out (paper §6.1).

Groups: a GRPO group of size G starts G + r members on the same task and seed (r = redundancy). The
group keeps the first G members *by launch order* whose episode ends well — a member is filed as soon
as no earlier member can still take its place, and the rest are cancelled once the first G are known —
so redundancy masks failures without favouring short episodes. A member that fails is replaced while
the group can still be completed, else the whole group is dropped — a partial group is never trained.
With `drop_uniform`, a group whose G rewards are all equal (no GRPO signal) is dropped and counted.
A dropped group gives its admission place back; in the wave modes a replacement joins the wave.
Each finished trajectory is scored at once (async reward) and put into the buffer; nothing waits for
a batch. Tasks are sampled by weight from a seeded RNG, saved and restored with `state()`. Every member
and group is counted in the `RolloutLedger` (engine/rollout/ledger.py): after `run()` returns, every
member started has ended and was counted, and the scheduler gives up when nothing but failures come back.

The staleness policy is applied at every version bump (`advance`): in-flight trajectories that
started too long ago are aborted, and the buffer evicts old groups; in the continuous modes (`areal`,
`rollart`) a new group is only admitted if the batch it will land in (launch order) is within the
bound of the version being served (`StalenessPolicy.may_start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engine.envs.base import Env
from engine.rollout.buffer import SampleBuffer
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import EnvManager, Generator, TurnLimits
from engine.rollout.group_run import GroupRun
from engine.rollout.ledger import GroupDrop, RolloutLedger
from engine.rollout.lockstep import LockstepGenerator
from engine.rollout.staleness import StalenessPolicy
from engine.types import Failure, FailureReason, Trajectory, TrajStatus

RewardFn = Callable[[Trajectory], Awaitable[Trajectory]]  # scores in place, or marks FAILED
EnvFactory = Callable[["TaskSpec"], Env]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    env: str
    env_args: dict[str, Any]
    weight: float
    group_size: int
    limits: TurnLimits
    profile: str
    eval_problems: int = 0  # distinct held-out problems evaluated (env built with split="eval")
    eval_temperature: float = 0.0  # 0: greedy
    eval_samples: int = 1  # episodes per held-out problem


class RolloutScheduler:
    def __init__(
        self,
        tasks: list[TaskSpec],
        chat: ChatFormat,
        generator: Generator,
        buffer: SampleBuffer,
        reward: RewardFn,
        env_factory: EnvFactory,
        policy: StalenessPolicy,
        concurrency: int,
        redundancy: int = 0,
        batch_groups: int = 1,
        seed: int = 0,
        max_refills: int = 8,
        granularity: str = "trajectory",
        gated_waves: bool = False,
        max_consecutive_failures: int = 256,
        drop_uniform: bool = False,
    ):
        if not tasks:
            raise ValueError("at least one task is needed")
        self.tasks, self.chat, self.gen, self.buffer = tasks, chat, generator, buffer
        self.reward, self.env_factory, self.policy = reward, env_factory, policy
        self.concurrency, self.redundancy, self.batch_groups = concurrency, redundancy, batch_groups
        self.max_refills = max_refills  # per group
        if granularity not in ("trajectory", "batch"):
            raise ValueError(f"granularity must be 'trajectory' or 'batch', got {granularity!r}")
        wave = batch_groups * (max(t.group_size for t in tasks) + redundancy)
        if (granularity == "batch" or gated_waves) and concurrency < wave:
            raise ValueError(
                f"wave mode runs {batch_groups} groups at once ({wave} envs): "
                f"rollout.concurrency must be >= {wave}, got {concurrency}"
            )
        self.granularity = granularity
        self.drop_uniform = drop_uniform
        self.ledger = RolloutLedger(max_consecutive_failures, self.stop)
        # Wave mode: groups start `batch_groups` at a time, the next wave when the last one is over.
        # Batch granularity runs each wave in lockstep; gated waves (sync modes) also wait for a permit.
        self.waves = granularity == "batch" or gated_waves
        self._wave_permits: int | None = 0 if gated_waves else None
        self._replacements = 0  # wave modes: groups to start in place of dropped ones
        self._wave_gen: LockstepGenerator | None = None  # the current wave's, in batch granularity
        self.rng = random.Random(seed)
        self.version = 0  # serving version (set by advance)
        self._slots = asyncio.Semaphore(concurrency)
        self._groups: dict[str, GroupRun] = {}
        self._live: dict[str, Trajectory] = {}  # running trajectories by id
        self._members: set[asyncio.Task[None]] = set()  # every member task not yet ended
        self._next_group = 0
        self._wake = asyncio.Event()
        buffer.on_release = self._wake.set  # groups taken or evicted free admission places
        self._stop = asyncio.Event()

    # -- control -----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Launch env loops until `stop()`; returns once every started member has ended."""
        try:
            while await self._free_slot():
                group = await self._next_launch()
                if group is None:
                    self._slots.release()
                    break
                self._launch(group)
        finally:  # every member still going, in an env or being scored or filed, ends and is counted
            tasks = list(self._members)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _free_slot(self) -> bool:
        """Wait for a free env slot (True) or for `stop()` (False)."""
        acquire = asyncio.ensure_future(self._slots.acquire())
        stopped = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if acquire.done() and not self._stop.is_set():
            return True
        if acquire.done():
            self._slots.release()
        else:
            acquire.cancel()
        return False

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def advance(self, version: int) -> int:
        """The serving version is now `version`: abort in-flight members and evict buffered groups that
        the next batch cannot take. The next batch is `version`'s at a (re)start, else the one after the
        batch the trainer took last (`SampleBuffer.next_batch`)."""
        self.version = version
        self.buffer.next_batch = horizon = max(self.buffer.next_batch, version)
        aborted = 0
        for g in list(self._groups.values()):
            for traj_id, task in list(g.running.items()):
                traj = self._live.get(traj_id)
                if traj is None or traj.failure:  # gone, or already being cancelled
                    continue
                reason = self.policy.stale(traj, horizon)
                if reason:
                    traj.failure = reason
                    task.cancel()
                    aborted += 1
        self.ledger.counts["aborted_stale_in_flight"] += aborted
        await self.buffer.advance(horizon)
        self._wake.set()
        return aborted

    # -- launching ---------------------------------------------------------------------------------
    async def _next_launch(self) -> GroupRun | None:
        """The group whose next member gets the free env slot: refills first, then a new group."""
        while not self._stop.is_set():
            for g in self._groups.values():
                if g.to_launch > 0:
                    return g
            if self.waves:
                if self._replacements:  # a group of the wave was dropped: the batch still needs B
                    self._replacements -= 1
                    return self._replacement()
                if not self._groups and self._wave_permits != 0 and self._wave_admitted():
                    if self._wave_permits is not None:
                        self._wave_permits -= 1
                    return self._new_wave()
            elif self._admitted():
                return self._new_group()
            self._wake.clear()
            await self._wake.wait()
        return None

    def _wave_admitted(self) -> bool:
        """A wave (the previous one over) may start: the sync modes gate it by permits; the continuous
        modes at batch granularity by the staleness bound, as they admit single groups (a wave is one
        batch of groups, so its first group's batch is the wave's)."""
        return self._wave_permits is not None or self._admitted()

    def _admitted(self) -> bool:
        """The staleness bound admits one more group (`StalenessPolicy.may_start`)."""
        live = self.ledger.live_groups(self.buffer.stats)
        return self.policy.may_start(live, self.batch_groups, self.version, self.buffer.next_batch)

    def _new_group(self) -> GroupRun:
        task = self.rng.choices(self.tasks, weights=[t.weight for t in self.tasks])[0]
        g = GroupRun(
            f"g{self._next_group}",
            task,
            self.rng.randrange(2**31),
            to_launch=task.group_size + self.redundancy,
        )
        self._next_group += 1
        self._groups[g.group_id] = g
        self.buffer.expect(g.group_id)
        self.ledger.group_started()
        return g

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to go on with the same problem sequence: the RNG and group count."""
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "next_group": self._next_group}

    def restore(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self._next_group = int(state["next_group"])

    def release_wave(self, n: int = 1) -> None:
        """Gated waves: allow `n` more waves to start (the sync modes release one per training step)."""
        if self._wave_permits is None:
            raise RuntimeError("release_wave needs gated_waves=True")
        self._wave_permits += n
        self._wake.set()

    def _new_wave(self) -> GroupRun:
        groups = [self._new_group() for _ in range(self.batch_groups)]
        if self.granularity == "batch":
            self._wave_gen = LockstepGenerator(self.gen, sum(g.to_launch for g in groups))
            for g in groups:
                g.gen = self._wave_gen
        self.ledger.counts["waves"] += 1
        return groups[0]

    def _replacement(self) -> GroupRun:
        g = self._new_group()
        if self._wave_gen is not None:
            g.gen = self._wave_gen
            for _ in range(g.to_launch):
                self._wave_gen.join()
        self.ledger.counts["groups_replaced"] += 1
        return g

    def _launch(self, g: GroupRun) -> None:
        traj = Trajectory(
            traj_id=f"{g.group_id}.m{g.launched}", group_id=g.group_id, task=g.task.name, seed=g.seed
        )
        g.to_launch -= 1
        g.launched += 1
        g.order.append(traj.traj_id)
        self._live[traj.traj_id] = traj
        member = g.running[traj.traj_id] = asyncio.create_task(self._member(g, traj))
        self._members.add(member)
        member.add_done_callback(lambda t: self._ended(g, traj, t))
        self.ledger.member_started()

    # -- one member --------------------------------------------------------------------------------
    async def _member(self, g: GroupRun, traj: Trajectory) -> None:
        try:
            await self._play(g, traj)
            g.running.pop(traj.traj_id, None)
            if traj.status in (TrajStatus.DONE, TrajStatus.TRUNCATED):
                await self._judge(g, traj)
            await self._settle(g, traj)
        except asyncio.CancelledError:  # stopped while being scored or filed: never reaches a batch
            if traj.status in (TrajStatus.DONE, TrajStatus.TRUNCATED):
                traj.status, traj.failure = TrajStatus.ABORTED, Failure(FailureReason.SHUTDOWN)
            raise

    async def _judge(self, g: GroupRun, traj: Trajectory) -> None:
        """Score a member that ended well, then wait until launch order says whether it is one of the
        group's first G; a redundant one ends ABORTED ("redundant"), unscored if that was known first."""
        if g.closed or g.verdict(traj.traj_id) == "redundant":
            traj.status, traj.failure = TrajStatus.ABORTED, Failure(FailureReason.REDUNDANT)
            return
        g.ok += 1
        await self.reward(traj)
        if traj.status == TrajStatus.FAILED:
            g.ok -= 1
            return
        g.outcome[traj.traj_id] = True
        g.notify()
        if g.first_g_known():  # the first G are known: cancel the rest
            g.to_launch = 0
            self._cancel(g, Failure(FailureReason.REDUNDANT))
        while (verdict := g.verdict(traj.traj_id)) is None and not g.closed:
            await g.changed.wait()
        if verdict == "redundant":
            g.ok -= 1
            traj.status, traj.failure = TrajStatus.ABORTED, Failure(FailureReason.REDUNDANT)

    def _ended(self, g: GroupRun, traj: Trajectory, task: asyncio.Task[None]) -> None:
        """Every member task ends here and is counted once, even one cancelled before it ran."""
        self._members.discard(task)
        if g.outcome.setdefault(traj.traj_id, False) is False:
            g.notify()  # the members after it may now know their place
        if traj.traj_id in self._live:  # cancelled before `_play` began: free what it would have
            self._live.pop(traj.traj_id)
            g.running.pop(traj.traj_id, None)
            self._slots.release()
            traj.status = TrajStatus.ABORTED
            traj.failure = traj.failure or Failure(FailureReason.CANCELLED_BEFORE_START)
        self.ledger.member_ended(traj)

    async def _play(self, g: GroupRun, traj: Trajectory) -> None:
        env: Env | None = None
        try:
            env = self.env_factory(g.task)
            manager = EnvManager(
                env,
                self.chat,
                g.gen or self.gen,
                g.task.limits,
                g.task.profile,
                should_abort=self.policy.stale,
            )
            await manager.run(traj)
        except asyncio.CancelledError:
            traj.status = TrajStatus.ABORTED
            traj.failure = traj.failure or Failure(FailureReason.SHUTDOWN)
        except Exception as e:  # the env could not even be built
            traj.status = TrajStatus.FAILED
            traj.failure = Failure(FailureReason.ENV_INIT, str(e), type(e).__name__)
        finally:
            self._slots.release()
            self._live.pop(traj.traj_id, None)
            if env is not None:
                with contextlib.suppress(Exception):  # a broken env's close must not fail accounting
                    await env.close()
            gen = g.gen or self.gen
            if hasattr(gen, "release"):
                gen.release(traj.traj_id)

    async def _settle(self, g: GroupRun, traj: Trajectory) -> None:
        """File the member, then decide the group's fate: complete, wait, refill, or drop whole."""
        if g.closed:
            return
        if traj.status in (TrajStatus.DONE, TrajStatus.TRUNCATED):
            return await self._file(g, traj)
        if traj.status == TrajStatus.FAILED:
            self.ledger.member_failed(traj)
        if traj.failure is not None and traj.failure.reason is FailureReason.STALE:
            return await self._drop(g, GroupDrop.STALE)  # its siblings are as old: refilling would not help
        short = g.task.group_size - g.ok - len(g.running) - g.to_launch
        if short <= 0 or self._stop.is_set():
            return None
        if g.launched + short - g.task.group_size - self.redundancy > self.max_refills:
            return await self._drop(g, GroupDrop.INCOMPLETE)
        g.to_launch += short
        for _ in range(short):
            if isinstance(g.gen, LockstepGenerator):
                g.gen.join()
        self.ledger.counts["members_refilled"] += short
        self._wake.set()
        return None

    async def _file(self, g: GroupRun, traj: Trajectory) -> None:
        """Put a kept member into the buffer; the last one completes the group — unless every reward
        in it is the same and uniform groups are dropped (no GRPO advantage: nothing to learn)."""
        last = g.kept == g.task.group_size - 1
        if last and self.drop_uniform and all(r == traj.reward for r in g.rewards):
            self.ledger.uniform_group()
            return await self._drop(g, GroupDrop.UNIFORM)
        if not await self.buffer.put(traj, g.task.group_size):
            return await self._drop(g, GroupDrop.EVICTED)  # e.g. the buffer evicted the group as stale
        g.kept += 1
        g.rewards.append(traj.reward or 0.0)
        if last:
            self._close(g)
        return None

    def _cancel(self, g: GroupRun, failure: Failure) -> None:
        for traj_id, task in g.running.items():
            if traj_id in self._live:
                self._live[traj_id].failure = self._live[traj_id].failure or failure
            task.cancel()

    async def _drop(self, g: GroupRun, why: GroupDrop) -> None:
        self._cancel(g, Failure(FailureReason.GROUP_DROPPED, why))
        await self.buffer.drop_group(g.group_id, f"group_{why}")
        self._close(g, why)
        if self.waves and not self._stop.is_set():
            self._replacements += 1

    def _close(self, g: GroupRun, dropped: GroupDrop | None = None) -> None:
        g.closed = True
        g.to_launch = 0
        self.ledger.group_closed(dropped)
        self._groups.pop(g.group_id, None)
        g.notify()  # held members of a dropped group stop waiting for their place
        self._wake.set()
