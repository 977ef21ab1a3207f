import multiprocessing as mp
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.core.worker import Role, Worker, pin

ROOT = Path(__file__).resolve().parents[4]


class Probe(Worker):
    role = Role.ACTOR_TRAIN


def _affinities(cores: list[int], queue: mp.Queue) -> None:
    """In a child process (pinning the test process would pin pytest): affinity of this thread, of a
    thread started before the worker was built and of one started after."""
    seen: dict[str, set[int]] = {}
    ready, done = threading.Event(), threading.Event()

    def early() -> None:
        ready.set()
        done.wait()
        seen["early"] = os.sched_getaffinity(0)

    t = threading.Thread(target=early)
    t.start()
    ready.wait()
    Probe("w", 0, 1, "compute", "gpu-compute", cores=cores)
    done.set()
    t.join()
    late = threading.Thread(target=lambda: seen.__setitem__("late", os.sched_getaffinity(0)))
    late.start()
    late.join()
    queue.put({"main": os.sched_getaffinity(0), **seen})


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="core pinning is Linux-only")
def test_a_worker_with_pool_cores_runs_every_thread_on_them_only():
    queue: mp.Queue = mp.get_context("spawn").Queue()
    last = (os.cpu_count() or 1) - 1
    child = mp.get_context("spawn").Process(target=_affinities, args=([last], queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=30)
    assert got == {"main": {last}, "early": {last}, "late": {last}}
    assert os.sched_getaffinity(0) != {last} or last == 0  # the test process itself was not pinned


def test_cores_not_on_this_machine_are_refused_naming_the_pool():
    n = os.cpu_count() or 1
    with pytest.raises(ValueError, match=rf"resources.pools: pool 'gen' cores \[{n}\] are not all"):
        pin([n], "gen")


def _device_in_child(env: dict[str, str]) -> list[str]:
    code = "import sys; from engine.core.worker import device; print(device(), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_device_of_a_worker_with_hidden_gpus_is_the_cpu_without_importing_torch():
    """A worker given no GPU has them hidden (CUDA_VISIBLE_DEVICES=""): `device()` answers from that;
    otherwise it asks torch, which it imports."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    assert _device_in_child({**env, "CUDA_VISIBLE_DEVICES": ""}) == ["cpu", "False"]
    where, imported = _device_in_child(env)
    assert where in ("cpu", "cuda") and imported == "True"
