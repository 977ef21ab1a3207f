"""The weight-store interface: a flat key -> bytes store that several processes share.

The trainer publishes weight buckets under keys like `{run}/v{version}/bucket{i}`; generation workers read
them. Backends: Mooncake (production, RDMA/TCP), the Ray object store (fallback inside one Ray cluster),
and `InMemoryStore` (one process; unit tests). Only bytes and keys cross this interface, never tensors.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable

Buffer = bytes | bytearray | memoryview


class WeightStoreError(RuntimeError):
    """A store operation failed; the message names the key and the backend's reason."""


class MissingKeyError(WeightStoreError, KeyError):
    """The key is not in the store (never written, deleted, or evicted)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class StoreFullError(WeightStoreError):
    """The store has no room for the value; delete old versions or give the store more memory."""


class WeightStore(ABC):
    """Put/get whole values by key. A put of an existing key replaces the value."""

    @abstractmethod
    def put(self, key: str, data: Buffer) -> None: ...

    @abstractmethod
    def get(self, key: str) -> Buffer:
        """The value, as a buffer the caller may keep (raises MissingKeyError)."""

    def get_into(self, key: str, out: memoryview) -> None:
        """Read the value into `out`, a writable byte buffer of exactly its size. A reader that reuses its
        buffers from one version to the next touches no fresh memory per read: on a VM that hands freed
        pages back to its host, first-touching 0.5 GB costs seconds (raises MissingKeyError)."""
        data = memoryview(self.get(key)).cast("B")
        if data.nbytes != out.nbytes:
            raise WeightStoreError(
                f"get_into {key!r}: the value has {data.nbytes} bytes, the buffer {out.nbytes}"
            )
        out[:] = data

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> int:
        """Remove these keys (absent ones are skipped); return how many were removed."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Remove every key starting with `prefix`; return how many were removed."""

    def close(self) -> None:  # noqa: B027 - stores without resources have nothing to release
        """Release this client's connections and memory; the data of other clients stays."""

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InMemoryStore(WeightStore):
    """A dict behind a lock: the store for one process (unit tests, single-process runs)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: Buffer) -> None:
        value = bytes(data)  # a snapshot: later writes to the caller's buffer must not leak in
        with self._lock:
            self._data[key] = value

    def get(self, key: str) -> Buffer:
        with self._lock:
            if key not in self._data:
                raise MissingKeyError(f"weight store has no key {key!r}")
            return self._data[key]

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._data

    def delete(self, keys: Iterable[str]) -> int:
        with self._lock:
            return sum(self._data.pop(k, None) is not None for k in keys)

    def delete_prefix(self, prefix: str) -> int:
        with self._lock:
            doomed = [k for k in self._data if k.startswith(prefix)]
            for k in doomed:
                del self._data[k]
            return len(doomed)
