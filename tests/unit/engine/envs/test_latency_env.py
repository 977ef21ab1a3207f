import asyncio
import math
import statistics

import pytest

from bench import clock
from engine.envs.base import Env, EnvStep
from engine.envs.frozenlake import FrozenLakeEnv
from engine.envs.latency import LatencyEnv, LatencyModel


def test_draws_are_reproducible_per_seed_and_stream():
    model = LatencyModel(5.0, 1.0, seed=3)
    assert model.draws(100) == LatencyModel(5.0, 1.0, seed=3).draws(100)
    assert model.draws(10) == model.draws(100)[:10]
    assert model.draws(10) != LatencyModel(5.0, 1.0, seed=4).draws(10)
    assert model.draws(10) != LatencyModel(5.0, 1.0, seed=3, stream=1).draws(10)


def test_mean_and_std_match_mu_and_sigma_far_from_zero():
    draws = LatencyModel(10.0, 2.0, seed=0).draws(20_000)
    assert statistics.fmean(draws) == pytest.approx(10.0, abs=0.05)  # standard error 0.014
    assert statistics.stdev(draws) == pytest.approx(2.0, abs=0.05)


def test_truncation_at_zero_redraws_instead_of_clipping():
    draws = LatencyModel(0.0, 1.0, seed=1).draws(20_000)
    assert min(draws) > 0.0  # clipping would put half the mass at exactly 0
    assert statistics.fmean(draws) == pytest.approx(math.sqrt(2 / math.pi), abs=0.02)  # half-normal: 0.798
    assert statistics.stdev(draws) == pytest.approx(math.sqrt(1 - 2 / math.pi), abs=0.02)  # 0.603


def test_zero_sigma_is_a_constant_latency():
    assert LatencyModel(2.5, 0.0).draws(3) == [2.5, 2.5, 2.5]


@pytest.mark.parametrize(("mu", "sigma", "seed"), [(-1.0, 1.0, 0), (1.0, -0.5, 0), (1.0, 1.0, -2)])
def test_bad_latency_parameters_are_rejected(mu: float, sigma: float, seed: int):
    with pytest.raises(ValueError, match="latency"):
        LatencyModel(mu, sigma, seed=seed)


def test_wrapper_sleeps_the_drawn_times_then_delegates():
    scale = 0.01
    env = LatencyEnv(
        FrozenLakeEnv(), reset_latency=(4.0, 1.0), step_latency=(3.0, 1.0), seed=5, time_scale=scale
    )
    assert env.instructions == FrozenLakeEnv.instructions
    actions = ["down", "down", "right", "right", "down", "right"]

    async def play() -> tuple[str, list[EnvStep], float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = await env.reset(0)
        steps = [await env.step(a) for a in actions]
        return first, steps, loop.time() - start

    first, steps, elapsed = clock.run(play())  # the simulated clock: only the sleeps pass time
    step_draws = env.step_model.draws(6)
    expected = (env.reset_model.draws(1)[0] + sum(step_draws)) * scale
    assert expected == pytest.approx(0.22, abs=0.1)
    assert elapsed == pytest.approx(expected, rel=1e-9)
    assert first.startswith("PFFF")
    assert [s.info["latency"] for s in steps] == step_draws
    assert (steps[-1].reward, steps[-1].done, steps[-1].info["success"]) == (1.0, True, True)


async def test_step_draws_continue_across_episodes():
    env = LatencyEnv(
        FrozenLakeEnv(), reset_latency=(0.0, 0.0), step_latency=(2.0, 1.0), seed=2, time_scale=0.0
    )
    seen = []
    for _ in range(2):
        await env.reset(0)
        seen += [(await env.step(a)).info["latency"] for a in ["right", "down"]]  # into the hole
    assert seen == env.step_model.draws(4)


def test_wrappers_sleep_concurrently():
    envs = [
        LatencyEnv(
            FrozenLakeEnv(), reset_latency=(10.0, 0.0), step_latency=(0.0, 0.0), seed=i, time_scale=0.02
        )
        for i in range(4)
    ]

    async def reset_all() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.gather(*(env.reset(0) for env in envs))
        return loop.time() - start

    assert clock.run(reset_all()) == pytest.approx(0.2)  # four 0.2 s sleeps overlap, not 0.8 s


class _Recorder(Env):
    name = "recorder"

    def __init__(self) -> None:
        self.closed = False

    async def reset(self, seed: int) -> str:
        return f"seed {seed}"

    async def step(self, action: str) -> EnvStep:
        return EnvStep(action, 0.5, False, {"echo": action})

    async def close(self) -> None:
        self.closed = True


async def test_wrapper_passes_results_through_and_closes_inner():
    inner = _Recorder()
    env = LatencyEnv(inner, reset_latency=(0.0, 0.0), step_latency=(1.0, 0.0), time_scale=0.0)
    assert await env.reset(9) == "seed 9"
    assert await env.step("hi") == EnvStep("hi", 0.5, False, {"echo": "hi", "latency": 1.0})
    await env.close()
    assert inner.closed


def test_negative_time_scale_is_rejected():
    with pytest.raises(ValueError, match="time_scale"):
        LatencyEnv(_Recorder(), (1.0, 0.0), (1.0, 0.0), time_scale=-1.0)
