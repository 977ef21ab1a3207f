"""Async tests on the simulated clock (`bench.clock`): their waits take no wall time, so what they time is
what the code under test decided, exact and independent of the machine's load."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

from bench import clock


def on_simulated_clock(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """`test` (an async test function) run to completion on a `VirtualClockLoop`; fixtures pass through."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        clock.run(test(*args, **kwargs))

    return run
