"""`WeightStore` over the Ray object store: the fallback when Mooncake is not installed.

A named, detached actor keeps one ObjectRef per key. The actor itself `ray.put`s each value, so the
actor owns the object and the value outlives the process that wrote it (a Prefect task, a restarted
trainer). That costs one extra copy on put; a get is a zero-copy, read-only view of the shared memory.
Any process connected to the same Ray cluster and namespace sees the same keys.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import ray

from infra.weightstore.base import Buffer, MissingKeyError, WeightStore


@ray.remote(num_cpus=0)
class _KeyTable:
    """key -> ObjectRef, owned by this actor. Async, so calls never queue behind each other."""

    def __init__(self) -> None:
        self._refs: dict[str, ray.ObjectRef] = {}

    async def put(self, key: str, value: np.ndarray) -> None:
        self._refs[key] = ray.put(value)

    async def ref(self, key: str) -> list[ray.ObjectRef]:
        """[ref], or [] when absent (wrapped in a list so Ray hands back the ref, not its value)."""
        return [self._refs[key]] if key in self._refs else []

    async def exists(self, key: str) -> bool:
        return key in self._refs

    async def delete(self, keys: list[str]) -> int:
        return sum(self._refs.pop(k, None) is not None for k in keys)

    async def delete_prefix(self, prefix: str) -> int:
        return await self.delete([k for k in self._refs if k.startswith(prefix)])


class RayObjectStore(WeightStore):
    """Client of the shared key table `name` in `namespace` (created on first use; needs `ray.init`)."""

    def __init__(self, name: str = "rollart-weightstore", namespace: str = "rollart") -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayObjectStore needs a connected Ray driver or worker: call ray.init() first")
        # ray types @ray.remote(**options) as keeping the class as it is; it makes an ActorClass
        self._table = _KeyTable.options(  # type: ignore[attr-defined]
            name=name, namespace=namespace, lifetime="detached", get_if_exists=True
        ).remote()

    def put(self, key: str, data: Buffer) -> None:
        ray.get(self._table.put.remote(key, np.frombuffer(data, dtype=np.uint8)))

    def get(self, key: str) -> Buffer:
        refs = ray.get(self._table.ref.remote(key))
        if not refs:
            raise MissingKeyError(f"weight store (ray) has no key {key!r}")
        return memoryview(ray.get(refs[0]))

    def exists(self, key: str) -> bool:
        return bool(ray.get(self._table.exists.remote(key)))

    def delete(self, keys: Iterable[str]) -> int:
        return int(ray.get(self._table.delete.remote(list(keys))))

    def delete_prefix(self, prefix: str) -> int:
        return int(ray.get(self._table.delete_prefix.remote(prefix)))

    def destroy(self) -> None:
        """Kill the shared table: every key of every client is gone (end of a run)."""
        ray.kill(self._table)
