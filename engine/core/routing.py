"""Hardware-affinity choice of a worker for one call, shared by `Cluster` (hw_mapping) and `LLMProxy`.

Order: the least-loaded worker with a free slot on the wanted pool kind; else on a compatible kind
(a fallback); else — every compatible worker busy — the least-loaded wanted-kind worker, which queues
the call. Ties go to the worker that was sent fewest calls, so load spreads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from engine.core.resources import COMPATIBLE, pool_kind_for_tag


class Routable(Protocol):
    kind: str  # pool kind the worker is bound to
    outstanding: int  # calls in flight
    calls: int  # calls routed so far
    capacity: int  # calls it serves at once before it counts as busy


R = TypeVar("R", bound=Routable)


def pick(workers: Sequence[R], tag: str) -> tuple[R, bool]:
    """Returns (worker, fallback) for a call tagged `tag` (a pool kind or a workload profile)."""
    want = pool_kind_for_tag(tag)
    for kind in COMPATIBLE[want]:
        free = [w for w in workers if w.kind == kind and w.outstanding < w.capacity]
        if free:
            return min(free, key=lambda w: (w.outstanding, w.calls)), kind != want
    queue = [w for w in workers if w.kind == want] or [w for w in workers if w.kind in COMPATIBLE[want]]
    if not queue:
        raise RuntimeError(f"no worker on hardware compatible with '{tag}' ({want})")
    chosen = min(queue, key=lambda w: (w.outstanding, w.calls))
    return chosen, chosen.kind != want
