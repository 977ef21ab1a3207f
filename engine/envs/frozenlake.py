"""FrozenLake (gymnasium) as a text game a tiny transformer can read: one short line per grid row.

Many turns of short observations and one-word actions make it the prefill-heavy task of the default
run. The grid is rendered here from the map and the player's cell rather than from gymnasium's
`ansi` mode, which carries escape codes and a trailing action line.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from gymnasium.envs.toy_text import frozen_lake as gym_fl

from engine.envs.base import Env, EnvStep, extract_answer

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

    `progress_reward > 0` adds potential-based shaping (Ng et al., 1999): each move pays
    `progress_reward` × (how many steps closer to G it brought the player), where closeness is the
    shortest walk over the ice. Over an episode that telescopes to `progress_reward` × (distance at
    the start − distance at the last cell on the ice), so a return also says how far the player got,
    and the best policy is unchanged (reach G). Success is still only reaching G.
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
        progress_reward: float = 0.0,
    ) -> None:
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
        if progress_reward < 0:
            raise ValueError(f"progress_reward must be >= 0, got {progress_reward}")
        self.progress_reward = progress_reward
        self._distance: dict[int, int] = {}  # state -> shortest walk to G over the ice (reachable only)
        self._lake = None if random_map else self._make_lake(gym_fl.MAPS[map_name])
        self._done = True

    def _make_lake(self, desc: list[str]) -> gym_fl.FrozenLakeEnv:
        return gym_fl.FrozenLakeEnv(desc=desc, is_slippery=self.is_slippery)

    @property
    def grid(self) -> list[str]:
        """The map rows with the player's cell shown as P."""
        if self._lake is None:
            raise RuntimeError("FrozenLakeEnv: call reset() before reading the grid")
        rows = [b"".join(row).decode() for row in self._lake.desc.tolist()]
        r, c = divmod(int(self._lake.s), self._lake.ncol)
        rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
        return rows

    def _observation(self, note: str = "") -> str:
        head = [note] if note else []
        tail = [] if self._done else [_PROMPT]
        return "\n".join([*head, *self.grid, *tail])

    async def reset(self, seed: int) -> str:
        if self.random_map:
            desc = gym_fl.generate_random_map(size=self.map_size, p=self.frozen_p, seed=seed)
            self._lake = self._make_lake(desc)
        assert self._lake is not None
        self._lake.reset(seed=seed)  # seeds the slip draws too
        if self.progress_reward and (self.random_map or not self._distance):
            self._distance = _distances_to_goal(self._lake)
        self._done = False
        return self._observation()

    async def step(self, action: str) -> EnvStep:
        if self._lake is None or self._done:
            raise RuntimeError("FrozenLakeEnv: step() needs an episode in progress; call reset() first")
        move = parse_action(action)
        if move is None:
            obs = self._observation("Invalid move.")
            return EnvStep(obs, self.invalid_penalty, False, {"invalid": True})
        before = int(self._lake.s)
        _, reward, terminated, _, _ = self._lake.step(move)
        reward = float(reward) + self._progress(before, int(self._lake.s))
        self._done = bool(terminated)  # before rendering: a finished episode asks for no move
        info: dict[str, Any] = {"invalid": False}
        if terminated:
            info["success"] = reward > 0
        return EnvStep(self._observation(), reward, self._done, info)

    def _progress(self, before: int, after: int) -> float:
        """The shaping term of a move (0 off, from or into a cell with no walk to G, e.g. a hole)."""
        if before not in self._distance or after not in self._distance:
            return 0.0
        return self.progress_reward * (self._distance[before] - self._distance[after])


def _distances_to_goal(lake: gym_fl.FrozenLakeEnv) -> dict[int, int]:
    """Breadth-first search back from G over S/F/G cells: {state: fewest moves to G}."""
    desc = lake.desc.astype(str)
    rows, cols = desc.shape
    goal = next(r * cols + c for r in range(rows) for c in range(cols) if desc[r, c] == "G")
    dist, queue = {goal: 0}, deque([goal])
    while queue:
        r, c = divmod(queue.popleft(), cols)
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            nxt = nr * cols + nc
            if 0 <= nr < rows and 0 <= nc < cols and desc[nr, nc] != "H" and nxt not in dist:
                dist[nxt] = dist[r * cols + c] + 1
                queue.append(nxt)
    return dist
