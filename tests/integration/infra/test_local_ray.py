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


def test_no_worker_is_prestarted_and_an_actor_still_starts():
    import psutil
    from ray._private import ray_constants
    from ray._private import worker as ray_worker

    init_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        (raylet,) = ray_worker._global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]

        def workers() -> list[str]:  # the raylet's children but its two agents (dashboard, runtime env)
            names = (p.name() for p in psutil.Process(raylet.process.pid).children())
            return sorted(n for n in names if n.startswith("ray::") and not n.endswith("Agent"))

        @ray.remote(num_cpus=0)
        class Echo:
            def ping(self) -> str:
                return "pong"

        # a prestarted worker shows up as ray::IDLE a second or two after the driver connects; by the time
        # the actor has answered, Ray has had that long (with prestarting: ['ray::Echo', 'ray::IDLE'])
        assert ray.get(Echo.remote().ping.remote(), timeout=120) == "pong"
        assert workers() == ["ray::Echo"], workers()
    finally:
        ray.shutdown()
