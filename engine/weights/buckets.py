"""Pack a state dict into a few large byte buckets plus a JSON manifest, and unpack it exactly.

Why buckets: a weight store moves a handful of ~1 GB objects far faster than thousands of small tensors
(one round trip and one lease per object), and a fixed bucket size bounds the memory either side needs
in flight. The manifest says where every tensor lives, so the reader needs nothing but the bytes.

Tensors are laid out in the state dict's order, each at an offset aligned to `ALIGN` bytes so that any
dtype can be viewed in place; a tensor larger than a bucket gets a bucket of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch

ALIGN = 64  # bytes; a multiple of every dtype's element size, and of a cache line


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: bucket index, byte offset inside it, and how to view the bytes."""

    name: str
    shape: list[int]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to rebuild the state dict of one weight version from its buckets."""

    version: int
    bucket_sizes: list[int]
    tensors: list[TensorEntry] = field(default_factory=list)

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_sizes)

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_sizes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes | bytearray | memoryview) -> Manifest:
        if isinstance(text, memoryview):
            text = text.tobytes()
        raw = json.loads(text)
        return cls(
            version=int(raw["version"]),
            bucket_sizes=[int(s) for s in raw["bucket_sizes"]],
            tensors=[TensorEntry(**t) for t in raw["tensors"]],
        )


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"manifest names unknown torch dtype {name!r}")
    return dtype


def _layout(state_dict: Mapping[str, torch.Tensor], bucket_bytes: int) -> tuple[list[TensorEntry], list[int]]:
    """Assign each tensor a (bucket, offset): first fit in order, a new bucket when the current is full."""
    entries: list[TensorEntry] = []
    sizes: list[int] = []
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        offset = _align(sizes[-1]) if sizes else 0
        if not nbytes and sizes:  # an empty tensor takes no room: any existing bucket will do
            offset = 0
        elif sizes and offset + nbytes <= bucket_bytes:
            sizes[-1] = offset + nbytes
        else:
            offset = 0
            sizes.append(nbytes)
        dtype = str(tensor.dtype).removeprefix("torch.")
        entries.append(TensorEntry(name, list(tensor.shape), dtype, len(sizes) - 1, offset, nbytes))
    return entries, sizes


def make_buckets(
    state_dict: Mapping[str, torch.Tensor],
    bucket_bytes: int,
    version: int,
    reuse: Sequence[memoryview] = (),
) -> tuple[Manifest, list[memoryview]]:
    """Copy every tensor once into `bucket_bytes`-sized CPU buffers; return the manifest and the buffers.

    Each returned memoryview is writable, 1-D, byte-formatted and keeps its buffer alive. Sources may be
    on any device and need not be contiguous (the single copy handles both). `reuse`: buffers an earlier
    call returned, written over if the layout has the same bucket sizes (fresh memory is slow to touch
    on a VM that returns freed pages to its host), else left alone.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    entries, sizes = _layout(state_dict, bucket_bytes)
    if [m.nbytes for m in reuse] == sizes:
        buffers = [
            torch.frombuffer(m, dtype=torch.uint8) if m.nbytes else torch.empty(0, dtype=torch.uint8)
            for m in reuse
        ]
    else:
        buffers = [torch.empty(size, dtype=torch.uint8) for size in sizes]
    filled = [0] * len(sizes)  # end of the last tensor written into each bucket
    with torch.no_grad():
        for entry, tensor in zip(entries, state_dict.values(), strict=True):
            if entry.nbytes:
                bucket = buffers[entry.bucket]
                # zero the alignment padding, so the same weights always give the same bytes
                bucket[filled[entry.bucket] : entry.offset].zero_()
                _view(bucket, entry).copy_(tensor)
                filled[entry.bucket] = entry.offset + entry.nbytes
    return Manifest(version, sizes, entries), [b.numpy().data for b in buffers]


def _view(bucket: torch.Tensor, entry: TensorEntry) -> torch.Tensor:
    """The tensor `entry` describes, as a view into its bucket's bytes (no copy)."""
    raw = bucket[entry.offset : entry.offset + entry.nbytes]
    return raw.view(_dtype(entry.dtype)).view(entry.shape)


def unpack(manifest: Manifest, buckets: Sequence[bytes | bytearray | memoryview]) -> dict[str, torch.Tensor]:
    """Rebuild the state dict as views over the bucket bytes (read-only buffers are copied once first).

    The returned tensors share memory with writable buckets, so the caller must not reuse those buffers
    while it still needs the tensors.
    """
    if len(buckets) != manifest.num_buckets:
        raise ValueError(
            f"manifest v{manifest.version} has {manifest.num_buckets} buckets, got {len(buckets)}"
        )
    tensors: list[torch.Tensor] = []
    for i, (data, size) in enumerate(zip(buckets, manifest.bucket_sizes, strict=True)):
        view = memoryview(data).cast("B")
        if view.nbytes != size:
            raise ValueError(
                f"bucket {i} of v{manifest.version} has {view.nbytes} bytes, manifest says {size}"
            )
        if view.readonly:  # torch would alias memory it must not write; one copy makes it safe
            view = memoryview(bytearray(view))
        tensors.append(
            torch.frombuffer(view, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        )
    return {e.name: _view(tensors[e.bucket], e) for e in manifest.tensors}
