"""A run stopped by SIGTERM (its Prefect runner cancelling it, a process manager stopping it) has not failed.

Inside a flow run Prefect turns SIGTERM into a `TerminationSignal` raised wherever the process is. Raised
inside C code (Ray's, SQLAlchemy's) it comes out as that call's own error, `SystemError: ... returned a
result with an exception set`, with the signal as its cause: an `Exception`, which a task would retry (a
retried `start_actors` then met the pool units its stopped attempt still held) and a flow would end as
Failed (whose hook counts a failure that the auto-resume automation answers). So a task retries only what
was not a stop (`retry_unless_stopped`), and the train flow re-raises the signal itself (`stop_signal`):
Prefect then ends the run as Cancelled when its runner asked, else as Crashed.

A signal handler that runs inside a weakref callback or a `__del__` (a garbage collection during Ray's
start, for one) has its exception printed as "Exception ignored" and dropped: the run went on and
completed after its runner had cancelled it. The runner says "cancel" on its control channel before it
sends SIGTERM, so the flow also checks for that intent between its phases (`raise_if_cancelled`).
"""

from __future__ import annotations

import signal
from typing import Any

from prefect._internal.control_listener import get_intent
from prefect.exceptions import TerminationSignal


def stop_signal(exc: BaseException) -> TerminationSignal | None:
    """The `TerminationSignal` that `exc` is, or that caused it (through `__cause__` or `__context__`)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, TerminationSignal):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def retry_unless_stopped(task: Any, task_run: Any, state: Any) -> bool:
    """A task's `retry_condition_fn`: retry a failure, but not a stop (`state.data` is the exception)."""
    return not (isinstance(state.data, BaseException) and stop_signal(state.data) is not None)


def raise_if_cancelled() -> None:
    """Raise the `TerminationSignal` of a runner's cancel whose SIGTERM was raised where Python drops it."""
    if get_intent() == "cancel":
        raise TerminationSignal(signal=signal.SIGTERM)
