import asyncio
import random

import pytest

from engine.envs.faulty import FaultyEnv, InjectedEnvCrash
from engine.envs.synthetic import SyntheticEnv


async def outcomes(seed: str, calls: int, **odds) -> list[str]:
    """What each of `calls` episodes (reset + one step) did: ok, crash, or hang (cut off at 20 ms)."""
    env = FaultyEnv(SyntheticEnv(turns=1), random.Random(seed), **odds)
    out = []
    for _ in range(calls):
        try:
            async with asyncio.timeout(0.02):
                await env.reset(0)
                await env.step("x")
            out.append("ok")
        except InjectedEnvCrash as e:
            out.append(str(e).rsplit(" ", 1)[1])  # "reset" or "step"
        except TimeoutError:
            out.append("hang")
    return out


async def test_faults_are_drawn_at_the_configured_rates_and_replay_from_the_seed():
    odds = dict(reset_crash=0.2, step_crash=0.2, hang=0.1)
    first = await outcomes("7/env/0", 300, **odds)
    assert await outcomes("7/env/0", 300, **odds) == first  # same seed, same faults
    assert await outcomes("7/env/1", 300, **odds) != first
    n = {k: first.count(k) for k in ("ok", "reset", "step", "hang")}
    assert sum(n.values()) == 300
    assert 40 <= n["reset"] <= 80  # 20% of 300 resets
    assert 25 <= n["step"] <= 65  # 20% of the ~220 steps reached
    assert 15 <= n["hang"] <= 50  # 10% of resets and steps


async def test_no_odds_no_faults_and_the_inner_env_answers():
    assert await outcomes("0", 50) == ["ok"] * 50


def test_a_probability_outside_0_1_is_refused_by_name():
    with pytest.raises(ValueError, match="step_crash must be a probability in"):
        FaultyEnv(SyntheticEnv(), random.Random(0), step_crash=1.5)
