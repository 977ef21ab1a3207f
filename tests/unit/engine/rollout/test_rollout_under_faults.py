"""The rollout control plane under injected env and reward faults: nothing lost, no partial group."""

import asyncio

from engine.config import FaultsConfig
from engine.envs.synthetic import SyntheticEnv
from engine.faults import FaultyEnvFactory, FaultyScore
from engine.rollout.buffer import SampleBuffer
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import TurnLimits
from engine.rollout.ledger import unended
from engine.rollout.reward import RewardScorer
from engine.rollout.scheduler import RolloutScheduler, TaskSpec
from engine.rollout.staleness import StalenessPolicy
from engine.types import FailureReason, TrajStatus
from tests.simulated import on_simulated_clock
from tests.unit.engine.rollout.fakes import ScriptedGenerator, tokenizer

G = 4


def synthetic(_spec: TaskSpec) -> SyntheticEnv:
    return SyntheticEnv(turns=3)


async def collect(faults: FaultsConfig, groups: int, redundancy: int = 0, reward: RewardScorer | None = None):
    """Run the scheduler until `groups` complete groups were taken from the buffer; return all of it."""
    # On the simulated clock only an injected hang reaches a timeout, however loaded the machine is.
    task = TaskSpec("t", "synthetic", {}, 1.0, G, TurnLimits(3, 4, 1024, env_timeout_s=0.5), "decode-heavy")
    buf = SampleBuffer(alpha=1)
    reward = reward or RewardScorer()
    s = RolloutScheduler(
        [task],
        ChatFormat(tokenizer()),
        ScriptedGenerator(lambda k: "ok"),
        buf,
        reward,
        FaultyEnvFactory(faults, synthetic),
        StalenessPolicy("rollart", 1),
        concurrency=8,
        redundancy=redundancy,
        batch_groups=groups,  # no trainer bumps the version here: admit every group the test takes
    )
    runner = asyncio.ensure_future(s.run())
    batch = []
    while len(batch) < groups:
        batch += await asyncio.wait_for(buf.get_batch(1, current_version=0), 20)
    s.stop()
    await asyncio.wait_for(runner, 10)
    return s, batch, reward


@on_simulated_clock
async def test_env_crashes_and_hangs_are_replaced_and_every_trained_group_is_whole():
    faults = FaultsConfig(seed=3, env_reset_crash=0.1, env_step_crash=0.1, env_hang=0.05)
    s, batch, _ = await collect(faults, groups=8)
    for g in batch:  # whole groups of distinct members, each played to the end and scored
        assert len(g.members) == G and len({m.traj_id for m in g.members}) == G
        assert all(m.status == TrajStatus.DONE and len(m.turns) == 3 and m.reward == 1.0 for m in g.members)
    c = s.ledger.counts
    crashed, hung = c["member_failed_InjectedEnvCrash"], c["member_failed_env_timeout"]
    assert crashed >= 5 and hung >= 2  # both faults happened (seeded)
    assert c["trajectories_failed"] == crashed + hung
    assert c["members_refilled"] >= crashed + hung - 2 * G  # failures of groups still open are refilled
    assert unended(c) == 0  # nothing lost: every started member ended and was counted
    assert c.get("groups_dropped_incomplete", 0) == 0


@on_simulated_clock
async def test_redundancy_masks_failures_without_refills():
    faults = FaultsConfig(seed=5, env_step_crash=0.1)
    s, batch, _ = await collect(faults, groups=6, redundancy=2)
    assert all(len(g.members) == G for g in batch)
    assert s.ledger.counts["member_failed_InjectedEnvCrash"] >= 2
    assert s.ledger.counts["trajectories_aborted"] >= 1  # spare members cancelled once G had finished
    assert unended(s.ledger.counts) == 0


@on_simulated_clock
async def test_reward_errors_and_timeouts_are_retried_then_the_member_is_dropped_and_replaced():
    faults = FaultsConfig(seed=1, reward_error=0.3, reward_hang=0.1)
    scorer = RewardScorer(FaultyScore(faults), retries=1, backoff_s=0.001, timeout_s=0.5)
    s, batch, reward = await collect(faults, groups=6, reward=scorer)
    assert all(len(g.members) == G and all(m.reward == 1.0 for m in g.members) for g in batch)
    assert reward.counts["retries"] >= 5  # errors and timeouts were retried ...
    dropped = reward.counts["failed"]  # ... and a member failing twice was dropped with its reason
    assert dropped >= 1 and s.ledger.counts["member_failed_reward_failed"] == dropped
    failed = [t for t in s.ledger.finished if t.failure and t.failure.reason is FailureReason.REWARD_FAILED]
    assert len(failed) == dropped and all(t.status == TrajStatus.FAILED for t in failed)
    assert {t.failure.error for t in failed if t.failure} <= {"InjectedRewardError", "TimeoutError"}
    assert reward.counts["scored"] >= 6 * G
    assert unended(s.ledger.counts) == 0
