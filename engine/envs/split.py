"""Held-out problems, split on the problem's text.

An evaluation can show learning only on problems the policy never trained on. Splitting by seed or by
dataset index does not give that: procedural generators repeat themselves (reasoning-gym's one-animal
`leg_counting` has 37 distinct questions, so 40 "held-out" entries were all training questions too), and
FrozenLake's seeds can draw the same map twice. So the split is a fixed partition of the *text* space:
a problem is held out iff a hash of its text falls below `fraction`. Every copy of a text lands on the
same side, whatever seed or index produced it, and training envs never pose a held-out text.

`MAX_EVAL_FRACTION` caps every task's held-out share, so a corpus that must avoid all held-out problems
(the format pretraining of the tiny model) can skip the texts below that cap and be disjoint from the
eval problems of any task.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = ("train", "eval")
MAX_EVAL_FRACTION = 0.5


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def bucket(text: str) -> float:
    """A uniform number in [0, 1) fixed by the text alone."""
    return int.from_bytes(_digest(text)[:8], "big") / 2**64


def held_out(text: str, fraction: float) -> bool:
    return bucket(text) < fraction


def problem_id(text: str) -> str:
    """A short stable id of a problem's text (what runs record to count train/eval overlap)."""
    return _digest(text).hex()[:16]


def check_split(split: str, fraction: float) -> None:
    """Raise ValueError for a split name or a held-out share the envs cannot honour."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not 0.0 <= fraction <= MAX_EVAL_FRACTION:
        raise ValueError(f"eval_fraction must be in [0, {MAX_EVAL_FRACTION}], got {fraction}")
    if split == "eval" and fraction == 0.0:
        raise ValueError("split 'eval' needs eval_fraction > 0 (nothing is held out)")
