import random

import pytest
import reasoning_gym as rg

from engine.envs.reasoning_gym import ReasoningGymEnv

FORMAT = "Give only the final answer inside <answer></answer>."


def test_without_holdout_every_seed_is_taken_mod_size():
    env = ReasoningGymEnv("basic_arithmetic", size=50, dataset_seed=1)
    assert [env.entry_index(s) for s in (0, 49, 50, 123, -1)] == [0, 49, 0, 23, 49]


def test_holdout_entries_are_reached_only_by_their_own_seeds():
    env = ReasoningGymEnv("basic_arithmetic", size=50, dataset_seed=1, holdout=10)
    assert [env.entry_index(s) for s in range(40, 50)] == list(range(40, 50))  # eval seeds
    assert [env.entry_index(s) for s in (0, 39, 50, 89, 90, -1)] == [0, 39, 10, 9, 10, 39]
    draws = random.Random(0).sample(range(50, 2**31), 5000)  # training seeds, as the scheduler draws them
    assert {env.entry_index(s) for s in draws} == set(range(40))


async def test_reset_poses_the_indexed_entry():
    env = ReasoningGymEnv("basic_arithmetic", size=50, dataset_seed=1, holdout=10)
    reference = rg.create_dataset("basic_arithmetic", size=50, seed=1)
    assert await env.reset(45) == f"{reference[45]['question']}\n{FORMAT}"
    assert await env.reset(85) == f"{reference[5]['question']}\n{FORMAT}"


@pytest.mark.parametrize("holdout", [-1, 50, 51])
def test_holdout_must_leave_entries_to_train_on(holdout: int):
    with pytest.raises(ValueError, match=r"holdout must be in \[0, size=50\)"):
        ReasoningGymEnv("basic_arithmetic", size=50, holdout=holdout)
