"""One async interface for every environment (paper §6.1: one EnvManager loop per env)."""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.types import Profile

_OPEN, _CLOSE = "<answer>", "</answer>"


@dataclass
class EnvStep:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """`reset(seed)` -> first observation; `step(action_text)` -> EnvStep.

    Contract: `step` never raises for bad model output; an unparseable action is an invalid move
    (a penalty reward, `info["invalid"] = True`). `instructions` is the system prompt of the task.
    """

    name: ClassVar[str]
    default_profile: ClassVar[Profile] = Profile.PREFILL_HEAVY
    instructions: str = ""

    @abstractmethod
    async def reset(self, seed: int) -> str: ...

    @abstractmethod
    async def step(self, action: str) -> EnvStep: ...

    def format_answer(self, answer: str) -> str:
        """`answer` written the way the task asks for answers (what a constant-answer baseline says)."""
        return f"{_OPEN}{answer}{_CLOSE}"

    async def close(self) -> None:  # noqa: B027 - optional for envs
        """Release env resources (sandboxes, subprocesses)."""


def extract_answer(text: str) -> str:
    """The stripped content of the last `<answer>...</answer>` in `text`, else the stripped text.

    Uses `rfind` rather than a regex so that adversarial model output (megabytes of unclosed tags)
    costs linear time.
    """
    end = text.rfind(_CLOSE)
    start = text.rfind(_OPEN, 0, end) if end >= 0 else -1
    if start < 0:
        return text.strip()
    return text[start + len(_OPEN) : end].strip()


def has_answer_tags(text: str) -> bool:
    """Whether `text` holds a well-formed `<answer>...</answer>` (the format the tasks ask for)."""
    end = text.rfind(_CLOSE)
    return end >= 0 and text.rfind(_OPEN, 0, end) >= 0


def unknown_choice(what: str, value: str, known: Sequence[str]) -> ValueError:
    """A ValueError for a name that is not among `known`, close matches first, then all of them."""
    near = difflib.get_close_matches(value, known, n=3)
    hint = f" (did you mean {', '.join(repr(n) for n in near)}?)" if near else ""
    return ValueError(f"unknown {what} {value!r}{hint}; known: {', '.join(known)}")
