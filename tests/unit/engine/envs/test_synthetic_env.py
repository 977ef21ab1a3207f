import pytest

from engine.envs.registry import make_env
from engine.envs.synthetic import SyntheticEnv


async def test_episode_ends_after_exactly_turns_steps_whatever_the_action():
    env = SyntheticEnv(turns=3)
    assert await env.reset(7) == "step 0 of 3"
    steps = [await env.step(action) for action in ("", "garbage <answer>x</answer>", "left")]
    assert [s.done for s in steps] == [False, False, True]
    assert [s.reward for s in steps] == [0.0, 0.0, 1.0]
    assert [s.observation for s in steps] == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]


async def test_reset_starts_a_new_episode_of_the_same_length():
    env = SyntheticEnv(turns=2)
    await env.reset(0)
    await env.step("a")
    assert (await env.step("b")).done
    await env.reset(1)
    assert not (await env.step("c")).done
    assert (await env.step("d")).done


async def test_stepping_past_the_end_is_an_error():
    env = SyntheticEnv(turns=1)
    await env.reset(0)
    await env.step("a")
    with pytest.raises(RuntimeError, match="already ended after 1 steps; reset first"):
        await env.step("b")


def test_turns_must_be_positive():
    with pytest.raises(ValueError, match="turns must be >= 1, got 0"):
        SyntheticEnv(turns=0)


async def test_registered_as_synthetic():
    env = make_env("synthetic", turns=4)
    assert isinstance(env, SyntheticEnv) and env.turns == 4


async def test_mixed_lengths_are_drawn_per_seed_within_the_range():
    env = SyntheticEnv(turns=1, max_turns=10)
    lengths = []
    for seed in range(200):
        await env.reset(seed)
        lengths.append(env.turns)
    assert min(lengths) == 1 and max(lengths) == 10 and len(set(lengths)) == 10
    await env.reset(3)
    again = env.turns
    await env.reset(3)
    assert env.turns == again == lengths[3]  # a group's members (one seed) share a length
    with pytest.raises(ValueError, match="max_turns must be >= turns"):
        SyntheticEnv(turns=4, max_turns=2)
