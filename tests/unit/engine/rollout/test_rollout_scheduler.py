import asyncio
import json
from collections import Counter

import pytest

from engine.envs.base import Env, EnvStep
from engine.rollout.buffer import SampleBuffer
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import TurnLimits
from engine.rollout.reward import RewardScorer
from engine.rollout.scheduler import RolloutScheduler, TaskSpec
from engine.rollout.staleness import StalenessPolicy
from engine.types import Failure, FailureReason, TrajStatus
from tests.simulated import on_simulated_clock
from tests.unit.engine.rollout.fakes import ScriptedGenerator, tokenizer
from tests.waiting import settled, until


class OneStep(Env):
    """A one-step episode whose step takes `delay` seconds (or raises when delay is an exception)."""

    name = "onestep"
    alive = 0
    peak = 0

    def __init__(self, delay):
        self.delay = delay

    async def reset(self, seed: int) -> str:
        OneStep.alive += 1
        OneStep.peak = max(OneStep.peak, OneStep.alive)
        return f"seed {seed}"

    async def step(self, action: str) -> EnvStep:
        if isinstance(self.delay, Exception):
            raise self.delay
        await asyncio.sleep(self.delay)
        return EnvStep("", reward=self.delay, done=True)

    async def close(self) -> None:
        OneStep.alive -= 1


def task(name="t", group_size=4, weight=1.0) -> TaskSpec:
    return TaskSpec(name, "onestep", {}, weight, group_size, TurnLimits(2, 4, 1024), "decode-heavy")


def scheduler(delays, tasks=None, concurrency=6, redundancy=0, mode="rollart", alpha=1, version=0, **kw):
    created = []

    def factory(spec):
        d = delays(len(created)) if callable(delays) else delays[len(created)]
        created.append(d)
        return OneStep(d)

    buf = SampleBuffer(alpha=alpha)
    gen = ScriptedGenerator(lambda k: "ok", version=version)
    s = RolloutScheduler(
        tasks or [task()],
        ChatFormat(tokenizer()),
        gen,
        buf,
        RewardScorer(),
        factory,
        StalenessPolicy(mode, alpha),
        concurrency,
        redundancy,
        **kw,
    )
    return s, buf, gen, created


async def run_until(s, cond, timeout=5.0):
    """Runs the scheduler until `cond()` holds (within `timeout` s of loop time), then stops it."""
    runner = asyncio.ensure_future(s.run())
    await until(cond, timeout, state=lambda: s.ledger.counts)
    s.stop()
    await asyncio.wait_for(runner, 5)


async def settled_starts(s, complete: int) -> int:
    """Groups started once `complete` groups have completed and the scheduler has settled: it started
    every group it was going to start on that, and nothing else is ready to run."""
    await until(lambda: s.ledger.counts["groups_complete"] >= complete, 2, state=lambda: s.ledger.counts)
    await settled()
    return s.ledger.counts["groups_started"]


@on_simulated_clock
async def test_redundant_members_first_g_kept_rest_cancelled():
    delays = lambda i: [0.01, 0.02, 0.03, 0.04, 2.0, 2.0][i] if i < 6 else 2.0  # noqa: E731
    s, buf, _, _ = scheduler(delays, concurrency=6, redundancy=2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    batch_task = asyncio.ensure_future(buf.get_batch(1, current_version=0))
    runner = asyncio.ensure_future(s.run())
    [group] = await asyncio.wait_for(batch_task, 2)
    elapsed = loop.time() - t0
    s.stop()
    await runner
    assert sorted(m.traj_id for m in group.members) == ["g0.m0", "g0.m1", "g0.m2", "g0.m3"]
    assert elapsed == pytest.approx(0.04)  # m3's step ended it: no wait for the two 2-second stragglers
    done = [t for t in s.ledger.finished if t.group_id == "g0"]
    assert Counter(t.status for t in done) == {TrajStatus.DONE: 4, TrajStatus.ABORTED: 2}
    assert {t.failure for t in done if t.status == TrajStatus.ABORTED} == {Failure(FailureReason.REDUNDANT)}
    assert s.ledger.counts["groups_complete"] == 1


@on_simulated_clock
async def test_redundancy_keeps_the_first_g_by_launch_order_not_the_fastest():
    # m0 is the slowest; m4 and m5 finish first but are spares: the group waits for m0
    delays = lambda i: [0.3, 0.05, 0.05, 0.05, 0.01, 0.01][i] if i < 6 else 2.0  # noqa: E731
    s, buf, _, _ = scheduler(delays, concurrency=6, redundancy=2)
    batch = asyncio.ensure_future(buf.get_batch(1, current_version=0))
    await run_until(s, batch.done)
    [group] = batch.result()
    assert sorted(m.traj_id for m in group.members) == ["g0.m0", "g0.m1", "g0.m2", "g0.m3"]
    spares = [t for t in s.ledger.finished if t.traj_id in ("g0.m4", "g0.m5")]
    redundant = Failure(FailureReason.REDUNDANT)
    assert [(t.status, t.failure) for t in spares] == [(TrajStatus.ABORTED, redundant)] * 2


@on_simulated_clock
async def test_a_spare_takes_the_place_of_a_failed_member_in_launch_order():
    delays = lambda i: OSError("lost") if i == 1 else ([0.01, 0, 0.01, 0.01, 0.2, 0.01] + [0.01] * 6)[i % 12]  # noqa: E731
    s, buf, _, _ = scheduler(delays, concurrency=6, redundancy=2)
    batch = asyncio.ensure_future(buf.get_batch(1, current_version=0))
    await run_until(s, batch.done)
    [group] = batch.result()  # m1 failed: m4 (slow) is next in line, not m5 (fast)
    assert sorted(m.traj_id for m in group.members) == ["g0.m0", "g0.m2", "g0.m3", "g0.m4"]
    assert s.ledger.counts["members_refilled"] == 0


@on_simulated_clock
async def test_a_group_with_uniform_rewards_is_dropped_and_replaced():
    # reward = the step's delay: the first group's two members both earn 0.01, the next one's differ
    delays = lambda i: [0.01, 0.01, 0.01, 0.02][i] if i < 4 else 0.03  # noqa: E731
    s, buf, _, _ = scheduler(
        delays, tasks=[task(group_size=2)], concurrency=2, batch_groups=1, drop_uniform=True
    )
    batch = asyncio.ensure_future(buf.get_batch(1, current_version=0))
    await run_until(s, batch.done)
    [group] = batch.result()
    assert group.group_id == "g1" and sorted(m.reward for m in group.members) == [0.01, 0.02]
    assert s.ledger.counts["groups_dropped_uniform"] == 1


@on_simulated_clock
async def test_a_dropped_group_of_a_wave_is_replaced_so_the_batch_fills():
    s, buf, _, _ = scheduler(
        lambda i: OSError("down") if i < 2 else 0.01,
        tasks=[task(group_size=2)],
        concurrency=4,
        batch_groups=2,
        mode="sync",
        alpha=0,
        gated_waves=True,
        max_refills=0,
    )
    s.release_wave(1)
    batch = asyncio.ensure_future(buf.get_batch(2, current_version=0))
    await run_until(s, batch.done)
    assert sorted(g.group_id for g in batch.result()) == ["g1", "g2"]
    assert s.ledger.counts["groups_dropped_incomplete"] == 1 and s.ledger.counts["groups_replaced"] == 1
    assert s.ledger.counts["waves"] == 1


def test_a_restored_scheduler_draws_the_problems_that_come_next():
    tasks = [task("a", weight=1.0), task("b", weight=1.0)]
    first, *_ = scheduler(lambda i: 0.0, tasks=tasks)
    drawn = [(g.group_id, g.task.name, g.seed) for g in (first._new_group() for _ in range(8))]
    saved, *_ = scheduler(lambda i: 0.0, tasks=tasks)
    for _ in range(5):
        saved._new_group()
    resumed, *_ = scheduler(lambda i: 0.0, tasks=tasks)
    resumed.restore(json.loads(json.dumps(saved.state())))  # as a checkpoint stores it
    assert [(g.group_id, g.task.name, g.seed) for g in (resumed._new_group() for _ in range(3))] == drawn[5:]


@on_simulated_clock
async def test_failed_member_is_replaced_so_the_group_completes_whole():
    delays = lambda i: OSError("sandbox lost") if i == 0 else 0.01  # noqa: E731
    s, buf, _, _ = scheduler(delays, tasks=[task(group_size=2)], concurrency=2)
    batch = asyncio.ensure_future(buf.get_batch(1, current_version=0))
    await run_until(s, batch.done)
    [group] = batch.result()
    assert [m.traj_id for m in group.members] == ["g0.m1", "g0.m2"]
    assert s.ledger.counts["members_refilled"] == 1 and s.ledger.counts["member_failed_OSError"] == 1


@on_simulated_clock
async def test_group_that_cannot_be_completed_is_dropped_whole():
    s, buf, _, _ = scheduler(
        lambda i: OSError("down"), tasks=[task(group_size=2)], concurrency=2, max_refills=2
    )
    await run_until(s, lambda: s.ledger.counts["groups_dropped_incomplete"] >= 1)
    assert buf.complete_groups() == [] and len(buf) == 0


@on_simulated_clock
async def test_concurrency_bound_is_kept_and_filled():
    OneStep.peak = OneStep.alive = 0
    s, *_ = scheduler(lambda i: 0.005, tasks=[task(group_size=2)], concurrency=3, batch_groups=10)
    await run_until(s, lambda: s.ledger.counts["groups_complete"] >= 10)
    assert OneStep.peak == 3 and OneStep.alive == 0


@on_simulated_clock
async def test_trajectories_stream_into_the_buffer_without_waiting_for_siblings():
    s, buf, _, _ = scheduler(lambda i: 0.01 if i == 0 else 1.0, tasks=[task(group_size=2)], concurrency=2)
    await run_until(s, lambda: buf.stats.put >= 1, timeout=0.9)  # the sibling is still in its 1 s step
    assert s.ledger.counts["trajectories_started"] >= 2


@pytest.mark.parametrize(("alpha", "aborted_at_bumps"), [(2, [0, 2]), (1, [2, 0])])
@on_simulated_clock
async def test_version_bump_aborts_members_the_next_batch_cannot_take_and_drops_their_group(
    alpha, aborted_at_bumps
):
    s, buf, *_ = scheduler(lambda i: 5.0, tasks=[task(group_size=2)], concurrency=2, alpha=alpha, version=0)
    runner = asyncio.ensure_future(s.run())
    await until(
        lambda: (
            s.ledger.counts["trajectories_started"] >= 2
            and all(t.start_version >= 0 for t in s._live.values())
        )
    )
    # the trainer took batch v1 and the workers serve v1: the next batch is v2's, which may take v0 with
    # alpha 2, not with alpha 1; at v2 (batch v3) v0 is too old for both
    buf.next_batch = 2
    assert await s.advance(1) == aborted_at_bumps[0]
    buf.next_batch = 3
    assert await s.advance(2) == aborted_at_bumps[1]
    await settled()  # the aborted members have ended and their group is dropped
    s.stop()
    await runner
    stale = [t for t in s.ledger.finished if t.failure and t.failure.reason is FailureReason.STALE]
    assert len(stale) == 2 and all(t.status == TrajStatus.ABORTED for t in stale)
    assert s.ledger.counts["groups_dropped_stale"] == 1 and s.ledger.counts["aborted_stale_in_flight"] == 2


@pytest.mark.parametrize("granularity", ["trajectory", "batch"])  # batch: waves of one batch, in lockstep
@pytest.mark.parametrize("mode", ["areal", "rollart"])
@on_simulated_clock
async def test_admits_a_group_only_if_the_batch_it_lands_in_is_within_alpha_of_the_served_version(
    mode, granularity
):
    s, buf, *_ = scheduler(
        lambda i: 0.001,
        tasks=[task(group_size=2)],
        concurrency=4,
        mode=mode,
        alpha=1,
        batch_groups=1,
        granularity=granularity,
    )
    runner = asyncio.ensure_future(s.run())
    assert await settled_starts(s, 2) == 2  # serving v0: batches v0 and v1 may take v0 groups
    await buf.get_batch(1, current_version=0)  # the trainer takes batch v0 ...
    assert await settled_starts(s, 2) == 2  # ... a group started now would be in batch v2: too old
    await s.advance(1)  # the workers serve v1
    assert await settled_starts(s, 3) == 3
    s.stop()
    await runner


@on_simulated_clock
async def test_areal_admission_is_given_back_by_a_dropped_group():
    failing = {0, 1, 2}  # every env of the first group fails, refills included (max_refills=1)
    s, *_ = scheduler(
        lambda i: OSError("env died") if i in failing else 0.001,
        tasks=[task(group_size=2)],
        concurrency=2,
        mode="areal",
        alpha=0,
        batch_groups=1,
        max_refills=1,
    )
    await run_until(
        s, lambda: s.ledger.counts["groups_complete"] >= 1
    )  # would wait forever without the refund
    assert s.ledger.counts["groups_dropped_incomplete"] == 1 and s.ledger.counts["groups_started"] == 2


@on_simulated_clock
async def test_admission_after_a_resume_is_alpha_plus_one_batches_whatever_the_version():
    s, *_ = scheduler(lambda i: 0.001, tasks=[task(group_size=2)], concurrency=4, batch_groups=1, version=7)
    s.restore({**s.state(), "next_group": 40})  # the saved run had started 40 groups
    await s.advance(7)  # resumed at v7: as at v0, α = 1 lets two groups start, not nine
    runner = asyncio.ensure_future(s.run())
    assert await settled_starts(s, 2) == 2
    assert list(s.buffer._order) == ["g40", "g41"]  # ids go on from the saved run
    s.stop()
    await runner


@on_simulated_clock
async def test_rollart_admission_is_given_back_by_a_group_the_buffer_evicted_as_stale():
    s, buf, *_ = scheduler(lambda i: 0.001, tasks=[task(group_size=2)], concurrency=4, batch_groups=1)
    runner = asyncio.ensure_future(s.run())
    assert await settled_starts(s, 2) == 2  # both live, complete in the buffer
    # No trainer took them; at v2 both v0 groups are stale and evicted: they give their places back.
    await s.advance(2)
    assert buf.stats.complete_groups_evicted == 2
    assert await settled_starts(s, 4) == 4
    s.stop()
    await runner


@on_simulated_clock
async def test_groups_evicted_while_the_trainer_waits_for_a_batch_free_their_places():
    s, buf, gen, _ = scheduler(lambda i: 0.001, tasks=[task(group_size=2)], concurrency=4, batch_groups=1)
    runner = asyncio.ensure_future(s.run())
    assert await settled_starts(s, 2) == 2  # the places are full: two complete v0 groups in the buffer
    gen.version = 2  # the engines serve v2 (no advance reaches the scheduler)
    # the trainer at v2 evicts both as stale while it waits; only their freed places let new groups start
    [group] = await asyncio.wait_for(buf.get_batch(1, current_version=2), 2)
    assert group.start_version == 2 and buf.stats.complete_groups_evicted == 2
    s.stop()
    await runner


def test_tasks_are_sampled_by_weight():
    s, *_ = scheduler(lambda i: 0.0, tasks=[task("a", weight=3.0), task("b", weight=1.0)])
    names = Counter(s._new_group().task.name for _ in range(2000))
    assert abs(names["a"] / 2000 - 0.75) < 0.03


@on_simulated_clock
async def test_scheduler_gives_up_loudly_when_every_trajectory_fails():
    s, *_ = scheduler(
        lambda i: OSError("no sandbox"),
        tasks=[task(group_size=2)],
        concurrency=2,
        max_consecutive_failures=10,
    )
    await asyncio.wait_for(s.run(), 5)  # returns by itself instead of retrying forever
    assert s.ledger.fatal == "10 trajectories in a row failed; last: OSError: no sandbox"
