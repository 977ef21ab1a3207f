"""Tensor parallelism for `MegatronLM`: which weights are split across the ranks, and how.

With tensor-parallel size `tp`, each rank of the group holds a slice of every large matrix (Megatron-core's
column- and row-parallel layers) and a full copy of the small ones. The slices, in GPTModel names:
- rows (dim 0), one contiguous chunk per rank: the word embeddings and the output layer (vocabulary
  slices), `linear_qkv` weight and bias (Megatron's fused layout is grouped by kv head, so a chunk is
  whole kv groups with their query heads);
- columns (dim 1): `linear_proj` and `linear_fc2` (row-parallel: each rank's partial sums are all-reduced);
- `linear_fc1` holds gate and up stacked; each rank holds its chunk of the gate above its chunk of the up
  projection (what Megatron's gated unit splits in half on every rank);
- everything else (the RMSNorm weights) is replicated: every rank computes it on the full hidden state and
  gets the same gradient, so it is counted once in the gradient norm.

`shard` cuts a full state dict (or any tensors shaped like the parameters, e.g. AdamW's moments) for one
rank; `gather` all-gathers the slices back into full tensors; `grad_norm` is the norm of the whole model's
gradient, the same on every rank. With `tp == 1` all three are the identity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")
_COLUMNS = ("linear_proj.weight", "linear_fc2.weight")
_GATE_UP = "linear_fc1.weight"


def split_dim(name: str) -> int | None:
    """The dimension `name` is split along (0 or 1), or None where every rank holds it whole."""
    if name.endswith(_ROWS) or name.endswith(_GATE_UP):
        return 0
    if name.endswith(_COLUMNS):
        return 1
    return None


def shard(full: Mapping[str, Tensor], rank: int, tp: int) -> dict[str, Tensor]:
    """Rank `rank`'s slice of every tensor of `full` (GPTModel names); a size not divisible by `tp` is
    refused, naming the tensor."""
    out = {}
    for name, t in full.items():
        dim = split_dim(name)
        if dim is None or tp == 1:
            out[name] = t
            continue
        parts = 2 if name.endswith(_GATE_UP) else 1  # gate and up are cut separately
        if t.shape[dim] % (tp * parts):
            raise ValueError(
                f"{name}: size {t.shape[dim]} along dim {dim} does not divide by tensor_parallel {tp}"
            )
        halves = t.chunk(parts, dim=dim)
        out[name] = torch.cat([h.chunk(tp, dim=dim)[rank] for h in halves], dim=dim).contiguous()
    return out


def gather(local: Mapping[str, Tensor], tp: int, group: dist.ProcessGroup | None = None) -> dict[str, Tensor]:
    """The full tensors from every rank's slices (a collective: every rank of the group calls it with the
    same names, in the same order)."""
    if tp == 1:
        return dict(local)
    out = {}
    for name, t in local.items():
        dim = split_dim(name)
        if dim is None:
            out[name] = t
            continue
        pieces = [torch.empty_like(t) for _ in range(tp)]
        dist.all_gather(pieces, t.detach().contiguous(), group=group)
        if name.endswith(_GATE_UP):  # each piece is [gate chunk; up chunk]
            gates, ups = zip(*(p.chunk(2, dim=0) for p in pieces), strict=True)
            out[name] = torch.cat([*gates, *ups], dim=0)
        else:
            out[name] = torch.cat(pieces, dim=dim)
    return out


def grad_norm(
    named: Iterable[tuple[str, torch.nn.Parameter]],
    tp: int,
    group: dist.ProcessGroup | None = None,
    stages: dist.ProcessGroup | None = None,
) -> float:
    """The 2-norm of the whole model's gradient: split parameters summed over the ranks, replicated ones
    once, and with `stages` (the pipeline group) every stage's sum added (the same value on every rank)."""
    grads = [(name, p.grad) for name, p in named if p.grad is not None]
    if not grads:
        return 0.0
    device = grads[0][1].device  # the all-reduce runs where the gradients are (NCCL needs CUDA tensors)
    split_sq = torch.zeros((), dtype=torch.float64, device=device)
    whole_sq = torch.zeros((), dtype=torch.float64, device=device)
    for name, g in grads:
        sq = g.detach().double().pow(2).sum()
        if split_dim(name) is None or tp == 1:
            whole_sq += sq
        else:
            split_sq += sq
    if tp > 1:
        dist.all_reduce(split_sq, group=group)
    total = split_sq + whole_sq
    if stages is not None and stages.size() > 1:
        dist.all_reduce(total, group=stages)
    return math.sqrt(float(total))
