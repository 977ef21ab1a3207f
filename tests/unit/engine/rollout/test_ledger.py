"""The scheduler's ledger: counts by status, reason and fate; live groups; giving up once."""

from engine.rollout.buffer import BufferStats
from engine.rollout.ledger import GroupDrop, RolloutLedger, unended
from engine.types import Failure, FailureReason, Trajectory, TrajStatus


def ended(status: TrajStatus, failure: Failure | None = None) -> Trajectory:
    return Trajectory("t", "g", "task", 0, status=status, failure=failure)


def test_every_member_is_counted_by_status_and_a_failed_one_by_what_failed():
    ledger = RolloutLedger(give_up_after=10, give_up=lambda: None)
    for _ in range(3):
        ledger.member_started()
    crash = ended(TrajStatus.FAILED, Failure(FailureReason.EPISODE_ERROR, "boom", "OSError"))
    ledger.member_ended(crash)
    ledger.member_failed(crash)
    ledger.member_ended(ended(TrajStatus.DONE))
    assert unended(ledger.counts) == 1
    ledger.member_ended(ended(TrajStatus.ABORTED, Failure(FailureReason.REDUNDANT)))
    assert unended(ledger.counts) == 0 and ledger.counts["member_failed_OSError"] == 1
    assert [t.status for t in ledger.drain_finished()] == ["failed", "done", "aborted"]
    assert not ledger.finished


def test_live_groups_leave_when_dropped_returned_or_evicted():
    ledger = RolloutLedger(give_up_after=10, give_up=lambda: None)
    for _ in range(5):
        ledger.group_started()
    ledger.group_closed(GroupDrop.STALE)
    ledger.group_closed(GroupDrop.INCOMPLETE)
    ledger.group_closed()  # complete: still live until the trainer takes it
    assert ledger.live_groups(BufferStats(groups_returned=1)) == 2
    assert ledger.counts["groups_complete"] == 1 and ledger.counts["groups_dropped_stale"] == 1


def test_it_gives_up_once_on_failures_or_uniform_groups_in_a_row():
    calls = []
    ledger = RolloutLedger(give_up_after=2, give_up=lambda: calls.append(1))
    ledger.uniform_group()
    ledger.group_closed()  # a complete group breaks the run of uniform ones
    ledger.uniform_group()
    assert not ledger.fatal and calls == []
    for _ in range(3):
        ledger.member_ended(ended(TrajStatus.FAILED, Failure(FailureReason.ENV_TIMEOUT)))
    assert ledger.fatal == "2 trajectories in a row failed; last: env_timeout" and calls == [1]
