"""Open a weight store from a small picklable spec, so every process (trainer, each generation worker)
can connect to the same store: `{"kind": "mooncake", "master_addr": ..., "metadata_url": ...}`,
`{"kind": "ray", "name": ..., "namespace": ...}` or `{"kind": "memory"}` (one process only)."""

from __future__ import annotations

from typing import Any

from infra.weightstore.base import InMemoryStore, WeightStore

KINDS = ("mooncake", "ray", "memory")


def open_store(spec: dict[str, Any] | WeightStore) -> WeightStore:
    """A spec opens a connection; an already-open store (same process) is used as it is."""
    if isinstance(spec, WeightStore):
        return spec
    kind = spec.get("kind")
    args = {k: v for k, v in spec.items() if k != "kind"}
    if kind == "mooncake":
        from infra.weightstore.mooncake import MooncakeStore

        return MooncakeStore(**args)
    if kind == "ray":
        from infra.weightstore.ray_store import RayObjectStore

        return RayObjectStore(**args)
    if kind == "memory":
        return InMemoryStore()
    raise ValueError(f"unknown weight store kind {kind!r}; known: {', '.join(KINDS)}")
