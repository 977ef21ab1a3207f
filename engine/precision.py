"""Compute precision (`model.dtype`), resolved where the work runs.

`auto` is bfloat16 on a GPU (tensor cores' fast path, half the weight bytes to move) and float32 on a CPU
(most CPUs emulate bfloat16 matmuls, slower than float32). Training keeps float32 weights and optimiser
state either way and runs its forward passes under bfloat16 autocast; generation engines hold the weights
in the resolved dtype and cast what the trainer publishes as they load it.
"""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["auto", "float32", "bfloat16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def resolve_dtype(setting: str, device: str) -> Literal["float32", "bfloat16"]:
    """The dtype a process computes in: `setting` as given, or for `auto` by its `device` ("cuda…"/"cpu")."""
    if setting not in PRECISIONS:
        raise ValueError(f"dtype: unknown {setting!r}; choose one of {', '.join(PRECISIONS)}")
    if setting == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return "bfloat16" if setting == "bfloat16" else "float32"
