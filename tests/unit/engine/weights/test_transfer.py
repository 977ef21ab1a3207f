"""Publisher and prefetcher over an in-memory store: key layout, retention, background pull overlap."""

import threading
import time
from collections.abc import Iterable

import pytest
import torch

from engine.weights import transfer
from engine.weights.transfer import WeightPrefetcher, WeightPublisher, bucket_key, manifest_key
from infra.weightstore import Buffer, InMemoryStore, MissingKeyError


def state_dict(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(16, 8, generator=g).to(torch.bfloat16),  # 256 B
        "layer.w": torch.randn(8, 8, generator=g),  # 256 B
        "layer.b": torch.randn(8, generator=g),  # 32 B
        "steps": torch.tensor(seed),  # 8 B
    }


class ManualClock:
    """The `time` of `engine.weights.transfer` in a test: `perf_counter` moves only when the test (or a fake
    link) advances it, so what the transfer times is what the test modelled; `sleep` (its polls) is real."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    manual = ManualClock()
    monkeypatch.setattr(transfer, "time", manual)
    return manual


class RecordingStore(InMemoryStore):
    """Logs every put/delete, and can hold every get until `gate` is set (a slow link); `reading` is set once
    a get has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.reading = threading.Event()

    def put(self, key: str, data: Buffer) -> None:
        self.ops.append(("put", key))
        super().put(key, data)

    def delete(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        self.ops += [("delete", k) for k in keys]
        return super().delete(keys)

    def delete_prefix(self, prefix: str) -> int:
        self.ops.append(("delete_prefix", prefix))
        return super().delete_prefix(prefix)

    def get(self, key: str) -> Buffer:
        self.reading.set()
        self.gate.wait()
        return super().get(key)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def test_publish_clears_the_version_then_writes_the_manifest_first_and_buckets_in_order() -> None:
    store = RecordingStore()
    store.put("run/v1/bucket5", b"left by a failed attempt")
    publisher = WeightPublisher(store, "run")
    timings = publisher.publish(state_dict(1), version=1, bucket_bytes=512)
    pushed = publisher.wait()  # the writes run in the background
    assert pushed is not None and pushed["push_s"] >= 0
    # embed 0-256, layer.w 256-512 fill bucket 0; layer.b 0-32 and steps 64-72 go to bucket 1
    assert store.ops[1:] == [
        ("delete_prefix", "run/v1/"),
        ("put", "run/v1/manifest"),
        ("put", "run/v1/bucket0"),
        ("put", "run/v1/bucket1"),
        ("put", "run/latest"),  # named only once the version is complete
    ]
    assert not store.exists("run/v1/bucket5")
    assert timings["bytes"] == 512 + 72 and timings["buckets"] == 2
    assert timings["pack_s"] >= 0 and timings["last_push_s"] == 0.0  # nothing pushed before


class GatedPuts(InMemoryStore):
    """A store whose bucket writes wait for `gate` (a slow link), or raise `fail` if it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.fail: Exception | None = None

    def put(self, key: str, data: Buffer) -> None:
        if "bucket" in key:
            assert self.gate.wait(10)
            if self.fail:
                raise self.fail
        super().put(key, data)


def test_a_publish_returns_once_packed_and_pushes_while_the_trainer_changes_its_weights() -> None:
    """The trainer's path is the pack: the weights may change right after it, and what lands in the store
    (read by a pull that started before the push) is the version as it was packed. The next publish waits
    for the push before it reuses the buckets, and reports it."""
    store = GatedPuts()
    publisher = WeightPublisher(store, "run")
    weights = state_dict(1)
    packed = publisher.publish(weights, version=1, bucket_bytes=512)
    assert packed["bytes"] == 512 + 72 and packed["last_push_s"] == 0.0 and packed["push_wait_s"] >= 0
    for t in weights.values():
        t.zero_()  # the next optimiser step
    prefetcher = WeightPrefetcher(store, "run")
    prefetcher.start(1)  # polls for each bucket as it lands
    assert not store.exists(bucket_key("run", 1, 0)) and prefetcher.latest() is None  # still pushing
    store.gate.set()
    tensors, _ = prefetcher.wait(1)
    assert_same(tensors, state_dict(1))
    second = publisher.publish(state_dict(2), version=2, bucket_bytes=512)
    assert second["last_push_s"] > 0  # v1's push, which this publish waited for if it still ran
    assert publisher.wait() is not None and prefetcher.latest() == 2
    assert publisher.wait() is None  # nothing in flight
    prefetcher.close()


def test_a_failed_background_push_is_raised_by_the_next_publish_and_forget_still_clears_the_run() -> None:
    store = GatedPuts()
    publisher = WeightPublisher(store, "run")
    publisher.publish(state_dict(1), version=1, bucket_bytes=512)
    store.fail = OSError("link down")
    store.gate.set()
    with pytest.raises(OSError, match="link down"):
        publisher.publish(state_dict(2), version=2, bucket_bytes=512)
    store.fail = None
    publisher.publish(state_dict(2), version=2, bucket_bytes=512)  # a retry after the failure goes through
    assert publisher.wait() is not None
    publisher.publish(state_dict(3), version=3, bucket_bytes=512)
    assert publisher.forget() > 0  # waits for v3's push: nothing of the run is written after the delete
    assert not store.exists("run/latest") and not store.exists(manifest_key("run", 3))


def test_only_the_last_k_versions_stay_in_the_store() -> None:
    store = InMemoryStore()
    publisher = WeightPublisher(store, "run", keep_last=2)
    for v in range(1, 5):
        publisher.publish(state_dict(v), version=v, bucket_bytes=512)
    publisher.wait()
    assert [store.exists(manifest_key("run", v)) for v in range(1, 5)] == [False, False, True, True]
    assert not store.exists(bucket_key("run", 2, 0)) and store.exists(bucket_key("run", 4, 1))
    assert store.delete_prefix("run/") == 7  # v3 and v4: two buckets and a manifest each; latest


def test_latest_names_the_newest_complete_version() -> None:
    store = InMemoryStore()
    prefetcher = WeightPrefetcher(store, "run")
    assert prefetcher.latest() is None
    publisher = WeightPublisher(store, "run")
    for v in (1, 2):
        publisher.publish(state_dict(v), version=v, bucket_bytes=512)
        publisher.wait()
        assert prefetcher.latest() == v
    assert WeightPrefetcher(store, "other-run").latest() is None
    prefetcher.close()


def test_prefetched_tensors_equal_the_published_ones() -> None:
    store = InMemoryStore()
    WeightPublisher(store, "run").publish(state_dict(3), version=3, bucket_bytes=300)
    prefetcher = WeightPrefetcher(store, "run")
    prefetcher.start(3)
    tensors, timings = prefetcher.wait(3)
    assert_same(tensors, state_dict(3))
    assert timings["bytes"] == 256 + 288 + 8  # embed | layer.w, layer.b | steps
    prefetcher.close()


def _addresses(tensors: dict[str, torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()}


def four_published() -> WeightPublisher:
    """Versions 1-4 of run "run" in an in-memory store, in buckets of 300 bytes, all kept."""
    publisher = WeightPublisher(InMemoryStore(), "run", keep_last=5)
    for v in (1, 2, 3, 4):
        publisher.publish(state_dict(v), version=v, bucket_bytes=300)
    return publisher


def test_a_pull_reuses_released_buffers_and_never_those_still_held() -> None:
    publisher = four_published()
    prefetcher = WeightPrefetcher(publisher.store, "run")
    one, _ = prefetcher.wait(1)
    two, _ = prefetcher.wait(2)  # v1 is handed over and not released: v2 gets buffers of its own
    three, _ = prefetcher.wait(3)
    assert not _addresses(three) & (_addresses(one) | _addresses(two))
    assert_same(one, state_dict(1))
    prefetcher.release(3)  # v3 and the older versions are done with
    four, _ = prefetcher.wait(4)
    assert _addresses(four) <= _addresses(one) | _addresses(two) | _addresses(three)  # memory touched before
    assert_same(four, state_dict(4))
    publisher.publish(state_dict(5), version=5, bucket_bytes=1 << 20)  # another layout: one bucket
    five, _ = prefetcher.wait(5)
    assert_same(five, state_dict(5))
    assert_same(four, state_dict(4))  # v4 is held: its buffers were not written
    prefetcher.close()


def test_pulls_dropped_by_a_newer_wait_keep_at_most_keep_free_buffer_sets() -> None:
    publisher = four_published()
    prefetcher = WeightPrefetcher(publisher.store, "run")
    for v in (1, 2, 3):
        prefetcher.start(v)  # one pull at a time: v1-v3 are pulled (never handed over) before v4
    four, _ = prefetcher.wait(4)  # drops v1-v3: their three buffer sets go back to the free list
    assert len(prefetcher._free) == WeightPrefetcher.KEEP_FREE  # not three: host memory stays bounded
    assert_same(four, state_dict(4))
    prefetcher.close()


def test_pull_overlaps_with_the_callers_work(clock: ManualClock) -> None:
    store = RecordingStore()
    WeightPublisher(store, "run").publish(state_dict(2), version=2, bucket_bytes=512)
    prefetcher = WeightPrefetcher(store, "run")
    store.gate.clear()  # the link is "slow": every get waits until the caller's work is done
    prefetcher.start(2)
    assert store.reading.wait(10)  # the pull is under way, in the background
    clock.now += 0.3  # the caller serves the old version for 0.3 s meanwhile
    assert not prefetcher.done(2)
    store.gate.set()
    tensors, timings = prefetcher.wait(2)
    assert_same(tensors, state_dict(2))
    assert timings["pull_s"] == pytest.approx(0.3)  # the pull ran during the caller's work ...
    assert timings["exposed_s"] == 0.0  # ... and left nothing for the caller to wait for
    prefetcher.close()


def test_wait_without_start_pulls_in_the_foreground() -> None:
    store = InMemoryStore()
    WeightPublisher(store, "run").publish(state_dict(1), version=1, bucket_bytes=512)
    prefetcher = WeightPrefetcher(store, "run")
    tensors, timings = prefetcher.wait(1)
    assert_same(tensors, state_dict(1))
    assert timings["exposed_s"] >= timings["pull_s"]
    prefetcher.close()


def test_waiting_for_a_version_drops_older_uncollected_pulls() -> None:
    store = InMemoryStore()
    publisher = WeightPublisher(store, "run", keep_last=3)
    for v in (1, 2):
        publisher.publish(state_dict(v), version=v, bucket_bytes=512)
    prefetcher = WeightPrefetcher(store, "run")
    prefetcher.start(1)
    prefetcher.start(2)
    prefetcher.wait(2)
    assert not prefetcher.done(1) and not prefetcher.done(2)
    prefetcher.close()


def test_unpublished_version_is_a_clear_error() -> None:
    prefetcher = WeightPrefetcher(InMemoryStore(), "run", publish_timeout_s=0.05)
    prefetcher.start(9)
    with pytest.raises(MissingKeyError, match=r"weights v9 of run 'run' are not published: .* within 0\.05"):
        prefetcher.wait(9)
    prefetcher.close()


class SlowPush(RecordingStore):
    """A slow link in lock step with the reader: a key of v4 is written only once the reader looks for it
    (or after 10 s, when it never does), and its write takes 50 ms of `clock`; a read takes 1 ms. `ops` also
    logs the reads."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.sought: set[str] = set()
        self.looking = threading.Condition()

    def exists(self, key: str) -> bool:
        with self.looking:
            self.sought.add(key)
            self.looking.notify_all()
        return super().exists(key)

    def put(self, key: str, data: Buffer) -> None:
        if key.startswith("run/v4/"):
            with self.looking:
                self.looking.wait_for(lambda: key in self.sought, timeout=10)
            self.clock.now += 0.05
        super().put(key, data)

    def get(self, key: str) -> Buffer:
        self.ops.append(("get", key))
        self.clock.now += 0.001
        return super().get(key)


def test_a_pull_started_before_the_publish_reads_each_bucket_as_it_lands(clock: ManualClock) -> None:
    store = SlowPush(clock)
    prefetcher = WeightPrefetcher(store, "run")
    prefetcher.start(4)  # nothing published yet
    WeightPublisher(store, "run").publish(state_dict(4), version=4, bucket_bytes=512)
    tensors, timings = prefetcher.wait(4)
    assert_same(tensors, state_dict(4))
    # bucket 0 was read before bucket 1 was written: the pull overlapped the push
    assert store.ops.index(("get", "run/v4/bucket0")) < store.ops.index(("put", "run/v4/bucket1"))
    assert timings["publish_wait_s"] == pytest.approx(0.15)  # the manifest's and both buckets' writes
    assert timings["pull_s"] == pytest.approx(0.003)  # its own three reads: the link was the wait
    prefetcher.close()


def test_keep_last_must_be_positive() -> None:
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        WeightPublisher(InMemoryStore(), "run", keep_last=0)
