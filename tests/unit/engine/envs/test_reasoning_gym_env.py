import re

import pytest
import reasoning_gym as rg

import engine.envs.reasoning_gym as rg_env
from engine.envs.reasoning_gym import ReasoningGymEnv, load_dataset
from engine.types import Profile

FORMAT = "Give only the final answer inside <answer></answer>."


def test_profile_is_decode_heavy():
    assert ReasoningGymEnv.default_profile is Profile.DECODE_HEAVY


async def test_reset_poses_entry_seed_mod_size():
    env = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1)
    reference = rg.create_dataset("basic_arithmetic", size=5, seed=1)
    for seed in range(5):
        assert await env.reset(seed) == f"{reference[seed]['question']}\n{FORMAT}"
    assert await env.reset(7) == await env.reset(2)
    assert await env.reset(-3) == await env.reset(2)
    assert len({await env.reset(s) for s in range(5)}) == 5


async def test_correct_answer_scores_one_and_ends_episode():
    env = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1)
    obs = await env.reset(0)
    assert obs.startswith("Calculate 5 - 3 - 6.")  # = -4
    step = await env.step("5 - 3 = 2, 2 - 6 = -4. <answer> -4 </answer>")
    assert (step.reward, step.done) == (1.0, True)
    assert step.info == {
        "answer": "-4",
        "success": True,
        "lenient": True,
        "partial": 1.0,
        "formatted": True,
        "attempt": 1,
    }
    await env.reset(0)
    assert (await env.step("  -4\n")).reward == 1.0  # no tag: the stripped text


async def test_wrong_answers_score_zero_and_partial_credit_is_opt_in():
    env = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1)
    await env.reset(0)
    step = await env.step("<answer>7</answer>")
    assert (step.reward, step.done, step.info["success"]) == (0.0, True, False)
    await env.reset(0)
    near = await env.step("<answer>-4 apples</answer>")  # graded: len("-4") / len("-4 apples")
    assert (near.reward, near.info["success"]) == (0.0, False)
    assert near.info["partial"] == pytest.approx(2 / 9) and near.info["lenient"] is True
    graded = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1, partial_credit=True)
    await graded.reset(0)
    step = await graded.step("<answer>-4 apples</answer>")
    assert step.reward == pytest.approx(2 / 9) and step.info["success"] is False


async def test_format_reward_is_added_for_answer_tags_only():
    env = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1, format_reward=0.1)
    await env.reset(0)
    assert (await env.step("<answer>7</answer>")).reward == pytest.approx(0.1)
    await env.reset(0)
    assert (await env.step("<answer>-4</answer>")).reward == pytest.approx(1.1)
    await env.reset(0)
    plain = await env.step("-4")
    assert plain.reward == 1.0 and plain.info["formatted"] is False


@pytest.mark.parametrize(
    ("output", "given", "formatted"),
    [
        ("5 - 3 = 2, 2 - 6 = -4\nThe answer is -4.", "-4", True),
        ("the answer is 2. No wait: The answer is -4 \nbecause 5 - 3 - 6 = -4", "-4", True),
        ("The answer is -4 apples.", "-4 apples", True),
        ("The answer is", "", True),
        ("  -4\n", "-4", False),
        ("<answer>-4</answer>", "<answer>-4</answer>", False),
    ],
)
async def test_the_answer_is_format_reads_the_rest_of_its_last_line(output, given, formatted):
    env = ReasoningGymEnv(
        "basic_arithmetic", size=5, dataset_seed=1, answer_format="the_answer_is", format_reward=0.5
    )
    obs = await env.reset(0)  # answer -4
    assert env.instructions.endswith('End your reply with "The answer is N." where N is the final answer.')
    assert obs.endswith('\nEnd your reply with "The answer is N." where N is the final answer.')
    step = await env.step(output)
    exact = given == "-4"
    assert (step.info["success"], step.info["formatted"]) == (exact, formatted)
    assert step.reward == pytest.approx(float(exact) + 0.5 * formatted)


def test_unknown_answer_format_is_refused():
    with pytest.raises(ValueError, match=r"unknown answer_format 'answer_is'.*known: tags, the_answer_is"):
        ReasoningGymEnv("basic_arithmetic", size=5, answer_format="answer_is")


@pytest.mark.parametrize(
    ("output", "lenient"),
    [("5 - 3 = 2, 2 - 6 = -4", True), ("it is -4.", True), ("-40", False), ("4", False), ("x-4y", False)],
)
async def test_lenient_accuracy_finds_the_answer_as_a_whole_token(output, lenient):
    env = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1)
    await env.reset(0)  # answer -4
    step = await env.step(output)
    assert step.info["lenient"] is lenient and step.info["success"] is False


@pytest.mark.parametrize("action", ["", "\udcff" * 10, "<answer></answer>", "x" * 1_000_000])
async def test_odd_answers_score_zero(action: str):
    env = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1)
    await env.reset(0)
    step = await env.step(action)
    assert (step.reward, step.done, step.info["success"]) == (0.0, True, False)


async def test_dataset_config_reaches_the_generator():
    env = ReasoningGymEnv(
        "chain_sum", size=10, dataset_seed=5, min_terms=2, max_terms=2, min_digits=1, max_digits=1
    )
    for seed in range(10):
        question = await env.reset(seed)
        a, op, b = re.search(r"(\d) ([+-]) (\d) =\n", question).groups()
        answer = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert (await env.step(f"<answer>{answer}</answer>")).reward == 1.0


def test_dataset_is_built_once_per_arguments(monkeypatch: pytest.MonkeyPatch):
    calls = []
    create = rg.create_dataset

    def counting(*args, **kwargs):
        calls.append(args)
        return create(*args, **kwargs)

    monkeypatch.setattr(rg_env.rg, "create_dataset", counting)
    for _ in range(3):
        ReasoningGymEnv("leg_counting", size=4, dataset_seed=91)
    assert len(calls) == 1
    ReasoningGymEnv("leg_counting", size=4, dataset_seed=92)
    assert len(calls) == 2
    assert load_dataset("leg_counting", 4, 91, {}) is load_dataset("leg_counting", 4, 91, {})
    assert len(calls) == 2


async def test_scorer_failure_is_a_wrong_answer(monkeypatch: pytest.MonkeyPatch):
    env = ReasoningGymEnv("basic_arithmetic", size=3, dataset_seed=2)

    def boom(self, answer, entry):
        raise KeyError("scorer broke")

    monkeypatch.setattr(type(load_dataset("basic_arithmetic", 3, 2, {})), "score_answer", boom)
    await env.reset(0)
    step = await env.step("<answer>1</answer>")
    assert (step.reward, step.done, step.info["success"]) == (0.0, True, False)
    assert step.info["score_error"] == "KeyError: 'scorer broke'"


async def test_step_needs_an_episode():
    env = ReasoningGymEnv("basic_arithmetic", size=3)
    with pytest.raises(RuntimeError, match="reset"):
        await env.step("1")
    await env.reset(0)
    await env.step("1")
    with pytest.raises(RuntimeError, match="reset"):
        await env.step("1")


def test_unknown_dataset_lists_close_matches_first():
    with pytest.raises(
        ValueError, match=r"'basic_arithmatic' \(did you mean 'basic_arithmetic'.*known: ab, acre"
    ):
        ReasoningGymEnv("basic_arithmatic")


def test_bad_config_names_the_argument():
    with pytest.raises(TypeError, match=r"bogus.*config fields: min_terms"):
        ReasoningGymEnv("chain_sum", size=3, bogus=1)
    with pytest.raises(ValueError, match="max_terms must be >= min_terms"):
        ReasoningGymEnv("chain_sum", size=3, min_terms=5, max_terms=2)
    with pytest.raises(ValueError, match="size"):
        ReasoningGymEnv("chain_sum", size=0)


async def test_attempts_give_a_wrong_answer_another_try_until_they_run_out():
    env = ReasoningGymEnv("basic_arithmetic", size=5, dataset_seed=1, attempts=3)
    question = await env.reset(0)  # 5 - 3 - 6 = -4
    tries = [await env.step(f"<answer>{a}</answer>") for a in ("2", "-5", "-4")]
    assert [(t.reward, t.done, t.info["attempt"], t.info["success"]) for t in tries] == [
        (0.0, False, 1, False), (0.0, False, 2, False), (1.0, True, 3, True),
    ]  # fmt: skip
    assert tries[0].observation == f"That is not right. Try again.\n{FORMAT}"
    assert await env.reset(0) == question
    first = await env.step("<answer>-4</answer>")
    assert (first.reward, first.done, first.info["attempt"]) == (1.0, True, 1)  # a new episode counts afresh
    await env.reset(0)
    last = [await env.step("<answer>7</answer>") for _ in range(3)][-1]
    assert (last.reward, last.done, last.info["attempt"]) == (0.0, True, 3)
    with pytest.raises(RuntimeError, match="needs an episode"):
        await env.step("<answer>-4</answer>")
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        ReasoningGymEnv("basic_arithmetic", size=5, attempts=0)
