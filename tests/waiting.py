"""Waits in async tests that end on what happened, never after a guessed time.

`settled()`: the event loop has nothing left to run — every task that could go on has gone on and waits.
`until(predicate)`: a condition came true; its timeout only turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

MAX_TURNS = 10_000  # loop turns `settled` allows before it calls the loop busy for good
POLL_S = 0.001  # loop time between two looks of `until` (modelled time on the simulated clock)


async def settled() -> None:
    """Returns once no other callback is ready to run on this event loop: every task that could go on has
    gone on and now waits (on an event, a future, a timer or I/O). What a test asserts next is what the code
    did with nothing further happening: a barrier, not a guess at how long the other tasks need. On the
    simulated clock no time passes here (a timer still pending is a wait like any other)."""
    loop = asyncio.get_running_loop()
    for _ in range(MAX_TURNS):
        if not loop._ready:  # type: ignore[attr-defined]  # asyncio's run queue (CPython's BaseEventLoop)
            return
        await asyncio.sleep(0)  # one turn: what is ready runs, this task goes to the back of the queue
    raise AssertionError(f"the event loop still had work ready after {MAX_TURNS} turns")


async def until(
    predicate: Callable[[], bool], timeout_s: float = 5.0, state: Callable[[], object] | None = None
) -> None:
    """Returns once `predicate()` holds, looking every `POLL_S` of loop time (on the simulated clock the
    loop jumps there only once nothing else is ready, so the code's own timers fire in between). Fails
    after `timeout_s` of loop time, showing `state()` if given: a guard against a hang, not a wait."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() >= deadline:
            seen = f": {state()}" if state is not None else ""
            raise AssertionError(f"not true within {timeout_s} s of loop time{seen}")
        await asyncio.sleep(POLL_S)
