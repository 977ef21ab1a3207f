"""A simulated clock for the benchmarks: an asyncio loop that jumps to its next timer instead of waiting.

The modelled devices and envs only ever *wait* (`asyncio.sleep`, timeouts). Under `VirtualClockLoop` every
callback that is ready runs as usual; when none is, and a timer is pending, the loop's clock jumps to that
timer rather than sleeping. The control plane's code runs unchanged and in the same order of events, but its
own CPU time costs no simulated time: the measured step is what the device and env models predict for the
decisions the real control plane made — exact, repeatable, and independent of the machine's load. (What the
control plane itself costs is measured on the wall clock: `bench scale`.)

I/O still works: the loop polls its selector before each jump, and blocks on it when no timer is pending.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector:
    """The loop's selector, but a timed wait that finds nothing ready moves the clock, not blocks."""

    def __init__(self, inner: selectors.BaseSelector, loop: VirtualClockLoop) -> None:
        self._inner, self._loop = inner, loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._inner.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer pending: only I/O or another thread can wake the loop
            return self._inner.select(None)
        self._loop.advance(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` starts at 0 and moves only when the loop would otherwise wait."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._selector = _JumpingSelector(self._selector, self)  # type: ignore[has-type]

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def run(main: Coroutine[Any, Any, T], virtual: bool = True) -> T:
    """`asyncio.run(main)`, on a `VirtualClockLoop` when `virtual`."""
    if not virtual:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main)
