"""SampleBuffer: scored trajectories wait here, grouped, until a training step takes them (paper §6.2).

- `expect(group_id)` registers a group when the scheduler starts it: batches are formed in this
  **launch order**. (A group first seen at `put` is registered then.)
- `put(traj)` files a scored trajectory under its GRPO group; a group is *complete* at G members.
- `get_batch(n, current_version)` blocks until the n oldest groups (launch order, dropped and evicted
  ones skipped) are complete, and returns them. A fast group never overtakes a slow older one, so what
  is trained is not selected by episode length. With `check_on_get` no group started before
  `current_version - α` is returned (it is evicted, and the next group in order takes its place).
- `advance(version)` applies the bound at a version bump: in `rollart` mode every buffered group whose
  start version is older than `version - α` is evicted. (`areal` mode checks only at start.)
- `next_batch` is the trainer version of the next batch: `get_batch` moves it on when it returns, the
  scheduler's `advance` when a run (re)starts. The scheduler's admission reads it.

The buffer holds at most what the scheduler lets live: (α + 1) · B groups in the continuous modes, one
wave in the sync modes. Failed or aborted trajectories never enter; a group that cannot be completed is
dropped whole (`drop_group`), so a partial group is never trained.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.types import Group, Trajectory, TrajStatus

_TRAINABLE = (TrajStatus.DONE, TrajStatus.TRUNCATED)


@dataclass
class BufferStats:
    put: int = 0
    groups_completed: int = 0
    groups_returned: int = 0
    complete_groups_evicted: int = 0  # complete groups evicted as stale: never trained
    evicted: Counter[str] = field(default_factory=Counter)  # trajectories evicted, by reason

    def as_dict(self) -> dict[str, int]:
        return {
            "buffer_put": self.put,
            "buffer_groups_completed": self.groups_completed,
            "buffer_groups_returned": self.groups_returned,
            "buffer_complete_groups_evicted": self.complete_groups_evicted,
            **{f"buffer_evicted_{k}": v for k, v in self.evicted.items()},
        }


class SampleBuffer:
    def __init__(self, alpha: int, evict_on_advance: bool = True, check_on_get: bool = True):
        if alpha < 0:
            raise ValueError("alpha must be >= 0")
        self.alpha = alpha
        self.evict_on_advance = evict_on_advance
        self.check_on_get = check_on_get
        self.stats = BufferStats()
        self.next_batch = 0  # trainer version of the next batch
        self._order: dict[str, None] = {}  # groups started, not yet taken or given up: launch order
        self._groups: dict[str, Group] = {}
        self._closed: set[str] = set()  # dropped groups: late members are refused
        self._changed = asyncio.Condition()
        # told whenever groups leave (taken by a batch or evicted): the scheduler's admission gate
        self.on_release: Callable[[], None] = lambda: None

    # -- state -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(len(g.members) for g in self._groups.values())

    def complete_groups(self) -> list[Group]:
        return [g for g in self._groups.values() if g.complete]

    def _fresh(self, group: Group, version: int) -> bool:
        return group.start_version >= version - self.alpha

    def _forget(self, group_id: str) -> None:
        self._groups.pop(group_id, None)
        self._order.pop(group_id, None)
        self._closed.add(group_id)  # a late (redundant) member must not start it again

    # -- producers ---------------------------------------------------------------------------------
    def expect(self, group_id: str) -> None:
        """A group was started: it takes its place in launch order."""
        if group_id not in self._closed:
            self._order.setdefault(group_id)

    async def put(self, traj: Trajectory, group_size: int) -> bool:
        """File a scored trajectory. Returns False if it was not kept (wrong status, or stale)."""
        if traj.status not in _TRAINABLE or traj.reward is None:
            self.stats.evicted[
                "unscored" if traj.status in _TRAINABLE else f"status_{traj.status.value}"
            ] += 1
            return False
        async with self._changed:
            gid = traj.group_id
            group = self._groups.get(gid)
            if gid in self._closed or (group is not None and group.complete):
                self.stats.evicted["group_closed"] += 1
                return False
            if group is None:
                self.expect(gid)
                group = self._groups[gid] = Group(gid, traj.task, traj.seed, group_size)
            group.members.append(traj)
            self.stats.put += 1
            if group.complete:
                self.stats.groups_completed += 1
            self._changed.notify_all()
            return True

    async def drop_group(self, group_id: str, reason: str) -> int:
        """Drop a group that cannot be completed; later members of it are refused. Returns members evicted."""
        async with self._changed:
            group = self._groups.get(group_id)
            n = len(group.members) if group else 0
            self._forget(group_id)
            self.stats.evicted[reason] += n
            self._changed.notify_all()
            return n

    # -- the version bound ---------------------------------------------------------------------------
    async def advance(self, version: int) -> int:
        """A version bump: evict groups too old for a batch taken at trainer version `version` (the
        scheduler passes the next batch's). Returns the trajectories evicted."""
        if not self.evict_on_advance:
            return 0
        async with self._changed:
            n = self._evict_stale(version)
            self._changed.notify_all()
            return n

    def _evict_stale(self, version: int) -> int:
        n = 0
        for gid, group in list(self._groups.items()):
            if group.members and not self._fresh(group, version):
                n += len(group.members)
                self.stats.evicted["stale"] += len(group.members)
                self.stats.complete_groups_evicted += int(group.complete)
                self._forget(gid)
        if n:
            self.on_release()
        return n

    # -- the consumer ------------------------------------------------------------------------------
    def _head(self, num_groups: int) -> list[str]:
        return list(self._order)[:num_groups]

    async def get_batch(
        self, num_groups: int, current_version: int, timeout_s: float | None = None
    ) -> list[Group]:
        """Block until the `num_groups` oldest groups are complete (and fresh); return them, oldest first."""
        if num_groups < 1:
            raise ValueError("num_groups must be >= 1")

        def ready() -> bool:
            if self.check_on_get:
                self._evict_stale(current_version)
            head = self._head(num_groups)
            return len(head) == num_groups and all(
                gid in self._groups and self._groups[gid].complete for gid in head
            )

        async with self._changed:
            async with asyncio.timeout(timeout_s):
                await self._changed.wait_for(ready)
            batch = [self._groups[gid] for gid in self._head(num_groups)]
            for g in batch:
                self._forget(g.group_id)
            self.stats.groups_returned += len(batch)
            self.next_batch = max(self.next_batch, current_version + 1)
            self._changed.notify_all()
        self.on_release()
        return batch
