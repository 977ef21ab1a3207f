"""`sigterm_kept`: a SIGTERM handler installed before `ray.init` stays in place while Ray starts and after;
the default is not kept. `ray._private.utils.set_sigterm_handler` stands in for `ray.init` here;
tests/integration/infra/test_local_ray.py starts a real Ray."""

import signal

import pytest
from ray._private import utils as ray_utils

from infra.local_ray import sigterm_kept

RAY_INSTALL = ray_utils.set_sigterm_handler


def _ray_like(signum, frame):  # what `ray.init` installs in a driver
    raise SystemExit(signum)


def _prefect_like(signum, frame):  # what a Prefect flow run had installed
    raise KeyboardInterrupt


@pytest.fixture
def restore_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_a_handler_installed_before_is_kept_while_ray_would_install_its_own(restore_sigterm):
    signal.signal(signal.SIGTERM, _prefect_like)
    with sigterm_kept():
        ray_utils.set_sigterm_handler(_ray_like)  # what `ray.init` does first
        assert signal.getsignal(signal.SIGTERM) is _prefect_like
    assert signal.getsignal(signal.SIGTERM) is _prefect_like
    ray_utils.set_sigterm_handler(_ray_like)  # outside the context Ray's call works again
    assert signal.getsignal(signal.SIGTERM) is _ray_like


def test_a_handler_set_another_way_is_put_back(restore_sigterm):
    signal.signal(signal.SIGTERM, _prefect_like)
    with sigterm_kept():
        signal.signal(signal.SIGTERM, _ray_like)
    assert signal.getsignal(signal.SIGTERM) is _prefect_like


def test_with_the_default_before_the_new_handler_stays(restore_sigterm):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with sigterm_kept():
        ray_utils.set_sigterm_handler(_ray_like)
    assert signal.getsignal(signal.SIGTERM) is _ray_like


def test_put_back_when_the_init_fails_too(restore_sigterm):
    signal.signal(signal.SIGTERM, _prefect_like)
    with pytest.raises(RuntimeError), sigterm_kept():
        signal.signal(signal.SIGTERM, _ray_like)
        raise RuntimeError("ray.init failed")
    assert signal.getsignal(signal.SIGTERM) is _prefect_like
    assert ray_utils.set_sigterm_handler is RAY_INSTALL  # Ray's call restored
