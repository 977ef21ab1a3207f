"""Evaluation scores held-out problems honestly: a constant answer scores what the baseline says, an
oracle scores 1, and the report names the problems and the version that answered."""

import re
from collections import Counter

import pytest

from engine.envs.reasoning_gym import ReasoningGymEnv
from engine.evaluate import evaluate, majority_baseline
from engine.models.tokenizer import train_tokenizer
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import TurnLimits
from engine.rollout.scheduler import TaskSpec
from engine.types import GenOutput, GenRequest

ARGS = {
    "dataset": "chain_sum",
    "size": 400,
    "dataset_seed": 2,
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "eval_fraction": 0.3,
}


def spec(n: int, env: str = "reasoning_gym", args: dict | None = None) -> TaskSpec:
    return TaskSpec("sums", env, dict(args or ARGS), 1.0, 2, TurnLimits(10, 8, 512, 1.0), "decode-heavy", n)


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(train_tokenizer(vocab_size=1024, seed=0))


class Answering:
    """A generator that answers every prompt with `answer(prompt_text)`, as version 7."""

    def __init__(self, chat: ChatFormat, answer):
        self.chat, self.answer = chat, answer

    async def generate(self, request: GenRequest) -> GenOutput:
        text = self.chat.tok.decode(request.prompt_ids)
        ids = self.chat.tok.encode(f"<answer>{self.answer(text)}</answer>", add_special_tokens=False)
        return GenOutput(request.request_id, ids, [0.0] * len(ids), 7, "stop")


def _sum(text: str) -> int:
    a, op, b = re.findall(r"(\d) ([+-]) (\d) =", text)[-1]
    return int(a) + int(b) if op == "+" else int(a) - int(b)


async def test_an_oracle_scores_one_on_distinct_held_out_problems(chat):
    res = (await evaluate([spec(40)], chat, Answering(chat, _sum)))["sums"]
    assert res["success"] == 1.0 and res["lenient"] == 1.0 and res["failed"] == 0
    assert res["n_eval"] == 40 == len(res["problems"]) and res["versions"] == [7]


async def test_the_majority_baseline_is_the_most_common_answer_and_a_constant_scores_it(chat):
    n = 40
    env = ReasoningGymEnv(split="eval", **ARGS)
    answers = []
    for seed in range(n):
        await env.reset(seed)
        answers.append(str(env._data[env.entry_index(seed)]["answer"]))
    _, count = Counter(answers).most_common(1)[0]
    base = await majority_baseline(spec(n))
    assert base["success"] == pytest.approx(count / n) and 0 < base["success"] < 0.5
    assert Counter(answers)[base["answer"]] == count
    res = (await evaluate([spec(n)], chat, Answering(chat, lambda _: base["answer"])))["sums"]
    assert res["success"] == pytest.approx(base["success"])


async def test_the_baseline_writes_its_answer_in_the_task_format():
    tags = await majority_baseline(spec(40))
    answer_is = await majority_baseline(spec(40, args={**ARGS, "answer_format": "the_answer_is"}))
    assert answer_is == tags and tags["success"] > 0


async def test_frozenlake_constant_moves_never_reach_the_goal_on_held_out_maps():
    lake = spec(50, "frozenlake", {"random_map": True, "eval_fraction": 0.2})
    base = await majority_baseline(lake)
    # the goal is down *and* right of the start: one move repeated reaches it on no map
    assert base["success"] == 0.0


async def test_tasks_without_eval_problems_are_not_evaluated(chat):
    assert await evaluate([spec(0)], chat, Answering(chat, _sum)) == {}
