"""CodeEnv graded by the real bubblewrap sandbox (default): right code scores 1, wrong less, garbage 0."""

import pytest

from engine.actor_args import task_specs
from engine.config import load_config
from engine.envs.code import PROBLEMS, CodeEnv, extract_code
from engine.envs.registry import make_env
from engine.types import Profile
from tests.unit.infra.sandbox.api_replay import LOG, NS, POD, PODS, POLICY, ApiReplay, kubeconfig, recorded

SOLUTIONS = {
    "add": "def add(a, b):\n    return a + b",
    "reverse_string": "def reverse_string(s):\n    return s[::-1]",
    "fizzbuzz": (
        "def fizzbuzz(n):\n"
        "    return 'FizzBuzz' if n % 15 == 0 else 'Fizz' if n % 3 == 0 else 'Buzz' if n % 5 == 0 else str(n)"
    ),
    "max_of_list": "def max_of_list(xs):\n    return max(xs)",
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())",
    "is_palindrome": "def is_palindrome(s):\n    return s == s[::-1]",
    "factorial": "import math\ndef factorial(n):\n    return math.factorial(n)",
    "sum_of_evens": "def sum_of_evens(xs):\n    return sum(x for x in xs if x % 2 == 0)",
    "fibonacci": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a",
    "count_words": "def count_words(s):\n    return len(s.split())",
}


def test_extract_code_prefers_the_last_fence_then_the_answer_tag():
    assert extract_code("x ```python\nold\n``` y ```python\nnew = 1\n``` z") == "new = 1"
    assert extract_code("```\nprint(1)\n```") == "print(1)"
    assert extract_code("<answer>def f(): pass</answer>") == "def f(): pass"
    assert extract_code("  ") == ""


async def test_every_reference_solution_scores_one():
    assert [p.name for p in PROBLEMS] == list(SOLUTIONS)
    for seed, problem in enumerate(PROBLEMS):
        env = CodeEnv()
        obs = await env.reset(seed)
        assert f"`{problem.signature}`" in obs
        step = await env.step(f"Here it is:\n```python\n{SOLUTIONS[problem.name]}\n```")
        total = len(problem.tests)
        assert (step.reward, step.done) == (1.0, True), (problem.name, step.info)
        assert step.info == {
            "passed": total,
            "total": total,
            "success": True,
            "invalid": False,
            "sandbox": {"returncode": 0, "timed_out": False},
        }


async def test_wrong_solution_scores_the_fraction_it_passes():
    env = CodeEnv(problem="add")
    await env.reset(0)
    step = await env.step("<answer>def add(a, b):\n    return a - b</answer>")  # right only for (0, 0)
    assert (step.reward, step.info["passed"], step.info["total"], step.info["success"]) == (0.25, 1, 4, False)
    assert step.observation == "Passed 1 of 4 tests."


@pytest.mark.parametrize(
    "answer",
    [
        "I do not know how to do this.",  # no code: a syntax error in the sandbox
        "```python\ndef wrong_name(a, b):\n    return a + b\n```",
        "```python\nimport sys\nsys.exit(3)\n```",
        # a forged harness line: expected values are compared outside the sandbox, so lying does not pay
        '```python\nimport os\nprint(\'__HIDDEN_TEST_RESULTS__ ["1", "1", "1", "1"]\', flush=True)\n'
        "os._exit(0)\n```",
    ],
)
async def test_garbage_scores_zero_without_raising(answer: str):
    env = CodeEnv(problem="add")
    await env.reset(0)
    step = await env.step(answer)
    assert (step.reward, step.done, step.info["passed"], step.info["invalid"]) == (0.0, True, 0, False)


async def test_empty_answer_is_invalid_and_a_hang_times_out():
    env = CodeEnv(problem="factorial", timeout_s=1.0)
    await env.reset(0)
    empty = await env.step("<answer> </answer>")
    assert (empty.reward, empty.info["invalid"], empty.info["sandbox"]) == (0.0, True, None)
    await env.reset(1)
    hang = await env.step("```python\nwhile True:\n    pass\n```")
    assert (hang.reward, hang.info["sandbox"]) == (0.0, {"returncode": None, "timed_out": True})


async def test_seed_picks_the_problem_and_step_needs_a_reset():
    env = make_env("code")
    assert isinstance(env, CodeEnv) and env.default_profile is Profile.DECODE_HEAVY
    assert (await env.reset(len(PROBLEMS) + 2)).startswith(PROBLEMS[2].statement)
    await env.step("x")
    with pytest.raises(RuntimeError, match="call reset"):
        await env.step("x")
    with pytest.raises(ValueError, match=r"unknown code problem 'ad' \(did you mean 'add'\?\)"):
        CodeEnv(problem="ad")


async def test_a_code_task_on_the_kubernetes_sandbox_grades_what_its_pod_printed(tmp_path):
    """The config's choice reaches the env (task_specs → env args) and the harness runs in a pod; the
    cluster is the replaying API server of tests/unit/infra/sandbox (no live cluster)."""
    api = ApiReplay()
    try:
        api.script(
            {
                f"GET {POLICY}/rollart-sandbox-deny-all": [(404, recorded("networkpolicy-not-found.json"))],
                f"POST {POLICY}": [(201, recorded("networkpolicy-created.json"))],
                f"POST {PODS}": [(201, recorded("pod-created.json"))],
                f"GET {POD}": [(200, recorded("pod-succeeded.json"))],
                f"GET {LOG}": [(200, '\n__HIDDEN_TEST_RESULTS__ ["3", "0", "42", "-1"]\n')],
                f"DELETE {POD}": [(200, recorded("pod-deleted.json"))],
            }
        )
        path = kubeconfig(tmp_path, api.url)
        cfg = load_config(
            data={"tasks": [{"env": "code", "env_args": {"problem": "add"}}]},
            overrides=[
                "backends.sandbox=kubernetes",
                f"backends.kubernetes_sandbox={{kubeconfig: {path}, namespace: {NS}}}",
            ],
        )
        (spec,) = task_specs(cfg)
        env = make_env(spec.env, **spec.env_args)
        await env.reset(0)
        step = await env.step(f"```python\n{SOLUTIONS['add']}\n```")
    finally:
        api.close()
    assert (step.reward, step.info["passed"]) == (0.75, 3)
    assert step.info["sandbox"] == {"returncode": 0, "timed_out": False}
    harness = api.calls[2].body["spec"]["containers"][0]["command"][5]
    assert repr(SOLUTIONS["add"]) in harness  # the harness, with the answer's code, ran in the pod
    assert api.sequence()[-1] == f"DELETE {POD}"
