from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from engine.train.batch import TrainBatch, build_train_batch
from engine.train.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint, save_checkpoint
from engine.train.trainer import TorchTrainer, TrainerConfig
from engine.types import Group

CONFIG = TrainerConfig(lr=1e-2, micro_batch_size=2, seed=7)


def _random_batch(make_group: Callable[..., Group], step: int) -> TrainBatch:
    """Step k's batch, from its own seeded generators: background threads of other tests in the same
    process (Ray, Prefect) may draw from the global RNGs, so the RNG restore is checked on its own."""
    g, rng = torch.Generator().manual_seed(step), random.Random(step)
    members = []
    for _ in range(4):
        act = [int(t) for t in torch.randint(4, 64, (3,), generator=g)]
        lps = [-3.0 - rng.random() for _ in act]
        members.append((float(torch.rand((), generator=g)), [([1, 2, 3], act, lps, 0)]))
    return build_train_batch([make_group(members)])


def _train(trainer: TorchTrainer, steps: int, make_group: Callable[..., Group]) -> None:
    for _ in range(steps):
        trainer.train_step(_random_batch(make_group, trainer.version))


def test_resume_is_bit_for_bit_identical(
    tiny_model: Callable[..., PreTrainedModel], make_group: Callable[..., Group], tmp_path: Path
) -> None:
    straight = TorchTrainer(tiny_model(seed=0), CONFIG)
    _train(straight, 4, make_group)

    first = TorchTrainer(tiny_model(seed=0), CONFIG)
    _train(first, 2, make_group)
    py_state, torch_state = random.getstate(), torch.get_rng_state()
    path = save_checkpoint(tmp_path, first, extra={"buffer": [1, 2], "sampler": {"cursor": 5}})
    assert path == checkpoint_dir(tmp_path, 2)
    torch.rand(100), random.random()  # disturb the RNGs: the checkpoint must restore them
    resumed = TorchTrainer(tiny_model(seed=1), CONFIG)  # different weights: the checkpoint must restore them
    assert load_checkpoint(path, resumed) == {"buffer": [1, 2], "sampler": {"cursor": 5}}
    assert random.getstate() == py_state and torch.equal(torch.get_rng_state(), torch_state)
    assert resumed.version == 2
    _train(resumed, 2, make_group)

    assert resumed.version == straight.version == 4
    for (name, a), b in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    s_opt, r_opt = straight.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert s_opt["param_groups"] == r_opt["param_groups"]
    assert s_opt["state"].keys() == r_opt["state"].keys()
    for key, s_state in s_opt["state"].items():
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s_state[field], r_opt["state"][key][field]), (key, field)


def test_checkpoint_is_a_plain_hf_model_directory(
    tiny_model: Callable[..., PreTrainedModel], tmp_path: Path
) -> None:
    trainer = TorchTrainer(tiny_model(seed=0), CONFIG)
    path = save_checkpoint(tmp_path, trainer)
    assert (path / "model.safetensors").is_file()
    assert not (path / "tokenizer.json").exists()
    state = json.loads((path / "state.json").read_text())
    assert state["version"] == 0 and state["has_tokenizer"] is False and state["extra"] == {}
    assert state["trainer_config"]["lr"] == 1e-2
    loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    for (name, a), b in zip(trainer.model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_weights_only_save_loads_as_a_model_and_never_as_a_resumable_checkpoint(
    tiny_model: Callable[..., PreTrainedModel], tmp_path: Path
) -> None:
    trainer = TorchTrainer(tiny_model(seed=0), CONFIG)
    path = save_checkpoint(tmp_path, trainer, weights_only=True)
    # no optimiser, RNG or state.json: what `from_pretrained` reads
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    for (name, a), b in zip(trainer.model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(ValueError, match="is not a complete checkpoint"):
        load_checkpoint(path, TorchTrainer(tiny_model(seed=1), CONFIG))


def test_tokenizer_is_saved_alongside(tiny_model: Callable[..., PreTrainedModel], tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    path = save_checkpoint(tmp_path, TorchTrainer(tiny_model(seed=0), CONFIG), tokenizer=tokenizer)
    assert json.loads((path / "state.json").read_text())["has_tokenizer"] is True
    # explicit class: AutoTokenizer (transformers 5.19) follows config.json's qwen2 model type instead
    loaded = PreTrainedTokenizerFast.from_pretrained(path)
    assert loaded("hello world oops")["input_ids"] == [1, 2, 0]


def test_latest_checkpoint_ignores_tmp_and_incomplete_dirs(
    tiny_model: Callable[..., PreTrainedModel], make_group: Callable[..., Group], tmp_path: Path
) -> None:
    assert latest_checkpoint(tmp_path / "absent") is None
    assert latest_checkpoint(tmp_path) is None
    trainer = TorchTrainer(tiny_model(seed=0), CONFIG)
    save_checkpoint(tmp_path, trainer)
    _train(trainer, 2, make_group)
    newest = save_checkpoint(tmp_path, trainer)
    # a half-written newer checkpoint (even one that got as far as its state file) and a stray dir
    half = tmp_path / "step-00000009.tmp-1a2b3c4d"
    half.mkdir()
    (half / "state.json").write_text("{}")
    (tmp_path / "step-00000010").mkdir()
    assert latest_checkpoint(tmp_path) == newest == checkpoint_dir(tmp_path, 2)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / "step-00000010", trainer)


def test_failed_save_leaves_nothing_and_resave_replaces(
    tiny_model: Callable[..., PreTrainedModel], tmp_path: Path
) -> None:
    trainer = TorchTrainer(tiny_model(seed=0), CONFIG)
    with pytest.raises(ValueError, match="extra must be JSON-able"):
        save_checkpoint(tmp_path, trainer, extra={"bad": object()})
    assert list(tmp_path.iterdir()) == []
    save_checkpoint(tmp_path, trainer, extra={"n": 1})
    path = save_checkpoint(tmp_path, trainer, extra={"n": 2})
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert load_checkpoint(path, trainer) == {"n": 2}
