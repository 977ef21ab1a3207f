"""Tiny Qwen2 models built locally from a config: the policy that the CPU default trains (no model hub).

`init_model` writes a complete Hugging Face model directory (config, safetensors weights, generation
config, tokenizer with chat template) that both the torch backends and vLLM load unchanged. Qwen2 is used
because vLLM supports it natively; embeddings are tied to keep most parameters in the transformer layers.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Literal, TypedDict

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from engine.models.tokenizer import train_tokenizer
from engine.rollout.chat import ChatFormat

ModelSize = Literal["tiny", "small"]


class Shape(TypedDict):
    """A size's transformer dimensions, as Qwen2Config keyword arguments."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


# head_dim = hidden / heads = 32, the smallest head size vLLM's CPU attention supports.
SIZES: dict[str, Shape] = {
    "tiny": Shape(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    ),
    "small": Shape(
        hidden_size=256,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1024,
    ),
}
VOCAB_SIZE = 1024
MAX_POSITIONS = 2048


def init_model(size: ModelSize, out: Path, seed: int = 0, pretrain_steps: int = 0) -> Path:
    """Write an fp32 model of `size` plus its tokenizer to `out`; return `out`.

    The weights are random, then, with `pretrain_steps > 0`, format-pretrained for that many steps
    (seeded by `seed`; the losses go to `out/pretrain.json`). Deterministic: the same arguments give
    the same tokenizer and, on the same thread count, bit-identical weights. The global torch RNG state
    is left as it was.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    if pretrain_steps < 0:
        raise ValueError(f"pretrain_steps must be >= 0, got {pretrain_steps}")
    out = Path(out)
    tokenizer = train_tokenizer(vocab_size=VOCAB_SIZE, seed=seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
        **SIZES[size],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        # in place; transformers types `PreTrainedModel.to` as a functools.wraps object, whose self is unbound
        model.to(torch.float32)  # type: ignore[arg-type]
    if pretrain_steps:
        from engine.models.pretrain import PretrainConfig, pretrain  # the tasks' generators: only to pretrain

        recipe = PretrainConfig(steps=pretrain_steps, seed=seed)
        t0 = time.perf_counter()
        losses = pretrain(model, ChatFormat(tokenizer), recipe)
        report = {"config": dataclasses.asdict(recipe), "seconds": time.perf_counter() - t0, "losses": losses}
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if pretrain_steps:
        (out / "pretrain.json").write_text(json.dumps(report, indent=1))
    return out


def num_parameters(model: torch.nn.Module) -> int:
    """Unique parameter count (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def perturbed_weights(model: torch.nn.Module, std: float, seed: int) -> dict[str, torch.Tensor]:
    """Each parameter plus N(0, std²) noise drawn from `seed` (tied ones once): a stand-in "next policy
    version" for weight-sync tests and demos that have no trainer. The model itself is not changed.
    """
    gen = torch.Generator().manual_seed(seed)
    return {
        name: p.detach() + std * torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device)
        for name, p in model.named_parameters()
    }
