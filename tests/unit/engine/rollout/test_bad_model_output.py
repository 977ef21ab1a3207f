"""Bad input from the model or the env (issue 7 item 5): each has a defined outcome, none crashes a run."""

import math

from engine.envs.base import Env, EnvStep
from engine.envs.frozenlake import FrozenLakeEnv
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import EnvManager, TurnLimits
from engine.rollout.reward import RewardScorer
from engine.types import Failure, FailureReason, GenOutput, GenRequest, Trajectory, TrajStatus
from tests.unit.engine.rollout.fakes import tokenizer

LIMITS = TurnLimits(max_turns=3, max_tokens=8, max_context=1024)


class RawGenerator:
    """Answers every request with the same raw token ids (whatever a broken engine might send)."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    async def generate(self, req: GenRequest) -> GenOutput:
        return GenOutput(req.request_id, self.ids, [-1.0] * len(self.ids), 0, "length")


async def play(env: Env, ids: list[int], limits: TurnLimits = LIMITS) -> Trajectory:
    manager = EnvManager(env, ChatFormat(tokenizer()), RawGenerator(ids), limits, "prefill-heavy")
    return await manager.run(Trajectory("t", "g", "x", seed=0))


async def test_empty_model_output_is_an_invalid_move_not_a_crash():
    t = await play(FrozenLakeEnv(), [])
    assert t.status == TrajStatus.TRUNCATED and len(t.turns) == 3
    assert all(x.action_text == "" and x.action_ids == [] for x in t.turns)
    assert t.env_return == -0.1 * 3  # each empty answer is an invalid move's penalty


async def test_output_that_is_not_valid_utf8_decodes_with_replacement_characters():
    tok = tokenizer()
    byte_ids = [i for i in range(len(tok)) if tok.convert_ids_to_tokens(i) in ("\u00c3", "\u00e2")]
    assert byte_ids  # lone lead bytes of a multi-byte UTF-8 character: invalid on their own
    t = await play(FrozenLakeEnv(), byte_ids[:1] * 3)
    assert t.status == TrajStatus.TRUNCATED and "\ufffd" in t.turns[0].action_text


async def test_enormous_output_from_a_misbehaving_engine_truncates_the_trajectory():
    t = await play(FrozenLakeEnv(), [50] * 5000)  # far past max_tokens and max_context
    assert t.status == TrajStatus.TRUNCATED and t.info["truncated"] == "max_context" and len(t.turns) == 1


class LongObservation(Env):
    name = "long"

    def __init__(self, words: int, reward: float = 1.0):
        self.words, self.reward = words, reward

    async def reset(self, seed: int) -> str:
        return "word " * self.words

    async def step(self, action: str) -> EnvStep:
        return EnvStep("", self.reward, True)


async def test_a_first_observation_longer_than_the_context_fails_the_member_with_the_reason():
    t = await play(LongObservation(2000), [5])
    assert t.status == TrajStatus.FAILED and t.turns == []
    assert t.failure is not None and t.failure.reason is FailureReason.OBSERVATION_TOO_LONG
    assert "> max_context 1024" in t.failure.detail


async def test_a_nan_or_infinite_env_reward_fails_the_member_at_scoring():
    for bad in (math.nan, math.inf):
        t = await play(LongObservation(1, reward=bad), [5])
        assert t.status == TrajStatus.DONE
        scorer = RewardScorer()
        await scorer(t)
        assert t.status == TrajStatus.FAILED
        assert t.failure == Failure(FailureReason.REWARD_NOT_FINITE, str(bad))
        assert scorer.counts["failed_not_finite"] == 1 and t.reward is None
