"""SampleBuffer: scored trajectories wait here, grouped, until a training step takes them (paper §6.2).

- `put(traj)` files a scored trajectory under its GRPO group; a group is *complete* at G members.
- `get_batch(n, current_version)` blocks until n complete groups started at `>= current_version - α`
  are there, and returns the oldest ones first.
- `advance(version)` applies the bound at a version bump: in `rollart` mode every buffered group whose
  start version is older than `version - α` is evicted. (`areal` mode checks only at start, so
  nothing buffered is evicted for age; `get_batch` still never returns a group older than the bound
  unless `check_on_get=False`.)
- `put` of a group's first member waits while the buffer holds `capacity` trajectories: back-pressure
  keeps it O(α·E). Later members of a buffered group never wait — they are what completes it, and a
  buffer full of partial groups would otherwise wait forever for them.

Failed or aborted trajectories never enter; a group that cannot be completed is dropped whole
(`drop_group`), so a partial group is never trained.
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
    def __init__(self, alpha: int, capacity: int, evict_on_advance: bool = True, check_on_get: bool = True):
        if alpha < 0 or capacity < 1:
            raise ValueError("alpha must be >= 0 and capacity >= 1")
        self.alpha = alpha
        self.capacity = capacity
        self.evict_on_advance = evict_on_advance
        self.check_on_get = check_on_get
        self.stats = BufferStats()
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

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- producers ---------------------------------------------------------------------------------
    async def put(self, traj: Trajectory, group_size: int) -> bool:
        """File a scored trajectory. Returns False if it was not kept (wrong status, or stale)."""
        if traj.status not in _TRAINABLE or traj.reward is None:
            self.stats.evicted[
                "unscored" if traj.status in _TRAINABLE else f"status_{traj.status.value}"
            ] += 1
            return False
        async with self._changed:
            gid = traj.group_id
            await self._changed.wait_for(
                lambda: gid in self._groups or gid in self._closed or len(self) < self.capacity
            )
            group = self._groups.get(gid)
            if gid in self._closed or (group is not None and group.complete):
                self.stats.evicted["group_closed"] += 1
                return False
            if group is None:
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
            group = self._groups.pop(group_id, None)
            n = len(group.members) if group else 0
            self._closed.add(group_id)
            self.stats.evicted[reason] += n
            self._changed.notify_all()
            return n

    # -- the version bound ---------------------------------------------------------------------------
    async def advance(self, version: int) -> int:
        """A version bump: evict groups too old for a batch taken at trainer version `version` (the
        scheduler passes the next batch's, `StalenessPolicy.next_batch_version`). Returns count."""
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
                del self._groups[gid]
                self._closed.add(gid)
        if n:
            self.on_release()
        return n

    # -- the consumer ------------------------------------------------------------------------------
    async def get_batch(
        self, num_groups: int, current_version: int, timeout_s: float | None = None
    ) -> list[Group]:
        """Block until `num_groups` complete, fresh groups are there; return the oldest first."""
        if num_groups < 1:
            raise ValueError("num_groups must be >= 1")

        def ready() -> bool:
            if self.check_on_get:
                self._evict_stale(current_version)
            return len(self.complete_groups()) >= num_groups

        async with self._changed:
            async with asyncio.timeout(timeout_s):
                await self._changed.wait_for(ready)
            batch = sorted(self.complete_groups(), key=lambda g: (g.start_version, g.group_id))[:num_groups]
            for g in batch:
                del self._groups[g.group_id]
                self._closed.add(g.group_id)  # a late (redundant) member must not start it again
            self.stats.groups_returned += len(batch)
            self._changed.notify_all()
        self.on_release()
        return batch
