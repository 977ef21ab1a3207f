"""FrozenLake (gymnasium) as a text game a tiny transformer can read: one short line per grid row.

Many turns of short observations and one-word actions make it the prefill-heavy task of the default
run. The grid is rendered here from the map and the player's cell rather than from gymnasium's
`ansi` mode, which carries escape codes and a trailing action line.
"""

from __future__ import annotations

import random
import re
from typing import Any

from gymnasium.envs.toy_text import frozen_lake as gym_fl

from engine.envs.base import Env, EnvStep, extract_answer
from engine.envs.split import Split, check_split, held_out

ACTIONS: dict[str, int] = {
    "left": gym_fl.LEFT,
    "down": gym_fl.DOWN,
    "right": gym_fl.RIGHT,
    "up": gym_fl.UP,
    "l": gym_fl.LEFT,
    "d": gym_fl.DOWN,
    "r": gym_fl.RIGHT,
    "u": gym_fl.UP,
}
_FIRST_WORD = re.compile(r"[^\W_]+")  # a run of letters/digits: words are split on everything else
_PROMPT = "Move: left, down, right or up?"
MOVES = ("left", "down", "right", "up")
_EVAL_MAPS: dict[tuple[int, float, float], tuple[list[list[str]], set[str], int]] = {}


def _text(desc: list[str]) -> str:
    return "\n".join(desc)


def eval_map(index: int, size: int, p: float, fraction: float) -> list[str]:
    """The `index`-th distinct held-out map: random maps drawn from seeds 0, 1, 2, ... whose text is held
    out, repeats skipped. Built once per process up to the largest index asked for."""
    maps, seen, next_seed = _EVAL_MAPS.setdefault((size, p, fraction), ([], set(), 0))
    while len(maps) <= index:
        desc = gym_fl.generate_random_map(size=size, p=p, seed=next_seed)
        next_seed += 1
        text = _text(desc)
        if held_out(text, fraction) and text not in seen:
            seen.add(text)
            maps.append(desc)
    _EVAL_MAPS[(size, p, fraction)] = (maps, seen, next_seed)
    return maps[index]


def train_map(seed: int, size: int, p: float, fraction: float) -> list[str]:
    """The random map of `seed`, redrawn from a seeded chain while its text is held out."""
    rng = random.Random(seed)
    desc = gym_fl.generate_random_map(size=size, p=p, seed=seed)
    while fraction and held_out(_text(desc), fraction):
        desc = gym_fl.generate_random_map(size=size, p=p, seed=rng.randrange(2**62))
    return desc


def parse_action(text: str) -> int | None:
    """The gymnasium action named by the first word of the answer, or None when it names none."""
    word = _FIRST_WORD.search(extract_answer(text))
    return ACTIONS.get(word.group().lower()) if word else None


class FrozenLakeEnv(Env):
    """Walk from S to G on ice (F) without falling into a hole (H); the player is shown as P.

    Goal: reward 1, done, `info["success"]`. Hole: reward 0, done. An action that names no move
    leaves the state unchanged and costs `invalid_penalty`. With `random_map`, every reset seed
    draws its own map (`map_size` x `map_size`, each tile frozen with probability `frozen_p`),
    which then takes the place of `map_name`.

    Held-out maps (`eval_fraction > 0`, random maps only: the fixed map is one problem): maps are split
    on their text (`engine.envs.split`). The `train` split never poses a held-out map (a seed whose map
    is held out is redrawn); the `eval` split's seed `i` poses the `i`-th distinct held-out map.
    """

    name = "frozenlake"
    instructions = (
        "FrozenLake: walk from S to G on the ice F without stepping into a hole H. P is you. "
        "Each turn answer one move: left, down, right or up, e.g. <answer>down</answer>."
    )

    def __init__(
        self,
        is_slippery: bool = False,
        map_name: str = "4x4",
        random_map: bool = False,
        map_size: int = 4,
        frozen_p: float = 0.8,
        invalid_penalty: float = -0.1,
        eval_fraction: float = 0.0,
        split: Split = "train",
    ) -> None:
        check_split(split, eval_fraction)
        if eval_fraction and not random_map:
            raise ValueError("eval_fraction needs random_map: true (the fixed map is a single problem)")
        if map_name not in gym_fl.MAPS:
            raise ValueError(f"map_name must be one of {sorted(gym_fl.MAPS)}, got {map_name!r}")
        if random_map and map_size < 2:
            raise ValueError(f"map_size must be >= 2 (start and goal differ), got {map_size}")
        if random_map and not 0.0 < frozen_p <= 1.0:
            raise ValueError(f"frozen_p must be in (0, 1] (else no path to the goal exists), got {frozen_p}")
        self.is_slippery = is_slippery
        self.map_name = map_name
        self.random_map = random_map
        self.map_size = map_size
        self.frozen_p = frozen_p
        self.invalid_penalty = invalid_penalty
        self.eval_fraction = eval_fraction
        self.split = split
        self._lake = None if random_map else self._make_lake(gym_fl.MAPS[map_name])
        self._done = True

    def _make_lake(self, desc: list[str]) -> gym_fl.FrozenLakeEnv:
        return gym_fl.FrozenLakeEnv(desc=desc, is_slippery=self.is_slippery)

    def answer_candidates(self) -> list[str]:
        """The constant answers a majority baseline tries: each move, every turn."""
        return list(MOVES)

    @property
    def grid(self) -> list[str]:
        """The map rows with the player's cell shown as P."""
        if self._lake is None:
            raise RuntimeError("FrozenLakeEnv: call reset() before reading the grid")
        # gymnasium types `desc` as the list[str] it was given; the env keeps it as a numpy array of bytes
        rows = [b"".join(row).decode() for row in self._lake.desc.tolist()]  # type: ignore[attr-defined]
        r, c = divmod(int(self._lake.s), self._lake.ncol)
        rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
        return rows

    def _observation(self, note: str = "") -> str:
        head = [note] if note else []
        tail = [] if self._done else [_PROMPT]
        return "\n".join([*head, *self.grid, *tail])

    async def reset(self, seed: int) -> str:
        if self.random_map:
            args = (self.map_size, self.frozen_p, self.eval_fraction)
            desc = eval_map(seed, *args) if self.split == "eval" else train_map(seed, *args)
            self._lake = self._make_lake(desc)
        assert self._lake is not None
        self._lake.reset(seed=seed)  # seeds the slip draws too
        self._done = False
        return self._observation()

    async def step(self, action: str) -> EnvStep:
        if self._lake is None or self._done:
            raise RuntimeError("FrozenLakeEnv: step() needs an episode in progress; call reset() first")
        move = parse_action(action)
        if move is None:
            obs = self._observation("Invalid move.")
            return EnvStep(obs, self.invalid_penalty, False, {"invalid": True})
        _, reward, terminated, _, _ = self._lake.step(move)
        self._done = bool(terminated)  # before rendering: a finished episode asks for no move
        info: dict[str, Any] = {"invalid": False}
        if terminated:
            info["success"] = reward > 0
        return EnvStep(self._observation(), float(reward), self._done, info)
