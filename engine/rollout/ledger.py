"""What the rollout scheduler counts, and when it gives up (`RolloutScheduler.ledger`).

Every member started is counted once when it ends (`trajectories_<status>`, a failed one also as
`member_failed_<Failure.counted_as>`), one cancelled before it ran or while being scored included, so
after `RolloutScheduler.run` returns started == ended (`unended` is 0): nothing is lost. Groups are
counted when they start and when they close, complete (`groups_complete`) or dropped whole
(`groups_dropped_<GroupDrop>`); the groups still live gate the admission of new ones. When nothing but
failures come back (a broken env or engine), or only groups with uniform rewards that `drop_uniform`
discards, the ledger records why (`fatal`) and tells the scheduler to give up rather than hang.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from collections.abc import Callable, Mapping

from engine.rollout.buffer import BufferStats
from engine.types import Trajectory, TrajStatus


class GroupDrop(enum.StrEnum):
    """Why a group is dropped whole (counted as `groups_dropped_<value>`)."""

    STALE = "stale"  # a member outlived the staleness bound: its siblings are as old
    INCOMPLETE = "incomplete"  # more members failed than refills can replace
    UNIFORM = "uniform"  # every reward equal (drop_uniform): no GRPO advantage
    EVICTED = "evicted"  # the buffer refused a member (it evicted the group as stale)


def unended(counts: Mapping[str, int]) -> int:
    """Members started but not (yet) ended, from the scheduler's counts; 0 once `run()` returned."""
    ended = sum(counts.get(f"trajectories_{status}", 0) for status in TrajStatus)
    return counts.get("trajectories_started", 0) - ended


class RolloutLedger:
    """The scheduler's counts and ended trajectories. `give_up` is called once, when `give_up_after`
    trajectories in a row failed or as many groups in a row had uniform rewards."""

    def __init__(self, give_up_after: int, give_up: Callable[[], None]):
        self.give_up_after, self._give_up = give_up_after, give_up
        self.counts: Counter[str] = Counter()
        self.finished: deque[Trajectory] = deque(maxlen=100_000)  # ended trajectories, drained for metrics
        self.fatal = ""  # why the scheduler gave up, surfaced by the service
        self._failures_in_a_row = 0
        self._uniform_in_a_row = 0

    def drain_finished(self) -> list[Trajectory]:
        out = list(self.finished)
        self.finished.clear()
        return out

    def member_started(self) -> None:
        self.counts["trajectories_started"] += 1

    def member_ended(self, traj: Trajectory) -> None:
        """Every member is counted here once, by the status it ended with."""
        self.finished.append(traj)
        self.counts[f"trajectories_{traj.status}"] += 1
        if traj.status in (TrajStatus.DONE, TrajStatus.TRUNCATED):
            self._failures_in_a_row = 0
        elif traj.status == TrajStatus.FAILED:
            self._failures_in_a_row += 1
            if self._failures_in_a_row >= self.give_up_after:
                self._fatal(f"{self._failures_in_a_row} trajectories in a row failed; last: {traj.failure}")

    def member_failed(self, traj: Trajectory) -> None:
        """A failed member of an open group, by what failed (`Failure.counted_as`)."""
        if traj.failure is not None:
            self.counts[f"member_failed_{traj.failure.counted_as}"] += 1

    def group_started(self) -> None:
        self.counts["groups_started"] += 1

    def group_closed(self, dropped: GroupDrop | None = None) -> None:
        """A group closed: complete, or dropped whole because of `dropped`."""
        self.counts["groups_complete" if dropped is None else f"groups_dropped_{dropped}"] += 1
        if dropped is None:
            self._uniform_in_a_row = 0

    def uniform_group(self) -> None:
        """A group had uniform rewards and is about to be dropped for it."""
        self._uniform_in_a_row += 1
        if self._uniform_in_a_row >= self.give_up_after:
            self._fatal(f"{self._uniform_in_a_row} groups in a row had uniform rewards (drop_uniform)")

    def live_groups(self, buffer: BufferStats) -> int:
        """Groups started that may still reach the trainer and have not yet: not taken by a batch, not
        dropped, not evicted from the buffer as stale. Counting what left (rather than versions) keeps
        the gate right after a resume, and a group that will never arrive gives its place back, or
        the trainer would wait forever."""
        dropped = sum(self.counts[f"groups_dropped_{why}"] for why in GroupDrop)
        gone = dropped + buffer.complete_groups_evicted + buffer.groups_returned
        return self.counts["groups_started"] - gone  # this process's (a restored run's ids go on)

    def _fatal(self, why: str) -> None:
        if not self.fatal:
            self.fatal = why
            self._give_up()
