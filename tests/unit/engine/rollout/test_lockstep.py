import asyncio

import pytest

from bench import clock
from engine.envs.base import Env, EnvStep
from engine.rollout.buffer import SampleBuffer
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import TurnLimits
from engine.rollout.reward import RewardScorer
from engine.rollout.scheduler import RolloutScheduler, TaskSpec
from engine.rollout.staleness import StalenessPolicy
from tests.unit.engine.rollout.fakes import ScriptedGenerator, tokenizer

# env i sleeps DELAYS[i][k] at step k; each env's total is 0.1 s, but each turn's slowest is 0.1 s too
DELAYS = [[0.1, 0, 0], [0, 0.1, 0], [0, 0, 0.1], [0, 0, 0]]


class MultiStep(Env):
    name = "multistep"

    def __init__(self, delays):
        self.delays = delays

    async def reset(self, seed):
        self.k = 0
        return "go"

    async def step(self, action):
        await asyncio.sleep(self.delays[self.k])
        self.k += 1
        return EnvStep("next", 1.0, self.k == len(self.delays))


async def rollout_step_time(granularity: str) -> tuple[float, RolloutScheduler, ScriptedGenerator]:
    made = []

    def factory(spec):
        made.append(1)
        return MultiStep(DELAYS[(len(made) - 1) % 4])

    spec = TaskSpec("t", "multistep", {}, 1.0, 2, TurnLimits(5, 4, 1024), "prefill-heavy")
    buf = SampleBuffer(alpha=1)
    gen = ScriptedGenerator(lambda k: "ok")
    s = RolloutScheduler(
        [spec],
        ChatFormat(tokenizer()),
        gen,
        buf,
        RewardScorer(),
        factory,
        StalenessPolicy("rollart", 1),
        concurrency=4,
        batch_groups=2,
        granularity=granularity,
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    runner = asyncio.ensure_future(s.run())
    batch = await asyncio.wait_for(buf.get_batch(2, current_version=0), 5)
    elapsed = loop.time() - t0
    s.stop()
    await runner
    assert len(batch) == 2
    return elapsed, s, gen


def test_batch_granularity_waits_for_the_slowest_env_every_turn():
    # on the simulated clock (bench.clock): the envs' sleeps are the only time that passes
    traj_s, _, _ = clock.run(rollout_step_time("trajectory"))
    batch_s, s, gen = clock.run(rollout_step_time("batch"))
    assert traj_s == pytest.approx(0.1) and batch_s == pytest.approx(0.3)  # the sum of per-turn maxima
    # the first wave's 4 members asked for each of their 3 turns as one batch
    first_wave = [r for r in gen.requests if r.request_id.split(".")[0] in ("g0", "g1")]
    assert len(first_wave) == 12 and s.ledger.counts["waves"] >= 1


def test_batch_granularity_needs_room_for_a_whole_wave():
    spec = TaskSpec("t", "multistep", {}, 1.0, 4, TurnLimits(5, 4, 1024), "prefill-heavy")
    with pytest.raises(ValueError, match=r"rollout\.concurrency must be >= 8, got 4"):
        RolloutScheduler(
            [spec],
            ChatFormat(tokenizer()),
            ScriptedGenerator(lambda k: ""),
            SampleBuffer(1),
            RewardScorer(),
            lambda s: MultiStep([0]),
            StalenessPolicy("rollart", 1),
            4,
            batch_groups=2,
            granularity="batch",
        )
