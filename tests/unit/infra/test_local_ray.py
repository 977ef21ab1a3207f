"""`sigterm_kept`: a SIGTERM handler installed before `ray.init` is put back after it; the default is not."""

import signal

import pytest

from infra.local_ray import sigterm_kept


def _ray_like(signum, frame):  # what `ray.init` installs in a driver
    raise SystemExit(signum)


def _prefect_like(signum, frame):  # what a Prefect flow run had installed
    raise KeyboardInterrupt


@pytest.fixture
def restore_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_a_handler_installed_before_is_put_back(restore_sigterm):
    signal.signal(signal.SIGTERM, _prefect_like)
    with sigterm_kept():
        signal.signal(signal.SIGTERM, _ray_like)
    assert signal.getsignal(signal.SIGTERM) is _prefect_like


def test_with_the_default_before_the_new_handler_stays(restore_sigterm):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with sigterm_kept():
        signal.signal(signal.SIGTERM, _ray_like)
    assert signal.getsignal(signal.SIGTERM) is _ray_like


def test_put_back_when_the_init_fails_too(restore_sigterm):
    signal.signal(signal.SIGTERM, _prefect_like)
    with pytest.raises(RuntimeError), sigterm_kept():
        signal.signal(signal.SIGTERM, _ray_like)
        raise RuntimeError("ray.init failed")
    assert signal.getsignal(signal.SIGTERM) is _prefect_like
