import asyncio
import re
from collections.abc import Iterator

import pytest
from gem.core import Env as GemGame
from gem.envs.registration import ENV_REGISTRY, register

from engine.envs.gem import GemEnv
from engine.envs.registry import make_env

GUESS = "game:GuessTheNumber-v0-easy"  # 1..10 in 4 turns: binary search always wins


async def binary_search(env: GemEnv, seed: int) -> tuple[int, list[str], float]:
    """Plays GuessTheNumber to the end; returns the number of guesses, observations, last reward."""
    observations = [await env.reset(seed)]
    low, high = 1, 10
    for turn in range(1, 5):
        guess = (low + high) // 2
        step = await env.step(f"I guess \\boxed{{{guess}}}")
        observations.append(step.observation)
        assert step.info["invalid"] is False
        if step.done:
            return turn, observations, step.reward
        assert step.reward == 0.0
        assert step.observation.endswith("Enter your next guess.")
        if "higher" in step.observation:
            low = guess + 1
        else:
            high = guess - 1
    raise AssertionError("binary search did not finish in 4 guesses")


async def test_guess_the_number_is_won_by_binary_search():
    env = GemEnv(GUESS)
    first = await env.reset(0)
    assert "between 1 and 10" in first and first.endswith("Enter your next guess.")
    turns, observations, reward = await binary_search(env, seed=0)
    assert reward == 1.0
    assert observations[-1].startswith("Congratulations! You guessed the correct number") and turns <= 4


async def test_tower_of_hanoi_plays_to_done():
    env = GemEnv("game:TowerofHanoi-v0-easy")
    assert "A: [3, 2, 1]" in await env.reset(3)
    moves = ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]
    steps = [await env.step(f"\\boxed{{{m}}}") for m in moves]
    assert [s.done for s in steps] == [False] * 6 + [True]
    assert [s.reward for s in steps] == [0.0] * 6 + [1.0]
    assert steps[2].observation.endswith("A: [3]\nB: [2, 1]\nC: []\n\nEnter your move.")
    assert steps[-1].info["terminated"] is True and steps[-1].info["truncated"] is False


async def test_same_seed_same_game_even_when_resets_overlap():
    envs = [GemEnv(GUESS) for _ in range(4)]
    results = await asyncio.gather(*(binary_search(env, seed=11) for env in envs))
    assert all(r == results[0] for r in results)
    targets = {
        re.search(r"number (\d+)", (await binary_search(GemEnv(GUESS), s))[1][-1]).group(1) for s in range(8)
    }
    assert len(targets) > 1


async def test_game_args_override_registered_ones():
    env = GemEnv(GUESS, max_number=3, max_turns=2)
    assert "between 1 and 3 (inclusive) within 2 turns" in await env.reset(0)


async def test_unparseable_move_is_what_the_game_makes_of_it():
    env = GemEnv(GUESS)
    await env.reset(0)
    step = await env.step("\udcff no number")
    assert (step.reward, step.done, step.info["invalid"]) == (-0.1, True, False)  # GEM: format error ends it
    assert step.observation == "At turn 1, you did not provide a valid guess."


class _Raising(GemGame):
    def __init__(self, **_):
        super().__init__()

    def reset(self, seed=None):
        return "Say anything.", {"suffix": "Go."}

    def step(self, action):
        if action == "ok":
            return "Done.", 1.0, True, False, {}
        raise ValueError(f"cannot parse {action!r}")


@pytest.fixture
def raising_game() -> Iterator[str]:
    game_id = "test:Raising-v0"
    register(game_id, _Raising)
    yield game_id
    del ENV_REGISTRY[game_id]


async def test_a_game_that_raises_makes_an_invalid_move(raising_game: str):
    env = GemEnv(raising_game, invalid_penalty=-0.3)
    assert await env.reset(0) == "Say anything.\nGo."
    step = await env.step("???")
    assert (step.observation, step.reward, step.done) == ("Invalid move.", -0.3, False)
    assert step.info == {"invalid": True, "error": "ValueError: cannot parse '???'"}
    last = await env.step("ok")
    assert (last.observation, last.reward, last.done) == ("Done.", 1.0, True)


async def test_step_needs_an_episode():
    env = GemEnv(GUESS)
    with pytest.raises(RuntimeError, match="reset"):
        await env.step("\\boxed{5}")


def test_unknown_game_suggests_close_ids():
    with pytest.raises(ValueError, match=r"did you mean 'game:GuessTheNumber-v0-easy'"):
        GemEnv("game:GuessTheNumber-v0-eazy")


def test_unknown_game_argument_is_named():
    with pytest.raises(
        TypeError, match=r"unexpected argument\(s\) max_nmber; accepted: min_number, max_number"
    ):
        make_env("gem", game_id=GUESS, max_nmber=5)
