"""The in-memory store: the reference behaviour every WeightStore backend follows."""

import pytest

from infra.weightstore import InMemoryStore, MissingKeyError, WeightStoreError


def test_put_get_replace_and_snapshot() -> None:
    store = InMemoryStore()
    data = bytearray(b"abc")
    store.put("r/v1/bucket0", data)
    data[0] = ord("z")  # the stored value is a snapshot of the caller's buffer
    assert bytes(store.get("r/v1/bucket0")) == b"abc"
    store.put("r/v1/bucket0", memoryview(b"de"))
    assert bytes(store.get("r/v1/bucket0")) == b"de"
    assert store.exists("r/v1/bucket0") and not store.exists("r/v1/bucket1")


def test_missing_key_is_a_key_error_with_the_key_in_the_message() -> None:
    with pytest.raises(KeyError) as info:
        InMemoryStore().get("r/v9/manifest")
    assert isinstance(info.value, MissingKeyError)
    assert str(info.value) == "weight store has no key 'r/v9/manifest'"


def test_delete_keys_and_prefix_count_what_they_removed() -> None:
    with InMemoryStore() as store:
        for key in ("r/v1/a", "r/v1/b", "r/v10/a", "q/v1/a"):
            store.put(key, b"x")
        assert store.delete(["r/v1/a", "nope"]) == 1
        assert store.delete_prefix("r/v1/") == 1  # not r/v10/
        assert [store.exists(k) for k in ("r/v1/b", "r/v10/a", "q/v1/a")] == [False, True, True]


def test_get_into_fills_the_callers_buffer_of_the_values_size_only() -> None:
    store = InMemoryStore()
    store.put("r/v1/bucket0", b"weights")
    out = memoryview(bytearray(7))
    store.get_into("r/v1/bucket0", out)
    assert bytes(out) == b"weights"
    with pytest.raises(WeightStoreError, match=r"'r/v1/bucket0': the value has 7 bytes, the buffer 8"):
        store.get_into("r/v1/bucket0", memoryview(bytearray(8)))
    with pytest.raises(MissingKeyError, match="r/v1/bucket1"):
        store.get_into("r/v1/bucket1", out)
