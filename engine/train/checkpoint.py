"""Atomic, resumable trainer checkpoints in Hugging Face format.

A checkpoint `ROOT/step-00000042/` holds the model (`save_pretrained`, safetensors; loadable on its own
by `AutoModelForCausalLM.from_pretrained`), the tokenizer if given, the optimiser state, the python and
torch RNG states and `state.json` (version, trainer config, caller's `extra`). It is written into a
`.tmp-*` sibling and renamed into place, so a directory with the final name is always complete and a
crash leaves only a tmp directory that `latest_checkpoint` ignores. Restoring everything (weights,
optimiser moments and step counts, RNG) makes a resumed run bit-for-bit identical to one that never
stopped. A weights-only save (`save_checkpoint(..., weights_only=True)`) holds the model and tokenizer
alone: servable and scorable, never resumable.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from engine.train.trainer import TorchTrainer

STATE_FILE = "state.json"
_OPTIMIZER_FILE = "optimizer.pt"
_RNG_FILE = "rng.pt"
_FORMAT = 1
_NAME = re.compile(r"step-(\d+)")


def checkpoint_dir(root: str | Path, version: int) -> Path:
    """Where the checkpoint of `version` lives under `root`."""
    return Path(root) / f"step-{version:08d}"


def save_checkpoint(
    root: str | Path,
    trainer: TorchTrainer,
    tokenizer: PreTrainedTokenizerBase | None = None,
    extra: dict[str, Any] | None = None,
    weights_only: bool = False,
) -> Path:
    """Write the trainer's full state as `checkpoint_dir(root, trainer.version)`; return that path.

    `extra` must be JSON-able (buffer, scheduler, data-loader state...). Saving the same version twice
    replaces the earlier checkpoint (a retried task must not fail on its own leftovers). `weights_only`:
    the model and tokenizer alone, what serving or scoring loads (a third of the bytes: the optimiser's
    moments are twice the weights); without `state.json`, so it is never taken for a resumable checkpoint.
    """
    try:
        extra_json = json.dumps(extra or {})
    except TypeError as exc:
        raise ValueError(f"extra must be JSON-able: {exc}") from exc
    final = checkpoint_dir(root, trainer.version)
    # whole weights and optimiser state first: on tensor-parallel ranks these are collectives, every rank
    # takes part, and only the one that `writes` goes on to write
    model = trainer.hf_model()
    optimizer_state = None if weights_only else trainer.optimizer_state()
    if not trainer.writes:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(final, "tmp")
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / _OPTIMIZER_FILE)
            torch.save(_rng_state(), tmp / _RNG_FILE)
            state = {
                "format": _FORMAT,
                "version": trainer.version,
                "has_tokenizer": tokenizer is not None,
                "trainer_config": asdict(trainer.config),
                "param_layout": _layout(trainer),
                "extra": json.loads(extra_json),
            }
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
        _move_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_checkpoint(path: str | Path, trainer: TorchTrainer) -> dict[str, Any]:
    """Restore weights, optimiser, version and RNG states into `trainer`; return the `extra` dict."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise ValueError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    state = json.loads(state_file.read_text())
    if state.get("format") != _FORMAT:
        raise ValueError(f"{state_file}: unsupported checkpoint format {state.get('format')!r}")
    saved_layout, layout = state.get("param_layout", "hf"), _layout(trainer)
    if saved_layout != layout:
        raise ValueError(
            f"{path}: its optimiser state is for the {saved_layout} parameter layout, this trainer's model "
            f"has the {layout} one (backends.training changed?); resume with the backend that saved it"
        )
    dtype = next(trainer.model.parameters()).dtype
    saved = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    trainer.model.load_state_dict(saved.state_dict())  # in place: the optimiser keeps its parameters
    del saved
    optimizer_state = torch.load(path / _OPTIMIZER_FILE, map_location=trainer.device, weights_only=True)
    trainer.load_optimizer_state(optimizer_state)
    _set_rng_state(torch.load(path / _RNG_FILE, weights_only=True))
    trainer.version = int(state["version"])
    return state["extra"]


def _layout(trainer: TorchTrainer) -> str:
    """Whose parameter order the optimiser state follows: "hf", or the model's own (e.g. "megatron")."""
    return str(getattr(trainer.model, "param_layout", "hf"))


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest version under `root`, or None (tmp dirs are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = [
        (int(match.group(1)), entry)
        for entry in root.iterdir()
        if (match := _NAME.fullmatch(entry.name)) and (entry / STATE_FILE).is_file()
    ]
    return max(found)[1] if found else None


def _move_into_place(tmp: Path, final: Path) -> None:
    if not final.exists():
        os.replace(tmp, final)
        return
    old = _sibling(final, "old")
    os.replace(final, old / final.name)
    os.replace(tmp, final)
    shutil.rmtree(old)


def _sibling(final: Path, kind: str) -> Path:
    """A fresh directory next to `final` (same filesystem, so renames are atomic); honours the umask."""
    path = final.parent / f"{final.name}.{kind}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
