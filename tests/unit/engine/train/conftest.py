"""Tiny models for the training tests (no hub, no tokenizer); `make_group` is in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

VOCAB = 64


@pytest.fixture
def tiny_model() -> Callable[..., PreTrainedModel]:
    """Factory: a 2-layer, hidden-32 Qwen2 causal LM with weights drawn from `seed`."""

    def build(seed: int = 0) -> PreTrainedModel:
        config = Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=True,
        )
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)

    return build
