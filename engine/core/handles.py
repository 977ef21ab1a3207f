"""Call a method the same way on a local object or a Ray actor handle, from async code.

Engine components are plain classes with (mostly async) methods; in a real run they live in Ray actors.
`acall(target.m, ...)` awaits `target.m.remote(...)` for an actor, or `target.m(...)` (awaited when it
is a coroutine) for a local object, so the orchestration code is the same in tests and at scale.
`acall_split` is for a call whose result has a small head the caller reads and a large body it only hands
on: on Ray the body stays in the object store as an ObjectRef, which the next actor call takes as an
argument (Ray resolves it there), so it never travels through the caller.
`RankGroup` makes the ranks of a role that work in lockstep look like one actor; `wait_gone` waits until
named actors are dead and their names free.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import ray


async def acall(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` awaited: `fn` is a Ray actor's method (`handle.m`, called with `.remote`) or a
    local object's (awaited when it returns a coroutine). Taking the method, not its name, lets the type
    checker see that the method exists wherever the handle is typed as the worker class."""
    if hasattr(fn, "remote"):
        return await fn.remote(*args, **kwargs)
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


async def acall_split(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """`fn(*args, **kwargs)` returns a pair (head, body): the head awaited, the body as it is for a local
    object or, for an actor's method, as an ObjectRef (its two return values are separate objects; an
    error in `fn` is raised here, from the head)."""
    if hasattr(fn, "remote"):
        head, body = fn.options(num_returns=2).remote(*args, **kwargs)
        return await head, body
    out = fn(*args, **kwargs)
    head, body = await out if inspect.isawaitable(out) else out
    return head, body


@ray.remote(num_cpus=0)
def _first(*results: Any) -> Any:
    """Rank 0's result, once every rank's call has ended (an error on any rank is raised here)."""
    return results[0]


class RankGroup:
    """The ranks of one role that work in lockstep (the trainer's tensor- and pipeline-parallel processes)
    behind one handle, as an actor's: `group.m.remote(...)` calls `m` on every rank at once (their
    collectives need all of them) and gives rank 0's result, as an ObjectRef that fails if any rank's call
    failed. Rank 0 is the first pipeline stage: what only the last stage computes (the loss, sampled
    tokens) is sent to every rank by the trainer itself (engine.train.megatron.pipeline)."""

    def __init__(self, actors: list[Any], methods: frozenset[str] | None = None):
        if not actors:
            raise ValueError("RankGroup needs at least one actor")
        self.actors = actors
        self.methods = (
            methods  # the methods every rank takes (None: any); the Cluster passes its @register ones
        )

    def __getattr__(self, method: str) -> _FanOut:
        if method.startswith("__") and method != "__ray_call__":
            raise AttributeError(method)
        if self.methods is not None and method not in self.methods and method != "__ray_call__":
            raise AttributeError(f"{method} is not a method every rank takes (declare it @register)")
        return _FanOut(self.actors, method)


class _FanOut:
    def __init__(self, actors: list[Any], method: str):
        self.actors, self.method = actors, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        refs = [getattr(a, self.method).remote(*args, **kwargs) for a in self.actors]
        return refs[0] if len(refs) == 1 else _first.remote(*refs)  # one rank: its own ref, no extra task


def wait_gone(namespace: str, names: list[str], timeout_s: float = 30.0) -> None:
    """Wait until the named actors are dead (Ray releases a killed actor's name asynchronously)."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                break
            time.sleep(0.05)
