"""Decode a training micro-batch packed: each group's prompt once, its replies after it, no padding.

A micro-batch holds GRPO groups row by row: in each, the same prompt (most of each row's tokens in
short-answer tasks) and replies of different lengths. Right-padded to the longest row, a batch forward
spends its matrix products on every prompt once per row and on the padding after every shorter reply.

`decode` packs the rows instead. A token that a row shares with the row before it (the same token at the
same position, after the same tokens) is packed once, by the first row that has it; so a group's prompt
appears once and each reply after it. Each packed token attends to the packed tokens of its own row's
earlier positions, at the position it has in that row. Causal attention makes every real token's hidden
state the same as in the batch forward, and the gradients of every shared token are the sum over the rows
that share it, as they would be.

A row that does not share its whole prompt with the row above (given the loss mask: its tokens before its
first action; else its first token) starts a new segment, the next group, and the segments are decoded
side by side as a batch, padded to the longest: attention scores pairs within a segment only, so a
micro-batch of many groups costs what its groups cost apart, not the square of their total length. (Groups
often share a system prompt; packing them all into one sequence to decode it once cost more: the tiny
model's 8 groups x 8 replies of 112 tokens, one 1,883-token sequence, took 0.67 s a training step on one
thread, as 8 sequences 0.30 s.)
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor
from transformers import PreTrainedModel

_MASKS = ("sdpa", "eager")  # attention implementations that take a ready 4-D mask as it is


def decode(decoder: PreTrainedModel, ids: Tensor, attn: Tensor, actions: Tensor | None = None) -> Tensor:
    """The decoder's last hidden states `(B, T, D)` over right-padded `ids` (`attn`: 1 on real tokens;
    `actions`: the loss mask, nonzero on action tokens, which marks each row's prompt).

    States at padding positions are unspecified (they carry no loss). Models whose attention is not plain
    causal self-attention over every earlier token (sliding windows, recurrent state) or takes no ready
    mask get the ordinary batch forward, and so does a micro-batch that packing would make more work
    (`_packing_pays`).
    """
    if ids.shape[0] > 1 and _packable(decoder):
        pack = _Packing(ids, attn, actions)
        if _packing_pays(decoder, pack.shape, ids.shape):
            states = decoder(
                input_ids=pack.scatter(ids[pack.rows, pack.positions]),
                position_ids=pack.scatter(pack.positions),
                attention_mask=pack.mask(decoder),
            ).last_hidden_state
            return states[pack.segment, pack.index][pack.where.clamp(min=0)]
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


def _packing_pays(decoder: PreTrainedModel, packed: tuple[int, int], shape: torch.Size) -> bool:
    """Whether the packed `(segments, length)` batch is fewer multiply-adds than the padded `(B, T)` one (at a
    tie, e.g. rows that share nothing, the plain forward does the same work without building a mask):
    the layers' weights once per token, and per (query, key) pair a score and a weighted value in every
    layer's heads. Packing saves tokens but scores every pair of a segment, so with a small model and long
    rows (a multi-turn episode of hundreds of tokens) the padded batch can be the cheaper."""
    lookup = decoder.get_input_embeddings()  # a table lookup, not a product per token
    weights = sum(p.numel() for p in decoder.parameters()) - sum(p.numel() for p in lookup.parameters())
    config = decoder.config
    heads = config.num_attention_heads
    per_pair = 2 * heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    per_pair *= config.num_hidden_layers

    def cost(rows: int, width: int) -> int:
        return rows * width * weights + rows * width**2 * per_pair

    return cost(*packed) < cost(*shape)


class _Packing:
    """Where each real `(row, position)` of a right-padded batch goes in the packed segments.

    `rows`, `positions`: the row and position each packed token was taken from, in packing order;
    `where` `(B, T)`: each `(row, position)`'s packed token (−1 on padding); `segment`, `index`: each
    packed token's segment and its place in it; `shape`: `(segments, the longest segment)`.
    """

    def __init__(self, ids: Tensor, attn: Tensor, actions: Tensor | None = None) -> None:
        real = attn.bool()
        same = (ids[1:] == ids[:-1]) & real[1:] & real[:-1]  # equal to the row above, position by position
        shared = torch.cat([same.new_zeros(1, ids.shape[1]), same.long().cumprod(dim=1).bool()])
        starts = ~shared[:, 0]  # a row sharing nothing with the row above begins a segment
        if actions is not None:  # ... and so does one that does not share its whole prompt
            acts = actions > 0
            prompt = torch.where(acts.any(dim=1), acts.long().argmax(dim=1), real.sum(dim=1))
            starts |= shared.sum(dim=1) < prompt
        shared[starts] = False  # a segment's first row packs all its tokens
        own = real & ~shared  # the tokens a row adds: after its common prefix with the row above
        self.rows, self.positions = own.nonzero(as_tuple=True)
        self.where = torch.full(ids.shape, -1, dtype=torch.long, device=ids.device)
        self.where[self.rows, self.positions] = torch.arange(len(self.rows), device=ids.device)
        for r in range(1, ids.shape[0]):  # a shared token is the one of the row above
            self.where[r] = torch.where(shared[r], self.where[r - 1], self.where[r])
        self.segment = (starts.long().cumsum(0) - 1)[self.rows]
        sizes = torch.bincount(self.segment)
        first = sizes.cumsum(0) - sizes  # a segment's tokens are consecutive in packing order
        self.index = torch.arange(len(self.rows), device=ids.device) - first[self.segment]
        self.shape = (len(sizes), int(sizes.max()))
        self._sizes = sizes

    def scatter(self, values: Tensor) -> Tensor:
        """Per-packed-token `values` laid out as the `(segments, length)` batch, zero in the padding."""
        out = values.new_zeros(self.shape)
        out[self.segment, self.index] = values
        return out

    def mask(self, decoder: PreTrainedModel) -> Tensor:
        """The `(segments, 1, length, length)` mask: a token sees what its row had up to it; a padding
        token sees itself alone (a row with nothing to attend to would make the attention NaN)."""
        context = self.where[self.rows]  # (L, T): the packed token at every position of each token's row
        earlier = torch.arange(self.where.shape[1], device=context.device)[None] <= self.positions[:, None]
        query, key = (earlier & (context >= 0)).nonzero(as_tuple=True)
        seen = torch.zeros(
            self.shape[0], self.shape[1], self.shape[1], dtype=torch.bool, device=context.device
        )
        seen[self.segment[query], self.index[query], self.index[context[query, key]]] = True
        pad = torch.arange(self.shape[1], device=context.device)[None] >= self._sizes[:, None]  # (S, length)
        seen |= torch.diag_embed(pad)
        seen = seen[:, None]
        if decoder.config._attn_implementation == "sdpa":
            return seen
        dtype = decoder.dtype
        return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill(
            ~seen, torch.finfo(dtype).min
        )
