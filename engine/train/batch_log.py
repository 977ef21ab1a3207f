"""A run's training batches on disk (`train.save_batches`): what each step trained on, to look at or retrain.

`save_batch` writes `v<version>.pt`, the batch trained at that trainer version (five digits), as the
`TrainBatch` fields in plain tensors and lists (`torch.load(..., weights_only=True)` reads it); the first
call also writes `trainer.json`, the trainer's resolved config. `load_batch` reads one back as a
`TrainBatch`, so `TorchTrainer(model, TrainerConfig(**config)).train_step(batch)` trains it again.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from engine.train.batch import TrainBatch
from engine.train.trainer import TrainerConfig


def save_batch(directory: Path, version: int, batch: TrainBatch, config: TrainerConfig) -> Path:
    """Write the batch trained at `version` (and, once, the trainer's config); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    resolved = directory / "trainer.json"
    if not resolved.exists():
        resolved.write_text(json.dumps(dataclasses.asdict(config), indent=1))
    path = directory / f"v{version:05d}.pt"
    torch.save({f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}, path)
    return path


def load_batch(path: Path) -> TrainBatch:
    return TrainBatch(**torch.load(path, weights_only=True))


def load_trainer_config(directory: Path) -> TrainerConfig:
    """The config the saved batches were trained with (`trainer.json`)."""
    fields = json.loads((directory / "trainer.json").read_text())
    return TrainerConfig(**{**fields, "betas": tuple(fields["betas"])})
