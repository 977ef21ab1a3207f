"""ResourceManager: hardware pools and worker bindings, kept in the shared metadata store (paper §5).

On one machine each pool is a Ray custom resource (`rollart_pool_<name>`) with the pool's capacity;
on a cluster the same names are node resources/labels. A binding asks for a preferred pool and gets a
compatible fallback when that pool is full (a GPU role may run on either GPU kind; CPU and serverless
pools only stand in for their own kind), instead of stalling. Every binding is a row that any process
can read; bindings are released on exit, and a dead worker's binding is marked dead and rebound.
"""

from __future__ import annotations

import atexit
import uuid
from collections.abc import Sequence

from engine.config import PoolConfig
from engine.types import Profile
from infra.metadata import BindingRow, MetadataStore, PoolsExhausted

# Which pool kinds can stand in for a kind, in order of preference.
COMPATIBLE: dict[str, tuple[str, ...]] = {
    "gpu-compute": ("gpu-compute", "gpu-bandwidth"),
    "gpu-bandwidth": ("gpu-bandwidth", "gpu-compute"),
    "cpu": ("cpu",),
    "serverless": ("serverless",),
}
# Hardware affinity (paper §4): prefill-heavy work is compute-bound, decode-heavy is bandwidth-bound.
AFFINITY: dict[str, str] = {
    Profile.PREFILL_HEAVY.value: "gpu-compute",
    Profile.DECODE_HEAVY.value: "gpu-bandwidth",
}

__all__ = ["AFFINITY", "COMPATIBLE", "BindingRow", "PoolsExhausted", "ResourceManager", "pool_kind_for_tag"]


def pool_kind_for_tag(tag: str) -> str:
    """A call's hardware tag is a pool kind or a workload profile."""
    if tag in COMPATIBLE:
        return tag
    if tag in AFFINITY:
        return AFFINITY[tag]
    raise ValueError(
        f"unknown hardware tag '{tag}'; use a pool kind {list(COMPATIBLE)} or a profile {list(AFFINITY)}"
    )


def ray_resource(pool: str) -> str:
    return f"rollart_pool_{pool}"


class ResourceManager:
    def __init__(self, pools: Sequence[PoolConfig], store: MetadataStore, run: str | None = None):
        if not pools:
            raise ValueError("resources.pools: at least one pool is needed")
        self.pools = {p.name: p for p in pools}
        self.store = store
        self.run = run or f"run-{uuid.uuid4().hex[:8]}"
        for p in pools:
            store.upsert_pool(p.name, p.kind, p.capacity, ray_resource(p.name), p.device)
        atexit.register(self.release_all)

    @property
    def ray_resources(self) -> dict[str, float]:
        """Custom resources for `ray.init(resources=...)` on a single machine."""
        return {
            ray_resource(p.name): float(p.capacity) for p in self.pools.values() if p.kind != "serverless"
        }

    def kind(self, pool: str) -> str:
        return self.pools[pool].kind

    def candidates(self, preferred_pool: str) -> list[str]:
        """The preferred pool, then other pools of the same kind, then pools of compatible kinds."""
        if preferred_pool not in self.pools:
            raise ValueError(f"unknown pool '{preferred_pool}'; pools: {', '.join(self.pools)}")
        out = [preferred_pool]
        for kind in COMPATIBLE[self.kind(preferred_pool)]:
            out += [n for n, p in self.pools.items() if p.kind == kind and n not in out]
        return out

    def bind(
        self, worker: str, role: str, preferred_pool: str, units: int = 1, replaces: int | None = None
    ) -> BindingRow:
        """Reserve `units` of the preferred pool, or of a compatible one; raises PoolsExhausted."""
        return self.store.reserve(self.run, worker, role, self.candidates(preferred_pool), units, replaces)

    def release(self, binding: BindingRow) -> None:
        self.store.set_binding(binding.id, state="released")

    def rebind(self, dead: BindingRow) -> BindingRow:
        """Mark a dead worker's binding dead and bind its replacement (same preferred pool)."""
        self.store.set_binding(dead.id, state="dead")
        return self.bind(dead.worker, dead.role, dead.preferred_pool, dead.units, replaces=dead.id)

    def release_all(self) -> int:
        return self.store.release_run(self.run)

    def usage(self) -> dict[str, tuple[int, int]]:
        return self.store.pool_usage()
