"""LLM judge: the prompt it builds, the verdict → score rule, greedy determinism on a real tiny model."""

from collections.abc import Iterable

import pytest
import torch

from engine.backends.base import GenerationBackend
from engine.models.tiny import init_model
from engine.rollout.judge import LLMJudge, make_judge, serverless_scorer, verdict_score
from engine.rollout.reward import judge_payload
from engine.types import GenOutput, GenRequest, Trajectory, TrajStatus, Turn
from tests.unit.engine.rollout.fakes import tokenizer


def trajectory(*turns: tuple[str, str]) -> Trajectory:
    t = Trajectory("t1", "g1", "arith", 3, start_version=0, status=TrajStatus.DONE)
    for obs, action in turns:
        t.turns.append(Turn(obs, [1], action, [2], [-0.1], 0, env_reward=1.0))
    return t


class Replies(GenerationBackend):
    """Answers every request with `reply`; records the requests."""

    def __init__(self, reply: str) -> None:
        self.ids = tokenizer().encode(reply, add_special_tokens=False)
        self.requests: list[GenRequest] = []

    async def generate(self, request: GenRequest) -> GenOutput:
        self.requests.append(request)
        return GenOutput(request.request_id, self.ids, [-0.1] * len(self.ids), 0, "length")

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        raise NotImplementedError


@pytest.mark.parametrize(
    ("reply", "score"),
    [("yes", 1.0), (" Yes, it is.", 1.0), ("YES", 1.0), ("no", 0.0), ("No.", 0.0), ("maybe", 0.0),
     ("yesterday", 0.0), ("", 0.0), ("I think yes", 0.0)],
)  # fmt: skip
def test_first_word_decides_the_verdict(reply, score):
    assert verdict_score(reply) == score


async def test_prompt_has_first_observation_as_task_and_last_action_as_answer():
    backend = Replies("Yes")
    judge = LLMJudge(backend, tokenizer())
    traj = trajectory(("What is 2+3?", "think"), ("Go on.", "<answer>5</answer>"))
    assert await judge(judge_payload(traj)) == 1.0
    (request,) = backend.requests
    assert request.sampling.temperature == 0.0 and request.sampling.max_tokens == 4
    assert tokenizer().decode(request.prompt_ids) == (
        "<|im_start|>user\nTask (arith): What is 2+3?\nAnswer: <answer>5</answer>\n"
        "Is the answer correct? Reply yes or no.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_long_fields_keep_the_task_head_and_the_answer_tail():
    judge = LLMJudge(Replies("no"), tokenizer(), max_field_chars=5)
    prompt = judge.prompt(judge_payload(trajectory(("abcdefgh", "12345678"))))
    assert "Task (arith): abcde\nAnswer: 45678\n" in prompt


def test_a_trajectory_without_turns_cannot_be_judged():
    with pytest.raises(ValueError, match="task 'arith' has no turns"):
        LLMJudge(Replies("no"), tokenizer()).prompt(judge_payload(trajectory()))


async def test_tiny_model_judge_is_deterministic_and_in_range(tmp_path):
    judge = make_judge(init_model("tiny", tmp_path / "judge"))
    payload = judge_payload(trajectory(("What is 2+3?", "<answer>5</answer>")))
    scores = [await judge(payload) for _ in range(3)]
    assert scores[0] in (0.0, 1.0) and scores == [scores[0]] * 3
    await judge.backend.close()


class RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def acall(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return 1


async def test_serverless_scorer_sends_the_judge_payload_and_returns_a_float():
    client = RecordingClient()
    traj = trajectory(("What is 2+3?", "<answer>5</answer>"))
    value = await serverless_scorer(client)(traj)  # the endpoint answered the JSON integer 1
    assert client.calls == [((judge_payload(traj),), {})]
    assert value == 1.0 and type(value) is float
