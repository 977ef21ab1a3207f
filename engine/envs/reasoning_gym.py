"""reasoning-gym procedural datasets as single-turn tasks (one question, one scored answer).

Few turns and long chains of thought make these the decode-heavy tasks (paper §4). Datasets are
generated offline from a seed; each is built once per process and shared by every env with the same
arguments, because a GRPO group starts many envs of one task at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import reasoning_gym as rg
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS

from engine.envs.base import Env, EnvStep, extract_answer, unknown_choice
from engine.types import Profile

_FORMAT_LINE = "Give only the final answer inside <answer></answer>."
_CACHE: dict[tuple[str, int, int, str], ProceduralDataset] = {}


def _build(name: str, size: int, seed: int, config: dict[str, Any]) -> ProceduralDataset:
    if name not in DATASETS:
        raise unknown_choice("reasoning-gym dataset", name, sorted(DATASETS))
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    try:
        return rg.create_dataset(name, size=size, seed=seed, **config)
    except TypeError as e:
        fields = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("size", "seed")]
        raise TypeError(f"reasoning-gym dataset {name!r}: {e}; config fields: {', '.join(fields)}") from None
    except (AssertionError, ValueError) as e:
        raise ValueError(f"reasoning-gym dataset {name!r}: invalid config {config}: {e}") from None


def load_dataset(name: str, size: int, seed: int, config: dict[str, Any]) -> ProceduralDataset:
    """The dataset for these arguments, built on first use and cached for the process."""
    key = (name, size, seed, repr(sorted(config.items())))
    if key not in _CACHE:
        _CACHE[key] = _build(name, size, seed, config)
    return _CACHE[key]


class ReasoningGymEnv(Env):
    """`reset(seed)` poses entry `seed % size`; `step(text)` scores the answer and ends the episode.

    Any int is a valid seed; seeds that differ modulo `size` pose different entries, so training and
    held-out evaluation use disjoint seed ranges below `size`. `**dataset_config` goes to the
    dataset's config class.

    `holdout > 0` makes that split part of the env, because training seeds are drawn at random from
    [0, 2**31) and `seed % size` would reach every entry: the last `holdout` entries,
    [size - holdout, size), are posed only by the seeds in that range (use them as `eval_seeds`),
    and every other seed poses entry `seed % (size - holdout)`. A random training seed lands in the
    held-out range with probability holdout / 2**31 per draw (5e-8 for 100).
    """

    name = "reasoning_gym"
    default_profile = Profile.DECODE_HEAVY
    instructions = f"Solve the problem. {_FORMAT_LINE}"

    def __init__(
        self, dataset: str, size: int = 1000, dataset_seed: int = 0, holdout: int = 0, **dataset_config: Any
    ) -> None:
        if not 0 <= holdout < size:
            raise ValueError(f"holdout must be in [0, size={size}) (some entries must be left to train on)")
        self.dataset = dataset
        self.holdout = holdout
        self._data = load_dataset(dataset, size, dataset_seed, dataset_config)
        self._entry: dict[str, Any] | None = None

    def entry_index(self, seed: int) -> int:
        """The dataset entry that `reset(seed)` poses."""
        size = len(self._data)
        train = size - self.holdout
        return seed if train <= seed < size else seed % train

    async def reset(self, seed: int) -> str:
        self._entry = self._data[self.entry_index(seed)]
        return f"{self._entry['question']}\n{_FORMAT_LINE}"

    async def step(self, action: str) -> EnvStep:
        entry = self._entry
        if entry is None:
            raise RuntimeError("ReasoningGymEnv: step() needs an episode in progress; call reset() first")
        self._entry = None
        info: dict[str, Any] = {"answer": entry["answer"]}
        try:
            score = float(self._data.score_answer(extract_answer(action), entry))
        except Exception as e:  # a scorer choking on odd model output is a wrong answer, not a crash
            score = 0.0
            info["score_error"] = f"{type(e).__name__}: {e}"
        info["success"] = score == 1.0
        return EnvStep("", score, True, info)
