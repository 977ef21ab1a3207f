"""HF ⇄ Megatron weight conversion: exact both ways, and refusals that name the setting."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from engine.train.megatron.convert import Arch, hf_keys, to_hf, to_megatron


def _random_state(config, seed: int = 0) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).state_dict()


QWEN2 = Qwen2Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
# SmolLM2's architecture (9 query heads over 3 kv heads, head_dim 64, RoPE base 1e5), made small and untied
LLAMA = LlamaConfig(
    vocab_size=96,
    hidden_size=576,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
    tie_word_embeddings=False,
)


@pytest.mark.parametrize("config", [QWEN2, LLAMA], ids=["qwen2-tied-bias", "llama-untied"])
def test_hf_to_megatron_to_hf_is_bit_exact_with_the_hf_keys(config) -> None:
    arch = Arch.of(config)
    hf = _random_state(config)
    back = to_hf(to_megatron(hf, arch), arch)
    assert set(back) == set(hf) == hf_keys(arch)
    for name, tensor in hf.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


def test_qkv_is_fused_per_kv_group_gate_before_up() -> None:
    arch = Arch.of(QWEN2)  # 4 query heads over 2 kv heads, head_dim 8
    hf = _random_state(QWEN2)
    mg = to_megatron(hf, arch)
    qkv = mg["decoder.layers.1.self_attention.linear_qkv.weight"]
    q, k, v = (hf[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    group1 = qkv[32:64]  # the second kv group: its 2 query heads, then its key head, then its value head
    assert torch.equal(group1[:16], q[16:32]) and torch.equal(group1[16:24], k[8:16])
    assert torch.equal(group1[24:], v[8:16])
    fc1 = mg["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:64], hf["model.layers.0.mlp.gate_proj.weight"])
    assert "output_layer.weight" not in mg  # tied: Megatron shares the embedding


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (Qwen2Config(hidden_act="gelu"), "hidden_act 'gelu'"),
        (LlamaConfig(attention_bias=True), "attention_bias true"),
        (LlamaConfig(rope_parameters={"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}), "rope_type"),
        (LlamaConfig(mlp_bias=True), "mlp_bias true"),
    ],
)
def test_configs_the_conversion_cannot_match_are_refused_by_name(config, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Arch.of(config)


def test_other_architectures_are_refused_with_the_supported_list() -> None:
    from transformers import GPT2Config

    with pytest.raises(ValueError, match=r"model_type 'gpt2'.*llama, qwen2"):
        Arch.of(GPT2Config())
