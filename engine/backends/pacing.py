"""Modelled time as waiting: the event loop's clock, and a pacer that sleeps modelled seconds x time_scale.

Every wait and timestamp of the modelled engine goes by the running loop's clock, so under a loop with a
simulated clock (`bench.clock`) the same engine runs in simulated time.
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
    """Turns modelled seconds into wall-clock waiting, one sleep per `min_sleep_s` owed (module doc)."""

    def __init__(self, time_scale: float, min_sleep_s: float) -> None:
        self.time_scale = time_scale
        self.min_sleep_s = min_sleep_s
        self.debt = 0.0  # wall seconds owed; negative = overslept, credited to the next iterations

    def owe(self, modelled_s: float) -> None:
        self.debt += modelled_s * self.time_scale

    @property
    def due(self) -> bool:
        return self.debt >= self.min_sleep_s and self.debt > 0  # min_sleep_s = 0: sleep after every iteration

    def budget_s(self) -> float:
        """Modelled seconds that may still run before a sleep is due."""
        return (self.min_sleep_s - self.debt) / self.time_scale

    async def pay(self) -> None:
        if self.debt <= 0:
            await asyncio.sleep(0)  # let arrivals in even when running on credit
            return
        t0 = clock()
        await asyncio.sleep(self.debt)
        self.debt -= clock() - t0

    def reset(self) -> None:
        self.debt = 0.0
