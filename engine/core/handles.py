"""Call a method the same way on a local object or a Ray actor handle, from async code.

Engine components are plain classes with (mostly async) methods; in a real run they live in Ray actors.
`acall(target, "m", ...)` awaits `target.m.remote(...)` for an actor, or `target.m(...)` (awaited when it
is a coroutine) for a local object, so the orchestration code is the same in tests and at scale.
"""

from __future__ import annotations

import inspect
from typing import Any


async def acall(target: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    fn = getattr(target, method)
    if hasattr(fn, "remote"):
        return await fn.remote(*args, **kwargs)
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out
