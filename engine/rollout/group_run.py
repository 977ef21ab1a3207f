"""One GRPO group while it is rolled out: its members in launch order, and which of them it keeps.

The group keeps the first G members *by launch order* whose episode ends well: a member that scored
well is kept once no earlier member can still take its place (`verdict`), and once the first G are
known the rest are redundant (`first_g_known`) — so spare members stand in for failures without
favouring short episodes. `notify` wakes members waiting for their verdict.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.rollout.env_manager import Generator
    from engine.rollout.scheduler import TaskSpec


@dataclass
class GroupRun:
    group_id: str
    task: TaskSpec
    seed: int
    to_launch: int  # members still to start
    launched: int = 0
    gen: Generator | None = None  # the wave's lockstep generator in batch granularity
    ok: int = 0  # members whose episode ended well: being scored, held or kept
    kept: int = 0  # members accepted by the buffer
    closed: bool = False
    running: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # member ids in launch order
    outcome: dict[str, bool] = field(default_factory=dict)  # ended members: scored well, or not
    rewards: list[float] = field(default_factory=list)  # of the kept members
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # an outcome came in

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def verdict(self, traj_id: str) -> str | None:
        """For a member that scored well: "keep" once no earlier member can still take its place,
        "redundant" once G earlier members did, None while that is open."""
        ok = pending = 0
        for tid in self.order:
            if tid == traj_id:
                break
            o = self.outcome.get(tid)
            ok += o is True
            pending += o is None
        if ok >= self.task.group_size:
            return "redundant"
        return "keep" if ok + pending < self.task.group_size else None

    def first_g_known(self) -> bool:
        """The first G members (launch order) that end well are known: the rest are redundant."""
        ok = 0
        for tid in self.order:
            o = self.outcome.get(tid)
            if o is None:
                return False
            ok += o
            if ok == self.task.group_size:
                return True
        return False
