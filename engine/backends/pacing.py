"""Modelled time as waiting: the event loop's clock, a pacer that sleeps modelled seconds x time_scale, and a
wake-up whose time can be moved while it is awaited (the modelled engine's next event).

Every wait and timestamp of the modelled engines goes by the running loop's clock, so under a loop with a
simulated clock (`bench.clock`) the same engines run in simulated time.
"""

from __future__ import annotations

import asyncio
import time


def clock() -> float:
    """The running event loop's clock, else the monotonic clock it normally reads.

    Every wait and timestamp of the engine goes by the loop's clock, so a loop with a simulated clock
    (`bench.clock`) runs the same engine in simulated time.
    """
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class Pacer:
    """Turns modelled seconds into wall-clock waiting: what is owed is slept at `pay`; oversleeping (a loaded
    event loop) is credited against the next payments, so throughput keeps to modelled x time_scale."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self.debt = 0.0  # wall seconds owed; negative = overslept, credited to the next payments

    def owe(self, modelled_s: float) -> None:
        self.debt += modelled_s * self.time_scale

    async def pay(self) -> None:
        if self.debt <= 0:
            await asyncio.sleep(0)  # let arrivals in even when running on credit
            return
        t0 = clock()
        await asyncio.sleep(self.debt)
        self.debt -= clock() - t0

    def reset(self) -> None:
        self.debt = 0.0


def _ring(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Alarm:
    """One awaited wake-up at a loop time (`bench.clock`'s loop jumps to it) that `move` can bring forward or
    push back while it is awaited."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self._handle: asyncio.TimerHandle | None = None

    async def until(self, at: float) -> None:
        """Return at loop time `at`, or when `move` says, whichever it was last set to."""
        self._future = asyncio.get_running_loop().create_future()
        self.move(at)
        try:
            await self._future
        finally:
            if self._handle is not None:
                self._handle.cancel()
            self._future = self._handle = None

    def move(self, at: float) -> None:
        """Ring at loop time `at` instead (no-op when nothing awaits the alarm)."""
        if self._future is None:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_at(at, _ring, self._future)
