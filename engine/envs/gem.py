"""GEM (gem-llm) text games as multi-turn envs.

Verified offline with gem-llm 0.1.0 (reset + steps): GuessTheNumber, Mastermind, Minesweeper,
Game2048, Sudoku, TowerofHanoi (all variants), Sokoban (all; `-hard` takes seconds per reset),
FifteenPuzzle and Crosswords (`-easy`, `-hard`). Wordle, Hangman and WordSearch need NLTK data (a download);
FifteenPuzzle/Crosswords `-random` fail in GEM itself; math/code/qa envs download datasets.

GEM is synchronous and some resets take seconds, so its calls run in a worker thread. GEM games
draw from the process-global `random`/numpy state (seeded by `reset`), so one lock serialises every
GEM call in the process: that keeps `reset(seed)` reproducible, which GRPO groups rely on.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import gem
from gem.envs.registration import ENV_REGISTRY

from engine.envs.base import Env, EnvStep, unknown_choice
from engine.types import Profile

T = TypeVar("T")
_LOCK = threading.Lock()
_SEED_RANGE = 2**32  # numpy's global seed, which GEM sets, must lie in [0, 2**32)


def _locked(fn: Callable[[], T]) -> T:
    with _LOCK:
        return fn()


async def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.to_thread(_locked, functools.partial(fn, *args, **kwargs))


def _check_game_args(game_id: str, game_args: dict[str, Any]) -> None:
    """GEM game classes swallow unknown kwargs (`**_`); reject them here, naming them."""
    entry = ENV_REGISTRY[game_id].entry_point
    if isinstance(entry, str):
        module, cls_name = entry.split(":")
        entry = getattr(importlib.import_module(module), cls_name)
    params = inspect.signature(entry).parameters.values()
    accepted = [p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    unknown = sorted(set(game_args) - set(accepted))
    if unknown:
        names, known = ", ".join(unknown), ", ".join(accepted)
        raise TypeError(f"GEM game {game_id!r}: unexpected argument(s) {names}; accepted: {known}")


def _with_suffix(observation: str, info: dict[str, Any]) -> str:
    """GEM puts the prompt for the next move in `info["suffix"]`; its own wrappers append it."""
    suffix = info.get("suffix", "")
    return f"{observation.rstrip()}\n{suffix}" if suffix else observation


class GemEnv(Env):
    """One GEM game (e.g. "game:GuessTheNumber-v0-easy"); `game_args` override the registered ones.

    Bad actions get whatever the game does with them (most games end the episode with -0.1). A game
    that raises on an action makes it an invalid move: `invalid_penalty`, `info["invalid"]`.
    """

    name = "gem"
    default_profile = Profile.DECODE_HEAVY  # few turns of reasoning per game (paper §4)
    instructions = "You are playing a text game. Follow its rules and write each move the way it asks."

    def __init__(self, game_id: str, invalid_penalty: float = -0.1, **game_args: Any) -> None:
        if game_id not in ENV_REGISTRY:
            raise unknown_choice("GEM game", game_id, sorted(ENV_REGISTRY))
        _check_game_args(game_id, game_args)
        self.game_id = game_id
        self.invalid_penalty = invalid_penalty
        self._game_args = game_args
        self._game: gem.Env | None = None  # built on first reset, off the event loop (can take seconds)
        self._done = True

    async def reset(self, seed: int) -> str:
        if self._game is None:
            self._game = await _call(gem.make, self.game_id, **self._game_args)
        # gem is untyped, so its Env is Any, which does not narrow `self._game` past the None check
        game: gem.Env = self._game
        observation, info = await _call(game.reset, seed % _SEED_RANGE)
        self._done = False
        return _with_suffix(observation, info)

    async def step(self, action: str) -> EnvStep:
        if self._game is None or self._done:
            raise RuntimeError("GemEnv: step() needs an episode in progress; call reset() first")
        try:
            observation, reward, terminated, truncated, info = await _call(self._game.step, action)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            return EnvStep("Invalid move.", self.invalid_penalty, False, {"invalid": True, "error": error})
        self._done = bool(terminated or truncated)
        info = {**info, "invalid": False, "terminated": bool(terminated), "truncated": bool(truncated)}
        if not self._done:  # a finished game asks for no next move
            observation = _with_suffix(observation, info)
        return EnvStep(observation, float(reward), self._done, info)
