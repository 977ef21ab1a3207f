from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import reasoning_gym as rg
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.models.pretrain import (
    MOVES,
    QUESTION_SOURCES,
    PretrainConfig,
    _steps,
    format_corpus,
    pretrain,
)
from engine.models.tiny import init_model
from engine.models.tokenizer import train_tokenizer
from engine.rollout.chat import ChatFormat

FL_ANSWER = re.compile(r"<answer>(left|down|right|up)</answer><\|im_end\|>")
NUMBER_ANSWER = re.compile(r"<answer>(\d+)</answer><\|im_end\|>")


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(train_tokenizer(seed=0))


@pytest.fixture(scope="module")
def corpus(chat: ChatFormat) -> list[tuple[list[int], list[float]]]:
    return format_corpus(chat, 600, PretrainConfig(seed=0))


def _spans(ids: list[int], mask: list[float]) -> list[list[int]]:
    """The runs of consecutive masked tokens."""
    spans: list[list[int]] = []
    for i, (tok, m) in enumerate(zip(ids, mask, strict=True)):
        if m:
            if i == 0 or not mask[i - 1]:
                spans.append([])
            spans[-1].append(tok)
    return spans


def test_loss_falls_exactly_on_whole_assistant_answers(chat: ChatFormat, corpus) -> None:
    assistant = chat.tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    for i, (ids, mask) in enumerate(corpus):
        spans = _spans(ids, mask)
        texts = [chat.tok.decode(s) for s in spans]
        pattern = FL_ANSWER if i % 2 == 0 else NUMBER_ANSWER
        assert all(pattern.fullmatch(t) for t in texts), texts
        assert len(spans) >= 1 if i % 2 == 0 else len(spans) == 1
        starts = [j for j in range(1, len(ids)) if mask[j] and not mask[j - 1]]
        assert all(ids[j - len(assistant) : j] == assistant for j in starts)  # each answer opens a turn
        assert sum(mask) == sum(len(s) for s in spans)


def test_examples_are_framed_like_the_rollout(chat: ChatFormat, corpus) -> None:
    fl_text = chat.tok.decode(corpus[0][0])
    assert fl_text.startswith("<|im_start|>system\nFrozenLake: walk from S to G")
    assert "Move: left, down, right or up?<|im_end|>\n<|im_start|>assistant\n<answer>" in fl_text
    q_text = chat.tok.decode(corpus[1][0])
    assert q_text.startswith("<|im_start|>system\nSolve the problem.")
    assert "Give only the final answer inside <answer></answer>.<|im_end|>\n<|im_start|>assistant\n" in q_text


def test_moves_are_uniform_and_ignore_the_state(chat: ChatFormat, corpus) -> None:
    """Chance-level agreement with the state: at the standard map's start, moves right/down lead on."""
    moves: Counter[str] = Counter()
    first_moves_at_start: Counter[str] = Counter()
    for ids, mask in corpus[0::2]:
        answers = [FL_ANSWER.fullmatch(chat.tok.decode(s)).group(1) for s in _spans(ids, mask)]  # type: ignore[union-attr]
        moves.update(answers)
        first_obs = chat.tok.decode(ids).split("<|im_start|>user\n")[1]
        if first_obs.startswith("PFFF\nFHFH\nFFFH\nHFFG\n"):  # the standard map, at the start
            first_moves_at_start[answers[0]] += 1
    total = sum(moves.values())
    assert total > 1000
    assert all(abs(moves[m] / total - 0.25) < 0.03 for m in MOVES), moves
    useful = first_moves_at_start["right"] + first_moves_at_start["down"]
    assert abs(useful / sum(first_moves_at_start.values()) - 0.5) < 0.15, first_moves_at_start


def test_number_answers_match_the_truth_only_by_chance(chat: ChatFormat, corpus) -> None:
    """The answers are uniform in 0..20 whatever the question: right at most 1 time in 21 (chance)."""
    datasets = [rg.create_dataset(name, size=2000, seed=7, **cfg) for name, cfg in QUESTION_SOURCES]
    truth = {entry["question"]: str(entry["answer"]) for data in datasets for entry in data}
    answers, hits = [], 0
    for ids, mask in corpus[1::2]:
        (span,) = _spans(ids, mask)
        answer = NUMBER_ANSWER.fullmatch(chat.tok.decode(span)).group(1)  # type: ignore[union-attr]
        answers.append(int(answer))
        question = chat.tok.decode(ids).split("<|im_start|>user\n")[1].split("\nGive only")[0]
        hits += truth[question] == answer
    assert min(answers) == 0 and max(answers) == 20
    assert all(abs(answers.count(n) / len(answers) - 1 / 21) < 0.04 for n in range(21))
    assert hits / len(answers) < 1 / 21  # chance, or less: many true answers are above 20


def test_corpus_is_reproducible_and_seeded(chat: ChatFormat, corpus) -> None:
    assert format_corpus(chat, 20, PretrainConfig(seed=0)) == corpus[:20]
    assert format_corpus(chat, 20, PretrainConfig(seed=1)) != corpus[:20]


def test_each_step_has_one_length_sorted_micro_batch_per_kind(corpus) -> None:
    config = PretrainConfig(steps=37, batch_size=16)
    steps = _steps(corpus[:592], config)
    assert len(steps) == 37 and all(len(mbs) == 2 and len(mbs[0]) == len(mbs[1]) == 8 for mbs in steps)
    used = [tuple(ids) for mbs in steps for mb in mbs for ids, _ in mb]
    assert sorted(used) == sorted(tuple(ids) for ids, _ in corpus[:592])  # each example once
    fl = [max(len(i) for i, _ in mbs[0]) - min(len(i) for i, _ in mbs[0]) for mbs in steps]
    assert sum(fl) / len(fl) < 30  # similar lengths, little padding (episodes range over ~400 tokens)


def _small_model(chat: ChatFormat) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(chat.tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config)


def test_pretraining_lowers_the_loss_deterministically(chat: ChatFormat) -> None:
    config = PretrainConfig(steps=12, batch_size=4, lr=1e-2, warmup=2)
    a, b = _small_model(chat), _small_model(chat)
    losses = pretrain(a, chat, config)
    assert pretrain(b, chat, config) == losses
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert len(losses) == 12
    assert losses[0] == pytest.approx(6.93, abs=0.2)  # ln(1024): an untrained model is uniform
    assert sum(losses[-3:]) / 3 < 0.6 * losses[0]
    assert not a.training


def test_init_model_pretrains_on_request(tmp_path: Path) -> None:
    plain = init_model("tiny", tmp_path / "plain", seed=0)
    based = init_model("tiny", tmp_path / "based", seed=0, pretrain_steps=2)
    assert not (plain / "pretrain.json").exists()
    report = json.loads((based / "pretrain.json").read_text())
    assert report["config"]["steps"] == 2 and len(report["losses"]) == 2
    assert (plain / "model.safetensors").read_bytes() != (based / "model.safetensors").read_bytes()
    assert (plain / "tokenizer.json").read_bytes() == (based / "tokenizer.json").read_bytes()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, "steps, batch_size"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"max_answer": -1}, "max_answer"),
    ],
)
def test_bad_pretrain_config_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PretrainConfig(**kwargs)


def test_negative_pretrain_steps_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pretrain_steps must be >= 0"):
        init_model("tiny", tmp_path, pretrain_steps=-1)
