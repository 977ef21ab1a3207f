"""`sigterm_kept` around a real `ray.init` on loopback: a SIGTERM handler installed before (Prefect's, in a
flow run) is in place while Ray starts and after, so a runner's cancel stays a cancel."""

import signal

import ray

from infra.local_ray import init_local_ray, sigterm_kept


def _prefect_like(signum, frame):
    raise KeyboardInterrupt


def test_a_real_ray_init_leaves_the_handler_in_place():
    before = signal.signal(signal.SIGTERM, _prefect_like)
    try:
        with sigterm_kept():
            init_local_ray(num_cpus=1, include_dashboard=False)
            assert signal.getsignal(signal.SIGTERM) is _prefect_like  # not put back: never replaced
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, before)
