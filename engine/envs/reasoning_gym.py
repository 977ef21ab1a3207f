"""reasoning-gym procedural datasets as tasks: one question, one scored answer (or a few tries at it).

Few turns and long chains of thought make these the decode-heavy tasks (paper §4). Datasets are
generated offline from a seed; each is built once per process and shared by every env with the same
arguments, because a GRPO group starts many envs of one task at once.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

import reasoning_gym as rg
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS

from engine.envs.base import Env, EnvStep, extract_answer, has_answer_tags, unknown_choice
from engine.envs.split import Split, check_split, held_out
from engine.types import Profile

AnswerFormat = Literal["tags", "the_answer_is"]
_FORMAT_LINES: dict[str, str] = {
    "tags": "Give only the final answer inside <answer></answer>.",
    "the_answer_is": 'End your reply with "The answer is N." where N is the final answer.',
}
_ANSWER_IS = "the answer is"
_CACHE: dict[tuple[str, int, int, str], ProceduralDataset] = {}
_POOLS: dict[tuple, list[int]] = {}


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


def _key(name: str, size: int, seed: int, config: dict[str, Any]) -> tuple[str, int, int, str]:
    return (name, size, seed, repr(sorted(config.items())))


def load_dataset(name: str, size: int, seed: int, config: dict[str, Any]) -> ProceduralDataset:
    """The dataset for these arguments, built on first use and cached for the process."""
    key = _key(name, size, seed, config)
    if key not in _CACHE:
        _CACHE[key] = _build(name, size, seed, config)
    return _CACHE[key]


class ReasoningGymEnv(Env):
    """`reset(seed)` poses one problem; `step(text)` scores the answer and ends the episode.

    Problems are the dataset's entries (`size` of them, generated from `dataset_seed`). With
    `eval_fraction > 0` the entries are split on their question text (`engine.envs.split`): the
    `train` split poses entry `seed % n` of the entries whose text is not held out (training seeds are
    drawn at random from [0, 2**31)); the `eval` split poses the `seed`-th *distinct* held-out
    question, so seeds 0..n-1 are n different problems, none of which a training env ever poses.

    Reward: 1 for an exact match of the answer, else 0. The answer given is read in `answer_format`:
    `tags` (reasoning-gym's own: the content of the last `<answer>` tags) or `the_answer_is` (the rest
    of the line after the last "The answer is", trailing period dropped: the strict-match format of
    chain-of-thought GSM8K evaluations, which small chat models write unprompted where they never
    write tags); either way an output without the format is read whole, stripped. `partial_credit`
    pays reasoning-gym's graded score instead (e.g. "46" earns 0.26 when the answer is 6), and
    `format_reward` is added when the output is in the format. `info["success"]` is the exact match
    whatever the reward; `info["lenient"]` says whether the right answer appears anywhere in the
    output (did the model know it, whatever the format), and
    `info["partial"]` is the graded score. `**dataset_config` goes to the dataset's config class.

    `attempts > 1` makes it multi-turn: a wrong answer with attempts left gets "That is not right. Try
    again." (and the format line) and the episode goes on, so its length is the answers it took: one for a
    problem the policy knows, up to `attempts` for one it does not. The reward and `success` are the last
    answer's (a problem solved at the third try earns what one solved at once does); `info["attempt"]`
    says which answer that was. The task's `max_turns` must allow them all (engine/config/tasks.py).
    """

    name = "reasoning_gym"
    default_profile = Profile.DECODE_HEAVY

    def __init__(
        self,
        dataset: str,
        size: int = 1000,
        dataset_seed: int = 0,
        eval_fraction: float = 0.0,
        split: Split = "train",
        partial_credit: bool = False,
        format_reward: float = 0.0,
        answer_format: AnswerFormat = "tags",
        attempts: int = 1,
        **dataset_config: Any,
    ) -> None:
        check_split(split, eval_fraction)
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts = attempts
        self._tries = 0
        if answer_format not in _FORMAT_LINES:
            raise unknown_choice("answer_format", answer_format, sorted(_FORMAT_LINES))
        self.answer_format = answer_format
        self._format_line = _FORMAT_LINES[answer_format]
        self.instructions = f"Solve the problem. {self._format_line}"
        self.dataset = dataset
        self.split = split
        self.partial_credit = partial_credit
        self.format_reward = float(format_reward)
        self._data = load_dataset(dataset, size, dataset_seed, dataset_config)
        key = _key(dataset, size, dataset_seed, dataset_config)
        self._pool = _pool(self._data, key, eval_fraction, split)
        if not self._pool:
            raise ValueError(
                f"reasoning-gym dataset {dataset!r}: no {split} problems among {size} entries with "
                f"eval_fraction {eval_fraction} (raise size or change eval_fraction)"
            )
        self._entry: dict[str, Any] | None = None

    @property
    def num_problems(self) -> int:
        """Distinct problems in the eval split; entries (texts may repeat) in the train split."""
        return len(self._pool)

    def entry_index(self, seed: int) -> int:
        """The dataset entry that `reset(seed)` poses."""
        return self._pool[seed % len(self._pool)]

    def answer_candidates(self) -> list[str]:
        """Every answer of this split's problems: the constant answers a majority baseline tries."""
        return sorted({str(self._data[i]["answer"]).strip() for i in self._pool})

    def format_answer(self, answer: str) -> str:
        return super().format_answer(answer) if self.answer_format == "tags" else f"The answer is {answer}."

    async def reset(self, seed: int) -> str:
        self._entry = self._data[self.entry_index(seed)]
        self._tries = 0
        return f"{self._entry['question']}\n{self._format_line}"

    async def step(self, action: str) -> EnvStep:
        entry = self._entry
        if entry is None:
            raise RuntimeError("ReasoningGymEnv: step() needs an episode in progress; call reset() first")
        self._tries += 1
        answer = str(entry["answer"]).strip()
        given, formatted = self._read(action)
        info: dict[str, Any] = {"answer": entry["answer"]}
        try:
            partial = float(self._data.score_answer(given, entry))
        except Exception as e:  # a scorer choking on odd model output is a wrong answer, not a crash
            partial = 0.0
            info["score_error"] = f"{type(e).__name__}: {e}"
        exact = given == answer
        info.update(success=exact, lenient=_mentions(action, answer), partial=partial, formatted=formatted)
        info["attempt"] = self._tries
        if not exact and self._tries < self.attempts:
            return EnvStep(f"That is not right. Try again.\n{self._format_line}", 0.0, False, info)
        self._entry = None
        reward = (partial if self.partial_credit else float(exact)) + self.format_reward * formatted
        return EnvStep("", reward, True, info)

    def _read(self, action: str) -> tuple[str, bool]:
        """The answer the output gives, and whether it is in the answer format."""
        if self.answer_format == "tags":
            return extract_answer(action), has_answer_tags(action)
        start = action.lower().rfind(_ANSWER_IS)
        if start < 0:
            return action.strip(), False
        line = action[start + len(_ANSWER_IS) :].split("\n", 1)[0].strip()
        return line.removesuffix(".").strip(), True


def _pool(
    data: ProceduralDataset, key: tuple[str, int, int, str], fraction: float, split: Split
) -> list[int]:
    """Entry indices a split poses: training entries, or the first entry of each distinct held-out text."""
    cache_key = (*key, fraction, split)
    if cache_key not in _POOLS:
        if fraction == 0.0:
            _POOLS[cache_key] = list(range(len(data)))
        else:
            seen: set[str] = set()
            pool = []
            for i in range(len(data)):
                text = data[i]["question"]
                if held_out(text, fraction) == (split == "eval") and (split == "train" or text not in seen):
                    seen.add(text)
                    pool.append(i)
            _POOLS[cache_key] = pool
    return _POOLS[cache_key]


def _mentions(text: str, answer: str) -> bool:
    """The answer appears in the text as a whole token (12 in "7 + 5 = 12", not in "120")."""
    return bool(answer) and re.search(rf"(?<![\w.]){re.escape(answer)}(?![\w]|\.\d)", text) is not None
