"""Mooncake store on a local master: a real model's weights published and prefetched, store semantics."""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.weights.transfer import WeightPrefetcher, WeightPublisher, manifest_key
from infra.weightstore import MissingKeyError, StoreFullError, WeightStoreError
from infra.weightstore.factory import open_store, release_store
from infra.weightstore.mooncake import MooncakeStore
from infra.weightstore.mooncake_master import MooncakeMaster

MiB = 1 << 20


@pytest.fixture
def master(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MooncakeMaster]:
    """A master on 127.0.0.1; afterwards none of its processes may be left."""
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # clients advertise loopback to each other
    with MooncakeMaster(log_dir=tmp_path / "mooncake") as m:
        pids = m.pids
        yield m
    assert pids and not any(psutil.pid_exists(pid) for pid in pids)


def client(master: MooncakeMaster, segment_bytes: int = 64 * MiB) -> MooncakeStore:
    return MooncakeStore(master.master_addr, master.metadata_url, segment_bytes=segment_bytes)


def tiny_qwen2_state_dict(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    sd = model.state_dict()
    sd["model.norm.weight"] = sd["model.norm.weight"].float()  # a mixed-dtype state dict, as in training
    return sd


def test_real_state_dict_round_trip_and_retention(master: MooncakeMaster) -> None:
    trainer, worker = client(master), client(master)
    publisher = WeightPublisher(trainer, "qwen", keep_last=2)
    prefetcher = WeightPrefetcher(worker, "qwen")
    for version in (1, 2, 3):
        sd = tiny_qwen2_state_dict(seed=version)
        pushed = publisher.publish(sd, version=version, bucket_bytes=64 * 1024)
        prefetcher.start(version)
        tensors, timings = prefetcher.wait(version)
        assert pushed["buckets"] >= 4 and timings["bytes"] == pushed["bytes"]
        assert list(tensors) == list(sd)
        for name, tensor in sd.items():
            assert tensors[name].dtype == tensor.dtype and torch.equal(tensors[name], tensor), name
    publisher.wait()  # v3's push ends by removing v1 (keep_last), after the buckets the pull read
    assert [worker.exists(manifest_key("qwen", v)) for v in (1, 2, 3)] == [False, True, True]
    prefetcher.close()
    worker.close()
    trainer.close()


def test_store_semantics_and_errors(master: MooncakeMaster) -> None:
    with pytest.raises(ValueError, match="segment_bytes must be >= 16777216"):
        client(master, segment_bytes=8 * MiB)
    store = client(master, segment_bytes=16 * MiB)
    store.put("a/v1/x", b"first")
    store.put("a/v1/x", bytearray(b"second!"))  # replaces, unlike Mooncake's own put
    assert bytes(store.get("a/v1/x")) == b"second!"
    with pytest.raises(MissingKeyError, match=r"'a/v2/x' failed: -704 OBJECT_NOT_FOUND"):
        store.get("a/v2/x")
    with pytest.raises(ValueError, match="cannot store an empty value"):
        store.put("a/v1/empty", b"")
    store.put("a.b-c/1", b"1")
    store.put("a.bxc/1", b"2")  # "." and "-" in a prefix are literal, not regex syntax
    assert store.delete_prefix("a.b-c/") == 1 and store.exists("a.bxc/1")
    assert store.delete(["a/v1/x", "absent"]) == 1 and not store.exists("a/v1/x")

    store.put("big/0", bytes(10 * MiB))
    with pytest.raises(StoreFullError, match="-200"):
        store.put("big/1", bytes(10 * MiB))
    assert store.exists("big/0")  # pinned: a failed put evicts nothing
    store.close()


def test_get_into_reads_into_the_callers_buffer_across_processes(master: MooncakeMaster) -> None:
    writer, reader = client(master), client(master)
    out = memoryview(bytearray(3 * MiB))
    for fill in (1, 2):  # the same buffer serves both reads
        writer.put("r/v1/bucket0", bytes([fill]) * (3 * MiB))
        reader.get_into("r/v1/bucket0", out)
        assert out[0] == out[-1] == fill and bytes(out) == bytes([fill]) * (3 * MiB)
    with pytest.raises(WeightStoreError, match=r"'r/v1/bucket0': the value has 3145728 bytes, the buffer 16"):
        reader.get_into("r/v1/bucket0", memoryview(bytearray(16)))
    with pytest.raises(MissingKeyError, match="r/v2/bucket0"):
        reader.get_into("r/v2/bucket0", out)
    reader.close()
    writer.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_master_listens_on_its_host_only_serves_clients_there_and_stops(tmp_path: Path, host: str) -> None:
    """127.0.0.2 stands for a machine's private address (`network.host`): another address of loopback, so
    the test stays on loopback and still tells the configured host from the default."""
    with MooncakeMaster(host=host, log_dir=tmp_path) as m:
        pids = m.pids
        listening = [
            c.laddr.ip
            for pid in pids
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert m.master_addr.startswith(f"{host}:") and m.metadata_url.startswith(f"http://{host}:")
        store = client(m)
        store.put("k", b"v" * 1024)
        assert bytes(store.get("k")) == b"v" * 1024
        store.close()
    assert len(pids) == 2 and len(listening) >= 3  # rpc, metrics, metadata
    assert set(listening) == {host}
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_values_live_in_the_writers_segment_so_a_lost_reader_takes_none(master: MooncakeMaster) -> None:
    """A reader contributes a far larger segment than the writer; the writer's values are still placed in
    the writer's own, so they outlive the reader (a generation node lost mid-run)."""
    writer, reader = client(master, segment_bytes=32 * MiB), client(master, segment_bytes=256 * MiB)
    for i in range(16):
        writer.put(f"w/v1/{i}", bytes([i]) * MiB)
    assert bytes(reader.get("w/v1/3"))[:2] == b"\x03\x03"
    reader.close()  # its segment is unmounted: anything placed there is gone
    assert all(bytes(writer.get(f"w/v1/{i}")) == bytes([i]) * MiB for i in range(16))
    writer.close()


def test_threads_writing_and_reading_the_same_bytes_at_once(master: MooncakeMaster) -> None:
    """The transfer engine refuses a registered range that overlaps one it holds; a publisher's thread and
    the caller's can hand it the same bytes at once (CPython shares one-byte `bytes`, so two runs' `latest`
    = b"1" are one address, as in the last test): every put and read still goes through, once each."""
    store = client(master, segment_bytes=16 * MiB)
    shared, half = bytes(range(256)) * 1024, 128 * 1024
    reads = [memoryview(bytearray(len(shared))) for _ in range(8)]

    def work(i: int) -> None:  # the same `shared` and b"1" in every thread; reads into overlapping buffers
        for n in range(40):
            store.put(f"t{i}/latest/{n}", b"1")
            store.put(f"t{i}/all", shared)
            store.put(f"t{i}/half", shared[:half])
            store.get_into(f"t{i}/all", reads[i])
            store.get_into(f"t{i}/half", reads[(i + 1) % 8][:half])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert all(bytes(store.get(f"t{i}/latest/{n}")) == b"1" for i in range(8) for n in range(40))
    assert all(bytes(r) == shared for r in reads)
    store.close()


def test_a_released_client_serves_the_next_run_on_the_same_master_and_only_there(
    master: MooncakeMaster, tmp_path: Path
) -> None:
    """A process serving runs in sequence (engine/core/warm.py) keeps its client open for the next run on
    the same master, after the last run's publisher removed its keys; a spec for another segment size (or
    another master) gets a new client, and the kept one is closed (what it held goes with its segment)."""
    spec = {"kind": "mooncake", "master_addr": master.master_addr, "metadata_url": master.metadata_url,
            "segment_bytes": 32 * MiB, "log_dir": str(tmp_path / "a")}  # fmt: skip
    first = open_store(spec)
    publisher = WeightPublisher(first, "run-1")
    publisher.publish(tiny_qwen2_state_dict(seed=1), version=1, bucket_bytes=64 * 1024)
    first.put("run-10/latest", b"1")  # another run whose id starts with this one's
    assert publisher.forget() >= 3 and not first.exists(manifest_key("run-1", 1))
    assert first.exists("run-10/latest")
    release_store(spec, first)

    again = open_store(spec | {"log_dir": str(tmp_path / "b")})  # the log's place does not matter
    assert again is first and again.exists("run-10/latest")
    release_store(spec, again)
    other = open_store(spec | {"segment_bytes": 16 * MiB})
    assert other is not first and not other.exists("run-10/latest")  # closed: its segment's data went too
    other.close()
