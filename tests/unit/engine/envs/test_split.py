"""The held-out split is on the text: disjoint from training by content, whatever seeds or indices say."""

import pytest
import reasoning_gym as rg

from engine.envs.frozenlake import FrozenLakeEnv, eval_map
from engine.envs.reasoning_gym import ReasoningGymEnv
from engine.envs.split import bucket, check_split, held_out, problem_id


def test_bucket_is_a_fixed_uniform_function_of_the_text():
    texts = [f"Calculate {a} + {b}." for a in range(40) for b in range(40)]
    buckets = [bucket(t) for t in texts]
    assert buckets == [bucket(t) for t in texts]
    assert all(0.0 <= b < 1.0 for b in buckets)
    share = sum(held_out(t, 0.2) for t in texts) / len(texts)
    assert share == pytest.approx(0.2, abs=0.03)  # 1600 texts: ±3 standard errors
    assert problem_id("x") == problem_id("x") != problem_id("y")


@pytest.mark.parametrize(
    ("split", "fraction", "match"),
    [
        ("test", 0.2, "split must be"),
        ("train", 0.6, "eval_fraction must be"),
        ("eval", 0.0, "needs eval_fraction"),
    ],
)
def test_bad_splits_are_refused(split, fraction, match):
    with pytest.raises(ValueError, match=match):
        check_split(split, fraction)


async def _texts(env, seeds) -> list[str]:
    return [await env.reset(s) for s in seeds]


async def test_reasoning_gym_eval_problems_are_distinct_and_never_posed_in_training():
    # one animal, one of it: few distinct questions, repeated many times among the 600 entries
    args = dict(size=600, dataset_seed=3, min_animals=1, max_animals=1, max_instances=1)
    train = ReasoningGymEnv("leg_counting", eval_fraction=0.3, **args)
    evals = ReasoningGymEnv("leg_counting", eval_fraction=0.3, split="eval", **args)
    data = rg.create_dataset("leg_counting", size=600, seed=3, min_animals=1, max_animals=1, max_instances=1)
    distinct = {e["question"] for e in data}
    assert len(distinct) < 60  # the repeats that made seed-based hold-outs overlap
    eval_texts = await _texts(evals, range(evals.num_problems))
    assert len(set(eval_texts)) == len(eval_texts) == evals.num_problems > 0
    train_texts = set(await _texts(train, range(train.num_problems)))
    assert not train_texts & set(eval_texts)
    assert len(train_texts) + len(eval_texts) == len(distinct)  # every question is on exactly one side
    # any training seed lands on the training side
    assert not set(await _texts(train, [7, 2**31 - 1, 123456789])) & set(eval_texts)


async def test_frozenlake_eval_maps_are_distinct_and_no_training_seed_draws_one():
    train = FrozenLakeEnv(random_map=True, eval_fraction=0.2)
    evals = FrozenLakeEnv(random_map=True, eval_fraction=0.2, split="eval")
    eval_texts = await _texts(evals, range(60))
    assert len(set(eval_texts)) == 60
    assert all(held_out("\n".join(eval_map(i, 4, 0.8, 0.2)), 0.2) for i in range(60))
    train_texts = set(await _texts(train, range(0, 2**31, 2**31 // 3000)))
    assert len(train_texts) > 500 and not train_texts & set(eval_texts)


def test_the_fixed_map_has_no_held_out_split():
    with pytest.raises(ValueError, match="needs random_map"):
        FrozenLakeEnv(eval_fraction=0.2)
