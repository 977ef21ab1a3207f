from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models.tokenizer import IM_END, IM_START, PAD, load_tokenizer, train_tokenizer

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(vocab_size=1024, seed=0)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "S F F F\nF H F H\nF F F H\nH F F G",
        "<answer>Left</answer>",
        '{"action": "Up", "score": -3.25}',
        "naïve café — “quotes” ½ ∑ ∞",
        "中文字符 日本語 한국어 עברית العربية",
        "emoji 🤖🧊 family 👨‍👩‍👧 flag 🇫🇷 skin 👍🏽",
        "zero\u200bwidth \u0000 null \t tab \r\n crlf \x7f del",
        "e\u0301 combining vs é precomposed",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 astral \U0010ffff",
        "  leading and trailing spaces  ",
    ],
)
def test_any_text_round_trips_exactly(tok, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text


def test_special_tokens_and_eos(tok) -> None:
    assert [tok.convert_tokens_to_ids(t) for t in (PAD, IM_START, IM_END)] == [0, 1, 2]
    assert tok.eos_token == IM_END and tok.eos_token_id == 2
    assert tok.pad_token == PAD and tok.pad_token_id == 0
    assert tok.encode(f"{IM_START}user{IM_END}")[0] == 1
    assert tok.encode(f"{IM_START}user{IM_END}")[-1] == 2


def test_chat_template_is_qwen_style(tok) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")


def test_vocabulary_fits_the_tasks(tok) -> None:
    assert len(tok) == 1024
    assert tok.tokenize("2025") == ["2", "0", "2", "5"]  # digits one per token
    for word in ("Left", "Down", "Right", "Up", "left", "down", "right", "up", "answer"):
        assert len(tok.tokenize(word)) == 1, word
    # the FrozenLake answer is 7 tokens + <|im_end|>: it fits a max_tokens of 8
    assert len(tok.encode("<answer>right</answer>")) == 7


def test_training_is_deterministic(tok) -> None:
    again = train_tokenizer(vocab_size=1024, seed=0)
    assert again.get_vocab() == tok.get_vocab()
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def _model_dir(tok, path):
    """A model directory as `init_model` writes it: tokenizer files plus a qwen2 config.json."""
    tok.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return path


def test_load_tokenizer_reads_tokenizer_json_as_written(tok, tmp_path) -> None:
    """AutoTokenizer would follow config.json to Qwen2Tokenizer and replace the trained pre-tokenizer with
    Qwen's; `load_tokenizer` keeps what the file says, so the model sees the tokens it was trained on."""
    loaded = load_tokenizer(_model_dir(tok, tmp_path))
    written = json.loads((tmp_path / "tokenizer.json").read_text())
    assert json.loads(loaded.backend_tokenizer.to_str())["pre_tokenizer"] == written["pre_tokenizer"]
    for text in ("What is 12+345? <answer>357</answer>", "S F F F\nF H F H", "naïve café 🤖"):
        assert loaded.encode(text) == tok.encode(text)
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    messages = [{"role": "user", "content": "2+2?"}]
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )


def test_a_process_that_only_tokenizes_does_not_import_torch(tok, tmp_path) -> None:
    """The rollout service and the driver load tokenizers: AutoTokenizer's registry would import torch."""
    path = _model_dir(tok, tmp_path)
    code = (
        "import sys; from engine.models.tokenizer import load_tokenizer; "
        f"t = load_tokenizer({str(path)!r}); print(t.encode('hi') != [], 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]


def test_a_directory_without_tokenizer_json_goes_through_autotokenizer(tok, tmp_path) -> None:
    bpe = json.loads(tok.backend_tokenizer.to_str())["model"]
    (tmp_path / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    (tmp_path / "merges.txt").write_text("\n".join(" ".join(m) for m in bpe["merges"]) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    loaded = load_tokenizer(tmp_path)
    assert type(loaded).__name__ == "Qwen2Tokenizer"  # the class the model type names builds it
    text = "What is 12+345? <answer>357</answer>"
    assert loaded.decode(loaded.encode(text)) == text
