import os

from engine.actor_args import threads


def test_a_role_gets_the_threads_asked_else_its_pools_cores_else_the_machine_by_mode():
    cores = os.cpu_count() or 1
    assert threads(3, "rollart", [0]) == 3
    assert threads(0, "rollart", [0, 1, 2]) == 3
    assert threads(0, "sync", [1]) == 1
    assert threads(0, "sync+") == cores
    assert threads(0, "rollart") == max(1, cores // 2)
