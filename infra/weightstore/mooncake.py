"""`WeightStore` over a Mooncake distributed store (mooncake-transfer-engine[-non-cuda] wheel).

Every value goes through the zero-copy path: the caller's buffer is registered with the transfer engine
and written with `upsert_from` / read with `get_into`. The plain `put`/`get` calls stage through the
client's `local_buffer_size` and fail for values larger than it.

Things to know (measured on mooncake 0.3.13):
- A value lives in the segment of the client that wrote it (`segment_bytes` of memory it contributes;
  asked for with `preferred_segment`, else the master may place it in any client's segment, and a
  reader's lost node would take part of a version with it), so the writer must stay alive while readers
  need the value, and its segment must hold every value kept at once. A full store fails the put with
  NO_AVAILABLE_HANDLE -> `StoreFullError`.
- Values are hard-pinned, so the master never evicts a weight bucket to make room for another.
- A read holds a lease (master flag `default_kv_lease_ttl`) that must outlast the slowest read, and
  blocks a plain remove; `delete` forces removal, so only delete versions nobody reads anymore.
- `MC_TCP_BIND_ADDRESS` picks the address a client advertises to peers (its node's address here).
- The transfer engine refuses to register bytes that overlap a range it holds (INVALID_PARAMS), and two
  threads of one client can hand it the same bytes: `_Registrations` counts a range held twice.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

from infra.local_ray import node_address
from infra.weightstore.base import Buffer, MissingKeyError, StoreFullError, WeightStore, WeightStoreError

# Names of the master's error codes (mooncake-store/include/types.h) that a client can see.
_ERRORS = {
    -1: "INTERNAL_ERROR",
    -10: "BUFFER_OVERFLOW",
    -101: "SEGMENT_NOT_FOUND",
    -103: "CLIENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE (store full)",
    -400: "INVALID_KEY",
    -500: "WRITE_FAIL",
    -600: "INVALID_PARAMS",
    -700: "INVALID_WRITE",
    -701: "INVALID_READ",
    -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED (read slower than the master's default_kv_lease_ttl)",
    -710: "REPLICA_NOT_FOUND",
    -712: "REPLICA_IS_GONE",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL (master unreachable?)",
    -1010: "UNAVAILABLE_IN_CURRENT_STATUS",
}
_NOT_FOUND, _FULL = -704, -200
MIN_SEGMENT_BYTES = 16 << 20  # the client refuses a smaller segment (setup fails with INVALID_PARAMS)
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}")


def _check(code: int, op: str, key: str) -> int:
    """Return a non-negative result; turn a negative Mooncake code into the matching exception."""
    if code >= 0:
        return code
    msg = f"mooncake {op} {key!r} failed: {code} {_ERRORS.get(code, 'UNKNOWN')}"
    if code == _NOT_FOUND:
        raise MissingKeyError(msg)
    if code == _FULL:
        raise StoreFullError(msg + "; delete old versions or raise the writer's segment_bytes")
    raise WeightStoreError(msg)


def _as_array(data: Buffer) -> np.ndarray:
    """A uint8 view of the caller's bytes (no copy), so the engine can read them in place."""
    arr = np.frombuffer(data, dtype=np.uint8)
    if arr.size == 0:
        raise ValueError("mooncake cannot store an empty value")
    return arr


class _Registrations:
    """The byte ranges a client has registered with its transfer engine, shared by the client's threads.

    The engine refuses a range that overlaps one it holds (INVALID_PARAMS), and two threads can hand it the
    same bytes at once: CPython shares one-byte `bytes` objects, so a publisher's `latest` = b"1" and
    another run's written at the same moment are one address. A range equal to a held one is counted and
    registered once; one that overlaps a different held range waits until that one is released."""

    def __init__(self, store: MooncakeDistributedStore) -> None:
        self._store = store
        self._held: dict[tuple[int, int], int] = {}  # (address, length) -> how many calls use it
        self._released = threading.Condition()

    def _clashes(self, span: tuple[int, int]) -> bool:
        start, end = span[0], span[0] + span[1]
        return any(s != span and s[0] < end and start < s[0] + s[1] for s in self._held)

    @contextlib.contextmanager
    def hold(self, arr: np.ndarray, op: str, key: str) -> Iterator[int]:
        """Register `arr`'s bytes for the block (if no other call holds them already); yield its address."""
        span = (int(arr.ctypes.data), arr.nbytes)
        with self._released:
            self._released.wait_for(lambda: not self._clashes(span))
            if span not in self._held:
                _check(self._store.register_buffer(*span), f"{op} (register buffer)", key)
            self._held[span] = self._held.get(span, 0) + 1
        try:
            yield span[0]
        finally:
            with self._released:
                self._held[span] -= 1
                if not self._held[span]:
                    del self._held[span]
                    self._store.unregister_buffer(span[0])
                    self._released.notify_all()


@contextlib.contextmanager
def _stderr_to(path: Path | None) -> Iterator[None]:
    """Point file descriptor 2 (what C++ code writes to) at `path` for the block; None leaves it alone."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class MooncakeStore(WeightStore):
    """One Mooncake client: contributes `segment_bytes` to the shared pool and reads/writes values."""

    def __init__(
        self,
        master_addr: str,
        metadata_url: str,
        *,
        local_hostname: str | None = None,
        segment_bytes: int = 1 << 30,
        buffer_bytes: int = 16 << 20,
        protocol: str = "tcp",
        device: str = "",
        log_dir: str | None = None,
    ) -> None:
        """`local_hostname`: the address peers reach this client's transfer engine at (default: this node's
        address as Ray knows it, 127.0.0.1 on a single-machine Ray or outside Ray; also what it advertises
        unless `MC_TCP_BIND_ADDRESS` says otherwise). `log_dir`: the client's start-up log (glog writes a
        dozen INFO lines to stderr before its logging is initialised, whatever GLOG_minloglevel says) goes
        to `log_dir/client-<pid>.log`."""
        local_hostname = local_hostname or node_address()
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", local_hostname)
        if segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be >= {MIN_SEGMENT_BYTES} (16 MiB), got {segment_bytes}")
        self._store = MooncakeDistributedStore()
        with _stderr_to(Path(log_dir) / f"client-{os.getpid()}.log" if log_dir else None):
            rc = self._store.setup(
                local_hostname, metadata_url, segment_bytes, buffer_bytes, protocol, device, master_addr
            )
        if rc != 0:
            raise WeightStoreError(
                f"mooncake client setup failed ({rc}): master {master_addr}, metadata {metadata_url}, "
                f"protocol {protocol!r}; is the master running?"
            )
        self._config = ReplicateConfig()
        self._config.with_hard_pin = True
        # what this client writes lives in its own segment: a reader's node that is lost takes none of it
        self._config.preferred_segment = self._store.get_hostname()
        self._registrations = _Registrations(self._store)
        self._closed = False

    def put(self, key: str, data: Buffer) -> None:
        arr = _as_array(data)
        with self._registrations.hold(arr, "put", key) as ptr:
            _check(self._store.upsert_from(key, ptr, arr.nbytes, self._config), "put", key)

    def get(self, key: str) -> Buffer:
        out = np.empty(_check(self._store.get_size(key), "get", key), dtype=np.uint8)
        self._read(key, out, "get")
        return out.data

    def get_into(self, key: str, out: memoryview) -> None:
        arr = np.frombuffer(out, dtype=np.uint8)  # the caller's bytes, written in place by the engine
        size = _check(self._store.get_size(key), "get_into", key)
        if size != arr.nbytes:
            raise WeightStoreError(
                f"mooncake get_into {key!r}: the value has {size} bytes, the buffer {arr.nbytes}"
            )
        self._read(key, arr, "get_into")

    def _read(self, key: str, arr: np.ndarray, op: str) -> None:
        """Read `key`'s value, of `arr.nbytes` bytes, into `arr` through the zero-copy path."""
        with self._registrations.hold(arr, op, key) as ptr:
            got = _check(self._store.get_into(key, ptr, arr.nbytes), op, key)
        if got != arr.nbytes:
            raise WeightStoreError(
                f"mooncake {op} {key!r}: read {got} bytes, expected {arr.nbytes} (overwritten?)"
            )

    def exists(self, key: str) -> bool:
        return bool(_check(self._store.is_exist(key), "exists", key))

    def delete(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        codes = self._store.batch_remove(keys, True)
        for key, code in zip(keys, codes, strict=True):
            if code != _NOT_FOUND:
                _check(code, "delete", key)
        return sum(code == 0 for code in codes)

    def delete_prefix(self, prefix: str) -> int:
        pattern = "^" + "".join("\\" + c if c in _REGEX_SPECIAL else c for c in prefix)
        return _check(self._store.remove_by_regex(pattern, True), "delete_prefix", prefix)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._store.close()
