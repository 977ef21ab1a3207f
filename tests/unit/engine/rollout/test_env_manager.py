import asyncio

from engine.envs.base import Env, EnvStep
from engine.envs.frozenlake import FrozenLakeEnv
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import EnvManager, TurnLimits
from engine.types import Failure, FailureReason, Trajectory, TrajStatus
from tests.unit.engine.rollout.fakes import ScriptedGenerator, tokenizer

OPTIMAL = ["Down", "Down", "Right", "Right", "Down", "Right"]  # standard 4x4 map, not slippery
LIMITS = TurnLimits(max_turns=10, max_tokens=4, max_context=1024)


def manager(env: Env, gen: ScriptedGenerator, limits: TurnLimits = LIMITS, **kw) -> EnvManager:
    return EnvManager(env, ChatFormat(tokenizer()), gen, limits, "prefill-heavy", **kw)


async def test_frozenlake_episode_records_exact_token_deltas():
    gen = ScriptedGenerator(lambda k: OPTIMAL[k], version=3)
    t = await manager(FrozenLakeEnv(), gen).run(Trajectory("t0", "g0", "frozenlake", seed=0))
    assert t.status == TrajStatus.DONE and t.info["success"] is True
    assert [x.action_text for x in t.turns] == OPTIMAL
    assert t.env_return == 1.0 and t.start_version == 3 and t.versions == [3] * 6
    # the context the model saw at turn k is exactly the concatenated deltas before it
    for k, req in enumerate(gen.requests):
        ctx = []
        for turn in t.turns[:k]:
            ctx += turn.obs_ids + turn.action_ids
        assert req.prompt_ids == ctx + t.turns[k].obs_ids
        assert req.trajectory_id == "t0" and req.profile == "prefill-heavy"
    assert all(len(x.action_logprobs) == len(x.action_ids) for x in t.turns)
    assert t.timings["total_s"] >= t.timings["env_s"] > 0


async def test_invalid_actions_are_moves_and_max_turns_truncates():
    gen = ScriptedGenerator(lambda k: "fly away")
    t = await manager(FrozenLakeEnv(), gen, TurnLimits(max_turns=3, max_tokens=4, max_context=1024)).run(
        Trajectory("t", "g", "frozenlake", 0)
    )
    assert t.status == TrajStatus.TRUNCATED and t.info["truncated"] == "max_turns"
    assert len(t.turns) == 3 and t.env_return == -0.1 * 3


async def test_max_context_truncates_instead_of_failing():
    gen = ScriptedGenerator(lambda k: "Left")
    t = await manager(FrozenLakeEnv(), gen, TurnLimits(max_turns=50, max_tokens=4, max_context=400)).run(
        Trajectory("t", "g", "frozenlake", 0)
    )
    assert t.status == TrajStatus.TRUNCATED and t.info["truncated"] == "max_context"
    assert len(t.turns) >= 2 and all(len(r.prompt_ids) + 4 <= 400 for r in gen.requests)
    grown = sum(len(x.obs_ids) + len(x.action_ids) for x in t.turns)
    assert grown + 4 > 400 - 60  # the next turn (its observation is < 60 tokens) would not have fit


class Broken(Env):
    name = "broken"

    def __init__(self, fail_at: str, hang: bool = False):
        self.fail_at, self.hang = fail_at, hang

    async def reset(self, seed: int) -> str:
        if self.fail_at == "reset":
            raise RuntimeError("sandbox died")
        return "obs"

    async def step(self, action: str) -> EnvStep:
        if self.hang:
            await asyncio.Event().wait()
        raise OSError("pipe closed")


async def test_env_errors_and_hangs_fail_the_trajectory_with_a_reason():
    gen = ScriptedGenerator(lambda k: "x")
    t = await manager(Broken("reset"), gen).run(Trajectory("t", "g", "b", 0))
    assert t.status == TrajStatus.FAILED
    assert t.failure == Failure(FailureReason.EPISODE_ERROR, "sandbox died", "RuntimeError")
    t = await manager(Broken("step"), gen).run(Trajectory("t", "g", "b", 0))
    assert t.status == TrajStatus.FAILED and str(t.failure) == "OSError: pipe closed"
    limits = TurnLimits(max_turns=3, max_tokens=4, max_context=1024, env_timeout_s=0.05)
    t = await manager(Broken("step", hang=True), gen, limits).run(Trajectory("t", "g", "b", 0))
    assert t.status == TrajStatus.FAILED and t.failure == Failure(FailureReason.ENV_TIMEOUT)


async def test_should_abort_is_checked_after_every_generation():
    gen = ScriptedGenerator(lambda k: "Right")
    seen = []

    stale = Failure(FailureReason.STALE, "test")

    def stale_after_two(traj: Trajectory, version: int) -> Failure | None:
        seen.append(len(traj.turns))
        return stale if len(traj.turns) == 2 else None

    t = await manager(FrozenLakeEnv(), gen, should_abort=stale_after_two).run(Trajectory("t", "g", "f", 0))
    assert t.status == TrajStatus.ABORTED and t.failure is stale and seen == [1, 2]


async def test_a_response_prefix_is_context_and_the_env_reads_the_whole_reply():
    limits = TurnLimits(max_turns=10, max_tokens=8, max_context=1024, response_prefix="<answer>")
    gen = ScriptedGenerator(lambda k: OPTIMAL[k] + "</answer>")
    chat = ChatFormat(tokenizer())
    t = await EnvManager(FrozenLakeEnv(), chat, gen, limits, "prefill-heavy").run(
        Trajectory("t", "g", "f", 0)
    )
    assert t.status == TrajStatus.DONE and t.info["success"] is True
    assert [x.action_text for x in t.turns] == [f"<answer>{m}</answer>" for m in OPTIMAL]
    prefix = chat.tok.encode("<answer>", add_special_tokens=False)
    for k, req in enumerate(gen.requests):  # every turn's prompt ends with the prefill; actions exclude it
        assert req.prompt_ids[-len(prefix) :] == prefix == t.turns[k].obs_ids[-len(prefix) :]
        assert chat.decode(t.turns[k].action_ids).startswith(OPTIMAL[k])
