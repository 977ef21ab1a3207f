"""A SIGTERM that surfaced as another error is recognised as a stop: not retried, re-raised as the signal."""

import signal

import pytest
from prefect.exceptions import TerminationSignal
from prefect.states import Failed

from tasks.stopping import raise_if_cancelled, retry_unless_stopped, stop_signal


def _surfaced_in_c_code() -> SystemError:
    """What a signal handler raising inside a C call leaves: that call's SystemError, caused by the signal."""
    try:
        try:
            raise TerminationSignal(signal=signal.SIGTERM)
        except TerminationSignal as sig:
            raise SystemError("<built-in method __new__> returned a result with an exception set") from sig
    except SystemError as e:
        return e


def test_the_signal_is_found_through_causes_and_contexts():
    wrapped = _surfaced_in_c_code()
    assert stop_signal(wrapped).signal == signal.SIGTERM
    try:  # a step's failure wrapped again by the flow (`raise TrainingStopped(...) from e`)
        raise RuntimeError("step 3 failed after 1 retries") from wrapped
    except RuntimeError as outer:
        assert stop_signal(outer) is stop_signal(wrapped)
    try:  # raised while handling it (a cleanup that failed), its context only hidden from tracebacks
        try:
            raise wrapped
        except SystemError:
            raise ValueError("cleanup failed") from None
    except ValueError as e:
        assert stop_signal(e) is stop_signal(wrapped)  # still a run being stopped
    assert stop_signal(RuntimeError("a worker died")) is None


def test_a_cycle_in_the_chain_ends_the_search():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert stop_signal(a) is None


def test_a_task_retries_failures_but_not_a_stop():
    assert retry_unless_stopped(None, None, Failed(data=RuntimeError("the proxy did not start"))) is True
    assert retry_unless_stopped(None, None, Failed(data=_surfaced_in_c_code())) is False
    assert retry_unless_stopped(None, None, Failed(data=None)) is True  # a failed state without an exception


def test_a_cancel_the_runner_announced_is_raised_as_its_signal():
    from prefect._internal import control_listener

    raise_if_cancelled()  # no intent: nothing
    control_listener._set_intent("cancel")
    try:
        with pytest.raises(TerminationSignal) as caught:
            raise_if_cancelled()
        assert caught.value.signal == signal.SIGTERM
    finally:
        control_listener.clear_intent()
