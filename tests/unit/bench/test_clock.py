"""The simulated clock: sleeps and timeouts happen in loop time, in order, without waiting for real."""

import asyncio
import time

import pytest

from bench.clock import VirtualClockLoop, run


async def _sleepers() -> tuple[list[tuple[str, float]], float]:
    loop = asyncio.get_running_loop()
    done: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        done.append((name, loop.time()))

    await asyncio.gather(sleeper("long", 3600.0), sleeper("short", 2.5), sleeper("now", 0.0))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(50.0):
            await asyncio.sleep(1e6)
    return done, loop.time()


def test_sleeps_and_timeouts_run_in_simulated_time() -> None:
    t0 = time.perf_counter()
    done, end = run(_sleepers())
    assert done == [("now", 0.0), ("short", 2.5), ("long", 3600.0)]
    assert end == pytest.approx(3650.0)
    assert time.perf_counter() - t0 < 2.0  # an hour of sleeping, simulated


def test_wall_mode_is_plain_asyncio() -> None:
    async def which() -> type:
        await asyncio.sleep(0.001)
        return type(asyncio.get_running_loop())

    assert run(which(), virtual=False) is not VirtualClockLoop
    assert run(which()) is VirtualClockLoop
