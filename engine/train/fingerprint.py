"""Content hashes of training state, to prove a resumed run starts from exactly what was saved.

`state_sha256` hashes any nest of dicts, lists, tensors and scalars (a state dict, an optimiser's
`state_dict()`, what `torch.load` reads back from a checkpoint) by structure and exact bytes.
`trainer_fingerprint` is run inside the TrainWorker actor (`actor.__ray_call__`), so the optimiser
state never travels.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from engine.train.checkpoint import _OPTIMIZER_FILE


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous().cpu()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, list | tuple):
        h.update(b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def state_sha256(obj: Any) -> str:
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def trainer_fingerprint(worker: Any) -> dict[str, Any]:
    """{version, weights_sha256, optimizer_sha256} of a TrainWorker (call via `__ray_call__`)."""
    trainer = worker.trainer
    return {
        "version": trainer.version,
        "weights_sha256": worker.weights_sha256(),
        "optimizer_sha256": state_sha256(trainer.optimizer_state()),  # whole, as the checkpoint holds it
    }


def saved_optimizer_sha256(checkpoint: str | Path) -> str:
    """The optimiser hash of a checkpoint directory, as `trainer_fingerprint` hashes the live one."""
    state = torch.load(Path(checkpoint) / _OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    return state_sha256(state)
