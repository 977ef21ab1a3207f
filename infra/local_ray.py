"""A Ray cluster on this machine whose every server listens on loopback only.

Ray 2.60 binds its servers (GCS, raylet, each worker's gRPC server, the dashboard and runtime-env agents,
the metrics exporters) to the node's address. It picks that address itself, and turns a loopback one
into the machine's routable address (`ray._private.services.resolve_ip_for_localhost`, so
`_node_ip_address="127.0.0.1"` changes nothing), unless its multi-machine support is off: then the node
address is 127.0.0.1. That switch is a module constant read on each call, so it is turned off only while
the cluster starts; a cluster on several machines (`RAY_ADDRESS`) never goes through here.
`tests/integration/engine/test_experiment_on_ray.py` lists what a run listens on and fails on a change.

No worker is prestarted: Ray starts one per CPU when the driver connects, and a run's actors, started with
the run's `runtime_env`, never took them (they stayed `ray::IDLE` beside the actors), so each cluster paid
~1.4 CPU-seconds and ~100 MB for processes that only idled.

A driver's `ray.init` also replaces the process's SIGTERM handler with one that exits; `sigterm_kept`
keeps a handler that was there before (see its docstring).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import ray
from ray._private import ray_constants
from ray._private import utils as ray_utils


def init_local_ray(**kwargs: Any) -> Any:
    """`ray.init(**kwargs)` starting a new single-machine cluster on 127.0.0.1; returns its context."""
    if "address" in kwargs or "_node_ip_address" in kwargs:
        raise ValueError("init_local_ray starts a new cluster on loopback: no address or node address")
    system = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}
    kwargs["_system_config"] = {**system, **kwargs.get("_system_config", {})}
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        return ray.init(address="local", **kwargs)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def node_address() -> str:
    """This process's node address as Ray knows it (each machine's own in a cluster), else loopback."""
    if ray.is_initialized():
        return str(ray.util.get_node_ip_address())
    return "127.0.0.1"


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """Around `ray.init`: a SIGTERM handler installed before (not the default) stays in place throughout.

    Inside a Prefect flow run that handler is Prefect's: when a runner cancels the run it says so on a
    control channel, then sends SIGTERM, and Prefect's handler turns that into a Cancelled run (the flow's
    `finally` tears the actors and Ray down). `ray.init` installs its own handler (one that exits) as its
    first step, through `ray._private.utils.set_sigterm_handler`; a cancel that landed while Ray started,
    seconds on a busy machine, or at any time after, became a crash, whose `on_crashed` hook counts a
    failure and whose event the auto-resume automation answers with a new run. So while this context is
    open that call installs nothing, and the handler is also put back on the way out (a Ray that set it
    some other way). Where the default was in place (a script, a notebook) Ray's handler is installed: it
    exits through Ray's shutdown instead of dying at once."""
    if threading.current_thread() is not threading.main_thread():  # signals belong to the main thread
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    if not callable(before):
        yield
        return
    install = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = _kept
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install
        signal.signal(signal.SIGTERM, before)


def _kept(handler: Any) -> None:
    """`ray._private.utils.set_sigterm_handler` while `sigterm_kept` is open: the handler is not installed."""
