"""Decode a training micro-batch as one packed sequence: shared prompts once, no padding.

A micro-batch holds GRPO groups row by row: in each, the same prompt (most of each row's tokens in
short-answer tasks) and replies of different lengths. Right-padded to the longest row, a batch forward
spends its matrix products on every prompt once per row and on the padding after every shorter reply.

`decode` packs the rows into one sequence instead. A token that a row shares with the row before it (the
same token at the same position, after the same tokens) is packed once, by the first row that has it; so
a group's prompt appears once and each reply after it. Each packed token attends to the packed tokens of
its own row's earlier positions, at the position it has in that row. Causal attention makes every real
token's hidden state the same as in the batch forward, and the gradients of every shared token are the
sum over the rows that share it, as they would be.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor
from transformers import PreTrainedModel

_MASKS = ("sdpa", "eager")  # attention implementations that take a ready 4-D mask as it is


def decode(decoder: PreTrainedModel, ids: Tensor, attn: Tensor) -> Tensor:
    """The decoder's last hidden states `(B, T, D)` over right-padded `ids` (`attn`: 1 on real tokens).

    States at padding positions are unspecified (they carry no loss). Models whose attention is not plain
    causal self-attention over every earlier token (sliding windows, recurrent state) or takes no ready
    mask get the ordinary batch forward, and so does a micro-batch that packing would make more work
    (`_packing_pays`).
    """
    if ids.shape[0] > 1 and _packable(decoder):
        where, rows, positions = _layout(ids, attn)
        if _packing_pays(decoder, len(rows), ids.shape):
            states = decoder(
                input_ids=ids[rows, positions][None],
                position_ids=positions[None],
                attention_mask=_mask(where, rows, positions, decoder),
            ).last_hidden_state[0]
            return states[where.clamp(min=0)]
    return decoder(input_ids=ids, attention_mask=attn).last_hidden_state


def _packable(decoder: PreTrainedModel) -> bool:
    config = decoder.config
    full = all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ())
    return (
        getattr(config, "_attn_implementation", None) in _MASKS
        and getattr(config, "sliding_window", None) is None
        and full
        and "position_ids" in inspect.signature(decoder.forward).parameters
    )


def _packing_pays(decoder: PreTrainedModel, packed: int, shape: torch.Size) -> bool:
    """Whether one sequence of `packed` tokens is no more multiply-adds than the padded `(B, T)` batch:
    the layers' weights once per token, and per (query, key) pair a score and a weighted value in every
    layer's heads. Packing saves tokens but scores every pair of its one long sequence, so with a small
    model and long rows (a multi-turn episode of hundreds of tokens) the padded batch can be the cheaper."""
    lookup = decoder.get_input_embeddings()  # a table lookup, not a product per token
    weights = sum(p.numel() for p in decoder.parameters()) - sum(p.numel() for p in lookup.parameters())
    config = decoder.config
    heads = config.num_attention_heads
    per_pair = 2 * heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    per_pair *= config.num_hidden_layers
    rows, width = shape
    return packed * weights + packed**2 * per_pair <= rows * width * weights + rows * width**2 * per_pair


def _layout(ids: Tensor, attn: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Where each `(row, position)` is in the packed sequence (`where`, `(B, T)`, −1 on padding), and the
    row and position each packed token was taken from."""
    real = attn.bool()
    same = (ids[1:] == ids[:-1]) & real[1:] & real[:-1]  # equal to the row above, position by position
    shared = torch.cat([same.new_zeros(1, ids.shape[1]), same.long().cumprod(dim=1).bool()])
    own = real & ~shared  # the tokens a row adds: after its common prefix with the row above
    rows, positions = own.nonzero(as_tuple=True)
    where = torch.full(ids.shape, -1, dtype=torch.long, device=ids.device)
    where[rows, positions] = torch.arange(len(rows), device=ids.device)
    for r in range(1, ids.shape[0]):  # a shared token is the one of the row above
        where[r] = torch.where(shared[r], where[r - 1], where[r])
    return where, rows, positions


def _mask(where: Tensor, rows: Tensor, positions: Tensor, decoder: PreTrainedModel) -> Tensor:
    """The `(1, 1, L, L)` attention mask of the packed sequence: a token sees what its row had up to it."""
    context = where[rows]  # (L, T): the packed token at every position of each token's row
    earlier = torch.arange(where.shape[1], device=where.device)[None] <= positions[:, None]
    query, key = (earlier & (context >= 0)).nonzero(as_tuple=True)
    seen = torch.zeros(len(rows), len(rows), dtype=torch.bool, device=where.device)
    seen[query, context[query, key]] = True
    seen = seen[None, None]
    if decoder.config._attn_implementation == "sdpa":
        return seen
    dtype = decoder.dtype
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill(~seen, torch.finfo(dtype).min)
