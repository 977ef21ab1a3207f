"""Worker: the base class of every role's process (run as a Ray actor by a Cluster)."""

from __future__ import annotations

import enum
import os
import pickle
import socket
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import ray
from ray.experimental import internal_kv

from engine.core.decorators import dispatch_spec


class Role(enum.StrEnum):
    ACTOR_TRAIN = "actor_train"
    ACTOR_GEN = "actor_gen"
    REWARD = "reward"
    ENVIRONMENT = "environment"


def pin(cores: list[int], pool: str) -> None:
    """Run every thread of this process, and the threads it starts later, on `cores` only (Linux): a
    CPU pool is its cores as a GPU pool is its GPUs, so roles in different pools do not share a core."""
    have = os.cpu_count() or 1
    if max(cores) >= have:
        raise ValueError(
            f"resources.pools: pool {pool!r} cores {cores} are not all on this machine (0-{have - 1})"
        )
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cores)


def hide_gpus_unless_given() -> None:
    """In a Ray actor that was given no GPU, make none visible (Ray leaves CUDA_VISIBLE_DEVICES unset
    there, so on a GPU machine such a worker would see, and might use, every GPU). Call before CUDA is
    first touched; a no-op outside actors and in actors that hold GPUs."""
    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() and not ray.get_gpu_ids():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def device() -> str:
    """Where this process's torch work runs: "cuda" when it was given a GPU, else "cpu". A worker whose
    GPUs are hidden (given none) answers without importing torch: `ping` asks every worker, and a role
    that never uses torch would otherwise pay seconds of CPU for the import."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def restarted() -> bool:
    """True in an actor incarnation that Ray restarted after the process died (False outside an actor)."""
    if not ray.is_initialized():  # asking for the runtime context would start a local Ray instance
        return False
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:  # a worker object built in the driver (tests, local runs)
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ray's own implementation warns about a deprecated call
        return bool(context.was_current_actor_reconstructed)


# Ray restarts a dead actor with the arguments it was created with. A process rebuilt for another run
# (`Worker.reinit`) must come back as that run's worker, so `reinit` files its arguments in Ray's key-value
# store under the actor's id, and a restartable role's constructor takes them from there (`latest_args`).
_ARGS_KEY = "rollart/reinit/{}"


def _remember_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    actor = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    if actor is not None:
        internal_kv._internal_kv_put(_ARGS_KEY.format(actor), pickle.dumps((args, kwargs)), overwrite=True)


def latest_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments to build this worker from: the last `reinit`'s, in an incarnation Ray restarted after
    one; else the ones given."""
    if not restarted():
        return args, kwargs
    stored = internal_kv._internal_kv_get(_ARGS_KEY.format(ray.get_runtime_context().get_actor_id()))
    return pickle.loads(stored) if stored is not None else (args, kwargs)


class Worker:
    """Subclass per role; decorate methods with `register` / `hw_mapping` / `register_serverless`.

    The Cluster passes where the worker was bound (`pool`, `pool_kind`) so a worker knows its hardware,
    and the pool's `cores`: the worker's process then runs on those CPU cores only.
    """

    role: ClassVar[Role]

    def __init__(
        self,
        name: str,
        rank: int,
        world_size: int,
        pool: str,
        pool_kind: str,
        config: dict[str, Any] | None = None,
        cores: list[int] | None = None,
    ):
        if cores:
            pin(cores, pool)
        hide_gpus_unless_given()
        self.name = name
        self.rank = rank
        self.world_size = world_size
        self.pool = pool
        self.pool_kind = pool_kind
        self.config = config or {}

    def reinit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Become a new worker of a new run in this process, as the constructor would build it (what the
        process imported stays imported: the seconds a new process spends on torch and transformers).
        Returns `ping()`, as a new worker's first answer. Only for a role with a `retire()` method, which
        lets go of the last run's state and says whether the process can be reused (`engine/core/warm.py`)."""
        _remember_args(args, kwargs)
        type(self).__init__(self, *args, **kwargs)
        return self.ping()

    def ping(self) -> dict[str, Any]:
        """Liveness and placement: the Cluster records `node` in the binding row; `gpus` are the GPU ids
        Ray gave this worker (what its CUDA_VISIBLE_DEVICES names), `device` where its torch work runs."""
        return {
            "name": self.name,
            "pid": os.getpid(),
            "node": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
            "pool": self.pool,
            "gpus": [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else [],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device": device(),
        }


def serverless_body(
    worker_cls: type[Worker], method: str, name: str, pool: str, pool_kind: str, config: dict[str, Any]
) -> Callable[..., Any]:
    """What a serverless endpoint of `worker_cls.method` (declared `@register_serverless`) runs: that method
    of a worker built once per replica, here (the factory a Serve replica calls: `infra.serve`)."""
    spec = dispatch_spec(getattr(worker_cls, method, None))
    if spec is None or spec.kind != "serverless":
        raise ValueError(f"{worker_cls.__name__}.{method} is not declared @register_serverless")
    return getattr(worker_cls(name, 0, 1, pool, pool_kind, config), method)
