"""Hugging Face Llama/Qwen2 weights ⇄ a whole Megatron-core `GPTModel` (local layer spec; its tensor-parallel
slices are cut in sharding.py, its pipeline stages in pipeline.py).

What differs between the two layouts, per layer:
- Attention: HF keeps q, k and v apart; Megatron fuses them into `linear_qkv`, grouped by key/value head:
  for each of the `groups` kv heads, its `heads / groups` query heads, then its key head, then its value
  head (rows of `head_dim`). Qwen2's q/k/v biases go the same way.
- MLP: HF's `gate_proj` and `up_proj` are stacked as Megatron's `linear_fc1` (gate first: Megatron's gated
  linear unit computes `silu(first half) * second half`).
- Norms and the other projections only change names.

`to_hf(to_megatron(w)) == w` bit for bit: the conversion only concatenates and splits. A tied model has no
Megatron `output_layer` weight; `to_hf` gives `lm_head.weight` as the embedding, as HF's `state_dict` does.
Configurations the conversion does not reproduce exactly are refused by `Arch.of`, naming the setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

SUPPORTED = ("llama", "qwen2")


@dataclass(frozen=True)
class Arch:
    """The shape of a supported HF decoder, as the conversion and the Megatron config need it."""

    layers: int
    hidden: int
    heads: int
    groups: int  # key/value heads
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    eps: float
    rope_theta: float
    max_positions: int

    @classmethod
    def of(cls, hf_config: Any) -> Arch:
        """Read an HF config; refuses (ValueError naming the setting) what the conversion cannot match."""
        kind = hf_config.model_type
        if kind not in SUPPORTED:
            raise ValueError(f"model_type {kind!r}: the Megatron backend converts {', '.join(SUPPORTED)}")
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", None))
        problems = []
        if rope.get("rope_type", "default") != "default":
            problems.append(f"rope_type {rope['rope_type']!r} (only 'default' RoPE)")
        if theta is None:
            problems.append("no rope_theta")
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            problems.append(f"hidden_act {hf_config.hidden_act!r} (only 'silu')")
        if getattr(hf_config, "mlp_bias", False):
            problems.append("mlp_bias true")
        if kind == "llama" and getattr(hf_config, "attention_bias", False):
            problems.append("attention_bias true (o_proj bias)")
        if kind == "qwen2" and getattr(hf_config, "use_sliding_window", False):
            problems.append("use_sliding_window true")
        heads = hf_config.num_attention_heads
        groups = hf_config.num_key_value_heads or heads
        if heads % groups:
            problems.append(f"num_attention_heads {heads} not a multiple of num_key_value_heads {groups}")
        if problems:
            raise ValueError(f"{kind} config not supported by the Megatron backend: {'; '.join(problems)}")
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        return cls(
            layers=hf_config.num_hidden_layers,
            hidden=hf_config.hidden_size,
            heads=heads,
            groups=groups,
            head_dim=head_dim,
            ffn=hf_config.intermediate_size,
            vocab=hf_config.vocab_size,
            tied=bool(hf_config.tie_word_embeddings),
            qkv_bias=kind == "qwen2",
            eps=float(hf_config.rms_norm_eps),
            rope_theta=float(theta),  # type: ignore[arg-type]  # checked above
            max_positions=hf_config.max_position_embeddings,
        )


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, a: Arch) -> Tensor:
    per = a.heads // a.groups
    rest = q.shape[1:]
    parts = (
        q.reshape(a.groups, per * a.head_dim, *rest),
        k.reshape(a.groups, a.head_dim, *rest),
        v.reshape(a.groups, a.head_dim, *rest),
    )
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _split_qkv(qkv: Tensor, a: Arch) -> tuple[Tensor, Tensor, Tensor]:
    per = a.heads // a.groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(a.groups, (per + 2) * a.head_dim, *rest)
    q, k, v = grouped.split([per * a.head_dim, a.head_dim, a.head_dim], dim=1)
    return tuple(t.reshape(-1, *rest).contiguous() for t in (q, k, v))


def to_megatron(hf: Mapping[str, Tensor], a: Arch) -> dict[str, Tensor]:
    """HF state dict → the GPTModel's (without Megatron's `_extra_state` entries)."""
    out = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
    }
    if not a.tied:
        out["output_layer.weight"] = hf["lm_head.weight"]
    for i in range(a.layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = h + "self_attn."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "self_attention.linear_qkv.weight"] = _fuse_qkv(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], a
        )
        if a.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = _fuse_qkv(
                hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], a
            )
        out[m + "self_attention.linear_proj.weight"] = hf[attn + "o_proj.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        gate_up = [hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]]
        out[m + "mlp.linear_fc1.weight"] = torch.cat(gate_up)
        out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
    return out


def hf_keys(a: Arch) -> set[str]:
    """The names of the HF model's `state_dict` for the architecture."""
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(a.layers):
        h = f"model.layers.{i}."
        names |= {h + f"self_attn.{p}_proj.weight" for p in "qkvo"}
        names |= {h + f"self_attn.{p}_proj.bias" for p in "qkv"} if a.qkv_bias else set()
        names |= {h + f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        names |= {h + "input_layernorm.weight", h + "post_attention_layernorm.weight"}
    return names


def to_hf(mg: Mapping[str, Tensor], a: Arch) -> dict[str, Tensor]:
    """GPTModel state dict → HF names and layout (the keys of the HF model's own `state_dict`)."""
    embed = mg["embedding.word_embeddings.weight"]
    out = {"model.embed_tokens.weight": embed}
    for i in range(a.layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = h + "self_attn."
        q, k, v = _split_qkv(mg[m + "self_attention.linear_qkv.weight"], a)
        out.update({attn + "q_proj.weight": q, attn + "k_proj.weight": k, attn + "v_proj.weight": v})
        if a.qkv_bias:
            qb, kb, vb = _split_qkv(mg[m + "self_attention.linear_qkv.bias"], a)
            out.update({attn + "q_proj.bias": qb, attn + "k_proj.bias": kb, attn + "v_proj.bias": vb})
        out[attn + "o_proj.weight"] = mg[m + "self_attention.linear_proj.weight"]
        gate, up = mg[m + "mlp.linear_fc1.weight"].chunk(2)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()
        out[h + "mlp.down_proj.weight"] = mg[m + "mlp.linear_fc2.weight"]
        out[h + "input_layernorm.weight"] = mg[m + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = mg[m + "pre_mlp_layernorm.weight"]
    out["model.norm.weight"] = mg["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = embed if a.tied else mg["output_layer.weight"]
    return out
