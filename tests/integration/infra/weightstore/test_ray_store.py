"""The Ray object store backend: values written by one actor are read by another, and outlive the writer."""

from collections.abc import Iterator

import pytest
import ray

from infra.local_ray import init_local_ray
from infra.weightstore import MissingKeyError
from infra.weightstore.ray_store import RayObjectStore

TABLE = "weightstore-test"


@ray.remote(num_cpus=0)
class Peer:
    """A process of the cluster (a trainer or a generation worker) with its own store client."""

    def __init__(self) -> None:
        self.store = RayObjectStore(name=TABLE)

    def put(self, key: str, data: bytes) -> None:
        self.store.put(key, data)

    def get(self, key: str) -> bytes:
        return bytes(self.store.get(key))


@pytest.fixture(scope="module")
def store() -> Iterator[RayObjectStore]:
    init_local_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
    client = RayObjectStore(name=TABLE)
    yield client
    client.destroy()
    ray.shutdown()


def test_round_trip_across_two_actors_survives_the_writer(store: RayObjectStore) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: travels through shared memory, not inline
    writer, reader = Peer.remote(), Peer.remote()
    ray.get(writer.put.remote("run/v1/bucket0", payload))
    ray.get(writer.put.remote("run/v1/manifest", b'{"version":1}'))
    assert ray.get(reader.get.remote("run/v1/bucket0")) == payload
    ray.kill(writer)  # the table actor owns the objects, so the writer's death loses nothing
    assert ray.get(reader.get.remote("run/v1/manifest")) == b'{"version":1}'
    view = store.get("run/v1/bucket0")
    assert view.readonly and view.nbytes == len(payload) and bytes(view[:3]) == b"\x00\x01\x02"


def test_replace_delete_and_missing_keys(store: RayObjectStore) -> None:
    for key in ("r/v1/bucket0", "r/v1/manifest", "r/v10/manifest"):
        store.put(key, b"old")
    store.put("r/v1/bucket0", memoryview(b"new"))
    assert bytes(store.get("r/v1/bucket0")) == b"new"
    assert store.delete(["r/v1/manifest", "absent"]) == 1
    assert store.delete_prefix("r/v1/") == 1
    assert not store.exists("r/v1/bucket0") and store.exists("r/v10/manifest")
    with pytest.raises(MissingKeyError, match="no key 'r/v1/bucket0'"):
        store.get("r/v1/bucket0")


def test_a_second_client_sees_the_same_table(store: RayObjectStore) -> None:
    store.put("shared/key", b"\x00" * 10)
    other = RayObjectStore(name=TABLE)
    assert bytes(other.get("shared/key")) == b"\x00" * 10
    separate = RayObjectStore(name="another-table")
    assert not separate.exists("shared/key")
    separate.destroy()
