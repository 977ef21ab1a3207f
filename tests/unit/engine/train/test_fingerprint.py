from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import PreTrainedModel

from engine.train.batch import build_train_batch
from engine.train.checkpoint import load_checkpoint, save_checkpoint
from engine.train.fingerprint import saved_optimizer_sha256, state_sha256, trainer_fingerprint
from engine.train.train_worker import weights_sha256
from engine.train.trainer import TorchTrainer, TrainerConfig
from engine.types import Group


def _step(trainer: TorchTrainer, make_group: Callable[..., Group]) -> None:
    rng = random.Random(trainer.version)
    members = [
        (rng.random(), [([1, 2, 3], [rng.randrange(4, 64) for _ in range(3)], [-3.0] * 3, 0)])
        for _ in range(4)
    ]
    trainer.train_step(build_train_batch([make_group(members)]))


def _fingerprint(trainer: TorchTrainer) -> dict:
    worker = SimpleNamespace(trainer=trainer, weights_sha256=lambda: weights_sha256(trainer.state_dict()))
    return trainer_fingerprint(worker)


def test_a_restored_trainer_has_the_saved_weights_and_optimiser_hashes(
    tiny_model: Callable[..., PreTrainedModel], make_group: Callable[..., Group], tmp_path: Path
) -> None:
    config = TrainerConfig(lr=1e-2, micro_batch_size=2, seed=7)
    live = TorchTrainer(tiny_model(seed=0), config)
    _step(live, make_group)
    _step(live, make_group)
    saved = _fingerprint(live)
    path = save_checkpoint(tmp_path, live)
    assert saved_optimizer_sha256(path) == saved["optimizer_sha256"]

    resumed = TorchTrainer(tiny_model(seed=1), config)
    assert _fingerprint(resumed)["weights_sha256"] != saved["weights_sha256"]
    load_checkpoint(path, resumed)
    assert _fingerprint(resumed) == saved == {**saved, "version": 2}

    _step(live, make_group)  # one more step moves both hashes
    moved = _fingerprint(live)
    assert moved["weights_sha256"] != saved["weights_sha256"]
    assert moved["optimizer_sha256"] != saved["optimizer_sha256"]


def test_state_hash_sees_values_dtypes_and_structure() -> None:
    a = {"state": {0: {"step": torch.tensor(1.0), "m": torch.zeros(3)}}, "groups": [{"lr": 0.1}]}
    same = {"groups": [{"lr": 0.1}], "state": {0: {"m": torch.zeros(3), "step": torch.tensor(1.0)}}}
    assert state_sha256(a) == state_sha256(same)  # key order does not matter
    for other in (
        {**a, "groups": [{"lr": 0.2}]},
        {**a, "state": {0: {"step": torch.tensor(1.0), "m": torch.zeros(3, dtype=torch.float64)}}},
        {**a, "state": {0: {"step": torch.tensor(1.0), "m": torch.tensor([0.0, 0.0, 1e-30])}}},
    ):
        assert state_sha256(other) != state_sha256(a)
