"""Bucketing a state dict: layout by hand, exact round trip over every dtype, JSON manifest."""

import json

import numpy as np
import pytest
import torch

from engine.weights.buckets import Manifest, TensorEntry, make_buckets, unpack


def mixed_state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(8, 4, generator=g),  # 128 B
        "b": torch.randn(3, generator=g).to(torch.bfloat16),  # 6 B
        "step": torch.tensor(7, dtype=torch.int64),  # scalar, 8 B
        "empty": torch.empty(0, 3, dtype=torch.float16),  # 0 B
        "big": torch.randn(40, generator=g, dtype=torch.float64),  # 320 B > bucket
        "q": torch.tensor([[-3, 0, 5], [127, -128, 1]], dtype=torch.int8),  # 6 B
        "mask": torch.tensor([True, False, True, True, False]),  # 5 B
        "wt": torch.randn(2, 3, generator=g).t(),  # non-contiguous view, 24 B
    }


def test_layout_matches_hand_computed_offsets() -> None:
    manifest, buckets = make_buckets(mixed_state_dict(), bucket_bytes=256, version=3)
    # bucket 0: w@0 (128), b@128 (->134), step@192 (->200), empty; big alone (320 > 256);
    # bucket 2: q@0 (6), mask@64 (->69), wt@128 (->152). Offsets are 64-byte aligned.
    assert [(e.name, e.bucket, e.offset, e.nbytes) for e in manifest.tensors] == [
        ("w", 0, 0, 128),
        ("b", 0, 128, 6),
        ("step", 0, 192, 8),
        ("empty", 0, 0, 0),
        ("big", 1, 0, 320),
        ("q", 2, 0, 6),
        ("mask", 2, 64, 5),
        ("wt", 2, 128, 24),
    ]
    assert manifest.bucket_sizes == [200, 320, 152]
    assert [b.nbytes for b in buckets] == [200, 320, 152]
    assert manifest.version == 3 and manifest.num_buckets == 3 and manifest.total_bytes == 672
    assert manifest.tensors[1].dtype == "bfloat16" and manifest.tensors[2].shape == []


@pytest.mark.parametrize("as_bytes", [False, True], ids=["writable", "read-only"])
def test_round_trip_is_exact_for_every_dtype_and_shape(as_bytes: bool) -> None:
    sd = mixed_state_dict()
    manifest, buckets = make_buckets(sd, bucket_bytes=256, version=0)
    out = unpack(manifest, [bytes(b) for b in buckets] if as_bytes else buckets)
    assert list(out) == list(sd)
    for name, tensor in sd.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape, name
        assert torch.equal(out[name], tensor), name


def test_unpack_views_writable_buckets_without_copying() -> None:
    manifest, buckets = make_buckets(mixed_state_dict(), bucket_bytes=256, version=0)
    out = unpack(manifest, buckets)
    base = np.frombuffer(buckets[2], dtype=np.uint8).ctypes.data
    assert out["mask"].data_ptr() == base + 64
    buckets[2][0] = 7  # q[0, 0] lives at byte 0 of bucket 2
    assert out["q"][0, 0].item() == 7


def test_same_input_gives_same_manifest_and_bytes() -> None:
    sd = mixed_state_dict()
    m1, b1 = make_buckets(sd, bucket_bytes=256, version=1)
    m2, b2 = make_buckets(sd, bucket_bytes=256, version=1)
    assert m1 == m2 and [bytes(x) for x in b1] == [bytes(x) for x in b2]


def test_one_bucket_when_everything_fits() -> None:
    manifest, _ = make_buckets(mixed_state_dict(), bucket_bytes=1 << 20, version=0)
    # w 0-128, b 128-134, step 192-200, big 256-576, q 576-582, mask 640-645, wt 704-728
    assert manifest.bucket_sizes == [728]
    assert [e.offset for e in manifest.tensors] == [0, 128, 192, 0, 256, 576, 640, 704]


def test_manifest_json_round_trip() -> None:
    manifest, _ = make_buckets(mixed_state_dict(), bucket_bytes=256, version=12)
    text = manifest.to_json()
    raw = json.loads(text)
    assert raw["version"] == 12 and raw["bucket_sizes"] == [200, 320, 152]
    assert raw["tensors"][4] == {
        "name": "big",
        "shape": [40],
        "dtype": "float64",
        "bucket": 1,
        "offset": 0,
        "nbytes": 320,
    }
    assert Manifest.from_json(text) == manifest
    assert Manifest.from_json(memoryview(text.encode())) == manifest


def test_unpack_rejects_buckets_that_do_not_match_the_manifest() -> None:
    manifest, buckets = make_buckets(mixed_state_dict(), bucket_bytes=256, version=5)
    with pytest.raises(ValueError, match="v5 has 3 buckets, got 2"):
        unpack(manifest, buckets[:2])
    with pytest.raises(ValueError, match="bucket 1 of v5 has 319 bytes, manifest says 320"):
        unpack(manifest, [buckets[0], bytes(319), buckets[2]])


def test_unknown_dtype_and_bad_bucket_size_are_clear_errors() -> None:
    manifest = Manifest(0, [4], [TensorEntry("x", [1], "float128", 0, 0, 4)])
    with pytest.raises(ValueError, match="unknown torch dtype 'float128'"):
        unpack(manifest, [bytes(4)])
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        make_buckets({}, bucket_bytes=0, version=0)


def test_empty_state_dict_has_no_buckets() -> None:
    manifest, buckets = make_buckets({}, bucket_bytes=64, version=0)
    assert manifest.bucket_sizes == [] and buckets == [] and unpack(manifest, []) == {}


def test_only_empty_tensors_give_one_zero_byte_bucket() -> None:
    sd = {"e": torch.empty(0, 2, dtype=torch.bfloat16)}
    manifest, buckets = make_buckets(sd, bucket_bytes=64, version=0)
    assert manifest.bucket_sizes == [0] and buckets[0].nbytes == 0
    out = unpack(manifest, [b""])
    assert out["e"].shape == (0, 2) and out["e"].dtype == torch.bfloat16


def test_make_buckets_writes_over_the_buffers_it_is_given_for_the_same_layout_only() -> None:
    a = {"w": torch.arange(12, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    b = {k: t * 2 for k, t in a.items()}
    _, first = make_buckets(a, 32, version=1)
    kept = [bytes(m) for m in first]
    manifest, second = make_buckets(b, 32, version=2, reuse=first)
    assert all(np_address(m) == np_address(f) for m, f in zip(second, first, strict=True))
    assert [bytes(m) for m in second] == [bytes(m) for m in make_buckets(b, 32, version=2)[1]]
    assert [bytes(m) for m in second] != kept
    other, third = make_buckets(b, 1 << 10, version=3, reuse=second)  # one bucket: a new buffer
    assert other.num_buckets == 1 and all(np_address(t) != np_address(s) for t in third for s in second)
    assert unpack(manifest, second)["w"].equal(b["w"])


def np_address(m: memoryview) -> int:
    return int(np.frombuffer(m, dtype=np.uint8).ctypes.data)
