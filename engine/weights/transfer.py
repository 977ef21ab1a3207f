"""Publish weight versions to a store (trainer side) and prefetch them in the background (worker side).

Paper §6.3: the trainer splits its weights into buckets and pushes them with a manifest; each inference
worker pulls the next version while it still serves the current one, so when `update` comes the
tensors are already local and only the in-place load is on the critical path. `exposed_s` measures
how much of the pull the caller still waited for.

The transfer is streamed bucket by bucket: the manifest (names, shapes, offsets, bucket sizes — all
known before any byte moves) is written first, then the buckets in order, and a prefetch may start
before the publish does: it waits for the manifest, then reads each bucket as soon as it lands, so the
pull overlaps the push instead of following it. A version is complete once all the buckets its
manifest lists are there.

Store layout per run: `{run}/v{version}/manifest` and `{run}/v{version}/bucket{i}`, and `{run}/latest`
naming the newest complete version (what a restarted worker loads before it serves). Zero-byte buckets
are not stored. A retried publish of a version first removes what an earlier attempt left of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.weights.buckets import Manifest, make_buckets, unpack
from infra.weightstore.base import MissingKeyError, WeightStore


def version_prefix(run_id: str, version: int) -> str:
    return f"{run_id}/v{version}/"


def bucket_key(run_id: str, version: int, index: int) -> str:
    return f"{version_prefix(run_id, version)}bucket{index}"


def manifest_key(run_id: str, version: int) -> str:
    return f"{version_prefix(run_id, version)}manifest"


def latest_key(run_id: str) -> str:
    return f"{run_id}/latest"


class WeightPublisher:
    """Trainer side: bucketise a state dict, push it, keep only the newest `keep_last` versions.

    `publish` returns once the state dict is packed (copied into the publisher's buckets: the trainer may
    change its weights from then on) and pushes the buckets on a background thread, so the store writes
    overlap whatever the trainer does next; the prefetching workers read each bucket as it lands. One push
    runs at a time: the next publish, `wait` and `forget` first wait for it (its buckets are the ones the
    next pack reuses), and an error it raised is raised there."""

    def __init__(self, store: WeightStore, run_id: str, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.store, self.run_id, self.keep_last = store, run_id, keep_last
        self._versions: set[int] = set()  # versions this publisher has in the store
        self._packed: list[memoryview] = []  # the last publish's buckets: every store copies what it puts
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-push")
        self._pushing: Future[dict[str, float]] | None = None

    def publish(
        self, state_dict: Mapping[str, torch.Tensor], version: int, bucket_bytes: int
    ) -> dict[str, float]:
        """Pack `version` and start its push. Returns {pack_s, push_wait_s, last_push_s, bytes, buckets}:
        `push_wait_s` is the wait for the previous push to end (on the caller's path, as the pack is),
        `last_push_s` how long that push wrote (0 where none ran)."""
        t0 = time.perf_counter()
        last = self.wait()
        t1 = time.perf_counter()
        manifest, buckets = make_buckets(state_dict, bucket_bytes, version, reuse=self._packed)
        self._packed = buckets
        self._pushing = self._pool.submit(self._push, manifest, buckets, version)
        return {
            "pack_s": time.perf_counter() - t1,
            "push_wait_s": t1 - t0,
            "last_push_s": last["push_s"] if last else 0.0,
            "bytes": float(manifest.total_bytes),
            "buckets": float(manifest.num_buckets),
        }

    def wait(self) -> dict[str, float] | None:
        """Wait for the push in flight, if any; its {push_s, pushed_at} (`perf_counter` at its end), or None
        where none was started since the last wait."""
        pushing, self._pushing = self._pushing, None
        return None if pushing is None else pushing.result()

    def _push(self, manifest: Manifest, buckets: list[memoryview], version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        self.store.delete_prefix(version_prefix(self.run_id, version))  # a retried publish starts clean
        self.store.put(manifest_key(self.run_id, version), manifest.to_json().encode())
        for i, data in enumerate(buckets):
            if data.nbytes:
                self.store.put(bucket_key(self.run_id, version, i), data)
        self.store.put(latest_key(self.run_id), str(version).encode())
        t1 = time.perf_counter()
        self._versions.add(version)
        for old in sorted(v for v in self._versions if v <= version - self.keep_last):
            self.store.delete_prefix(version_prefix(self.run_id, old))
            self._versions.discard(old)
        return {"push_s": t1 - t0, "pushed_at": t1}

    def forget(self) -> int:
        """Remove every key of this run from the store (its versions and `latest`): what a store that
        serves the next run must not keep. Returns how many keys were removed."""
        try:
            self.wait()  # a push in flight would write its keys after the delete; one that failed raises
        finally:
            self._versions.clear()
            removed = self.store.delete_prefix(f"{self.run_id}/")
        return removed


class WeightPrefetcher:
    """Worker side: `start(v)` pulls version v on a background thread; `wait(v)` hands over the tensors.

    One pull runs at a time (they would only compete for the same link). `wait(v)` also drops any
    older version that was started but never collected. A pull may start before its version is
    published: it waits up to `publish_timeout_s` for the manifest and for each bucket to land.

    The tensors `wait(v)` returns are views of receive buffers that later pulls reuse once the caller
    says it is done with them, `release(v)` (after loading them into its engine): reading every version
    into fresh memory made each pull first-touch 0.5 GB, seconds on a VM that returns freed pages to
    its host (a pull took 7-15 s there, 1 s into reused buffers).
    """

    KEEP_FREE = 1  # released buffer sets kept: the next pull's (host memory as large as the weights)

    POLL_S = (0.001, 0.02)  # first and longest pause between looks for a key not written yet

    def __init__(self, store: WeightStore, run_id: str, publish_timeout_s: float = 120.0) -> None:
        self.store, self.run_id = store, run_id
        self.publish_timeout_s = publish_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-prefetch")
        self._pulls: dict[int, Future[tuple[dict[str, torch.Tensor], dict[str, float]]]] = {}
        self._lock = threading.Lock()
        self._held: dict[int, list[memoryview]] = {}  # version -> the buffers its tensors view
        self._free: list[list[memoryview]] = []  # released buffer sets, the newest last

    def start(self, version: int) -> None:
        """Begin pulling `version` in the background (no-op if already started)."""
        with self._lock:
            if version not in self._pulls:
                self._pulls[version] = self._pool.submit(self._pull, version)

    def done(self, version: int) -> bool:
        """True once `version` has been pulled (or its pull failed): `wait` will not block."""
        with self._lock:
            pull = self._pulls.get(version)
        return pull is not None and pull.done()

    def latest(self) -> int | None:
        """The newest complete version published for the run, None before the first publish."""
        try:
            return int(bytes(self.store.get(latest_key(self.run_id))))
        except MissingKeyError:
            return None

    def wait(
        self, version: int, timeout: float | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The tensors of `version` and timings {pull_s, exposed_s, bytes}; starts the pull if needed.

        `pull_s` is the whole background pull, `exposed_s` the part of it this call waited for.
        """
        t0 = time.perf_counter()
        self.start(version)
        with self._lock:
            pull = self._pulls[version]
        try:
            tensors, timings = pull.result(timeout)
        finally:
            exposed = time.perf_counter() - t0
            if pull.done():
                with self._lock:
                    for v in [v for v in self._pulls if v <= version]:
                        del self._pulls[v]
                        if v < version and v in self._held:  # pulled, never handed over
                            self._give_back(self._held.pop(v))
        return tensors, {**timings, "exposed_s": exposed}

    def release(self, version: int) -> None:
        """The caller is done with the tensors of `version` and of every older version: their buffers
        serve the next pulls."""
        with self._lock:
            for v in sorted(v for v in self._held if v <= version):
                self._give_back(self._held.pop(v))

    def _give_back(self, buffers: list[memoryview]) -> None:
        """Return a buffer set to the free list, keeping the newest KEEP_FREE (call with the lock held)."""
        self._free.append(buffers)
        del self._free[: -self.KEEP_FREE]

    def _buffers(self, sizes: list[int]) -> list[memoryview]:
        """Receive buffers of these bucket sizes: a released set of the same layout, else new ones."""
        with self._lock:
            for i, bufs in enumerate(self._free):
                if [b.nbytes for b in bufs] == sizes:
                    return self._free.pop(i)
        return [memoryview(bytearray(size)) for size in sizes]

    def _pull(self, version: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Read the manifest, then every bucket as it lands. `pull_s` counts the reading, not the waits
        for the publisher (`publish_wait_s`): with the push it is the transfer's cost."""
        t0 = time.perf_counter()
        deadline = t0 + self.publish_timeout_s
        waited = self._await_key(manifest_key(self.run_id, version), version, deadline)
        manifest = Manifest.from_json(self.store.get(manifest_key(self.run_id, version)))
        if manifest.version != version:
            raise ValueError(f"manifest under v{version} of run {self.run_id!r} says v{manifest.version}")
        buckets = self._buffers(manifest.bucket_sizes)
        for i, size in enumerate(manifest.bucket_sizes):
            if size:
                key = bucket_key(self.run_id, version, i)
                waited += self._await_key(key, version, deadline)
                self.store.get_into(key, buckets[i])
        tensors = unpack(manifest, buckets)
        with self._lock:
            if version in self._pulls:
                self._held[version] = buckets
            else:  # dropped meanwhile by a `wait` for a newer version: nobody will take these tensors
                self._give_back(buckets)
        total = time.perf_counter() - t0
        return tensors, {
            "pull_s": total - waited,
            "publish_wait_s": waited,
            "bytes": float(manifest.total_bytes),
        }

    def _await_key(self, key: str, version: int, deadline: float) -> float:
        """Wait until `key` is in the store; return the seconds waited (MissingKeyError at the deadline)."""
        t0 = time.perf_counter()
        pause = self.POLL_S[0]
        while not self.store.exists(key):
            if time.perf_counter() >= deadline:
                raise MissingKeyError(
                    f"weights v{version} of run {self.run_id!r} are not published: no {key!r} "
                    f"within {self.publish_timeout_s:g} s"
                )
            time.sleep(pause)
            pause = min(2 * pause, self.POLL_S[1])
        return time.perf_counter() - t0

    def close(self) -> None:
        """Stop accepting pulls; a running pull finishes in the background, queued ones are dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)
