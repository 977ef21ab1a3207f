"""Open a weight store from a small picklable spec, so every process (trainer, each generation worker)
can connect to the same store: `{"kind": "mooncake", "master_addr": ..., "metadata_url": ...}`,
`{"kind": "ray", "name": ..., "namespace": ...}` or `{"kind": "memory"}` (one process only).

A process that serves one run after another (engine/core/warm.py) hands its store back with
`release_store`: a Mooncake client is then kept open for the next `open_store` of the same spec, since
closing one joins its ping thread (1-2 s, with the GIL held) and a new one registers its segment again.
"""

from __future__ import annotations

from typing import Any

from infra.weightstore.base import InMemoryStore, WeightStore

KINDS = ("mooncake", "ray", "memory")
# Mooncake clients released in this process, by spec: at most one is ever kept (the last run's).
_kept: dict[tuple[tuple[str, Any], ...], WeightStore] = {}


def _reuse_key(spec: dict[str, Any] | WeightStore) -> tuple[tuple[str, Any], ...] | None:
    """Which clients can serve `spec`: a Mooncake client to the same master with the same segment
    (`log_dir` only says where its start-up lines went); None for a store that is never kept."""
    if isinstance(spec, WeightStore) or spec.get("kind") != "mooncake":
        return None
    return tuple(sorted((k, v) for k, v in spec.items() if k != "log_dir"))


def open_store(spec: dict[str, Any] | WeightStore) -> WeightStore:
    """A spec opens a connection; an already-open store (same process) is used as it is."""
    if isinstance(spec, WeightStore):
        return spec
    key = _reuse_key(spec)
    if key is not None and (kept := _take_kept(key)) is not None:
        return kept
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


def _take_kept(key: tuple[tuple[str, Any], ...]) -> WeightStore | None:
    """The client kept for `key`, if any; any other kept client is closed (its master went with its run,
    or its segment is another size)."""
    kept = _kept.pop(key, None)
    for other in _kept.values():
        other.close()
    _kept.clear()
    return kept


def release_store(spec: dict[str, Any] | WeightStore, store: WeightStore) -> None:
    """This run is done with `store`, opened from `spec`: a Mooncake client stays open for the next
    `open_store(spec)` in this process (its data is the caller's to delete first); any other is closed."""
    key = _reuse_key(spec)
    if key is None:
        store.close()
        return
    old = _take_kept(key)
    if old is not None and old is not store:
        old.close()
    _kept[key] = store
