"""The staleness policy on its own (`engine/rollout/staleness.py`): the continuous modes' admission (a new
group lands in batch `next_batch + live // B`, admitted only if that batch is within α of the served
version) and the per-bump abort check."""

from engine.rollout.staleness import StalenessPolicy
from engine.types import Trajectory

LIVE = range(7)  # groups already live when one more asks to start; B = 2 groups a batch


def admitted(policy: StalenessPolicy, serving: int, next_batch: int) -> list[bool]:
    return [policy.may_start(live, 2, serving, next_batch) for live in LIVE]


def test_alpha_lets_rollout_run_alpha_batches_ahead_of_the_served_weights():
    # serving v0, next batch v0: batches 0 and 1 (α = 1) fill, batch 2 would be two versions late
    assert admitted(StalenessPolicy("rollart", 1), 0, 0) == [True] * 4 + [False] * 3
    assert admitted(StalenessPolicy("areal", 2), 0, 0) == [True] * 6 + [False]
    # once the trainer took batch 0 (next batch v1) while v0 is still served: batch 1 only
    assert admitted(StalenessPolicy("rollart", 1), 0, 1) == [True] * 2 + [False] * 5
    # the trainer two batches past the served weights (a slow update): nothing may start
    assert admitted(StalenessPolicy("rollart", 1), 0, 2) == [False] * 7


def test_the_wave_modes_are_not_gated_by_admission():
    assert admitted(StalenessPolicy("sync+", 0), 0, 5) == [True] * 7


def test_only_rollart_aborts_a_trajectory_the_next_batch_could_not_take():
    old = Trajectory(traj_id="g0.m0", group_id="g0", task="t", seed=0, start_version=1)
    failure = StalenessPolicy("rollart", 1).stale(old, 3)
    assert failure is not None and "started at v1, next batch at v3, alpha 1" in failure.detail
    assert StalenessPolicy("rollart", 1).stale(old, 2) is None  # 2 − 1 = 1: still within the bound
    assert StalenessPolicy("areal", 1).stale(old, 3) is None  # areal checks at the start only
