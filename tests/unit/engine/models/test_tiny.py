from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.models.tiny import init_model, num_parameters, perturbed_weights


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model("tiny", tmp_path_factory.mktemp("tiny"), seed=0)


def test_same_seed_gives_identical_model_and_tokenizer(tiny_dir: Path, tmp_path: Path) -> None:
    again = init_model("tiny", tmp_path / "again", seed=0)
    a, b = _weights(tiny_dir), _weights(again)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tiny_dir / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


def test_other_seed_gives_other_weights(tiny_dir: Path, tmp_path: Path) -> None:
    other = _weights(init_model("tiny", tmp_path / "other", seed=1))
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(_weights(tiny_dir)[name], other[name])


def test_init_leaves_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    init_model("tiny", tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        # vocab 1024 tied; per layer q,k,v (+bias), o, gate/up/down, 2 norms; final norm
        (
            "tiny",
            1024 * 128 + 4 * (128 * 128 + 128 + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 512 + 256) + 128,
        ),
        (
            "small",
            1024 * 256
            + 8 * (256 * 256 + 256 + 2 * (256 * 128 + 128) + 256 * 256 + 3 * 256 * 1024 + 512)
            + 256,
        ),
    ],
)
def test_sizes(size: str, expected: int, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(init_model(size, tmp_path / size))
    assert num_parameters(model) == expected
    assert model.config.tie_word_embeddings and model.dtype == torch.float32
    assert (1_000_000 < expected < 2_000_000) if size == "tiny" else (5_000_000 < expected < 15_000_000)


def test_directory_loads_with_auto_classes(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok) == 1024
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert model.config.pad_token_id == tok.pad_token_id == 0
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def test_unknown_size_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        init_model("huge", tmp_path)  # type: ignore[arg-type]


def test_perturbed_weights_are_reproducible_noise(tiny_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    a = perturbed_weights(model, std=0.1, seed=3)
    b = perturbed_weights(model, std=0.1, seed=3)
    assert a.keys() == before.keys() and "lm_head.weight" not in a  # tied: sent once
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # model untouched
    noise = a["model.embed_tokens.weight"] - before["model.embed_tokens.weight"]
    assert noise.std().item() == pytest.approx(0.1, rel=0.02)
