"""Code execution: the model writes a small Python function, hidden tests grade it in the sandbox.

One long generation per episode and one step make it a decode-heavy task. The hidden tests' inputs
enter the sandbox, their expected values never do: the sandboxed harness prints the `repr` of each
result and the comparison happens here, so code that prints its own verdict cannot grade itself.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from engine.envs.base import Env, EnvStep, extract_answer, unknown_choice
from engine.types import Profile
from infra.sandbox import make_sandbox

_FENCE = "```"
_MARKER = "__HIDDEN_TEST_RESULTS__ "
# Runs the solution source in its own namespace (a syntax error fails every test, not the harness),
# then prints one line: the repr of each test's result, or null where the call raised.
_HARNESS = """import json
_ns = {"__name__": "solution"}
try:
    exec(compile(%(source)r, "solution.py", "exec"), _ns)
except BaseException:
    pass
_results = []
for _args in %(inputs)r:
    try:
        _results.append(repr(_ns[%(name)r](*_args)))
    except BaseException:
        _results.append(None)
print()
print(%(marker)r + json.dumps(_results))
"""


@dataclass(frozen=True)
class Problem:
    name: str  # the function to define
    signature: str
    statement: str
    tests: tuple[tuple[tuple[Any, ...], Any], ...]  # (arguments, expected result)


PROBLEMS: tuple[Problem, ...] = (
    Problem("add", "add(a, b)", "Return the sum of the integers a and b.",
            (((1, 2), 3), ((-5, 5), 0), ((10, 32), 42), ((0, 0), 0))),
    Problem("reverse_string", "reverse_string(s)", "Return the string s reversed.",
            ((("abc",), "cba"), (("",), ""), (("Hello",), "olleH"), (("ab c",), "c ba"))),
    Problem("fizzbuzz", "fizzbuzz(n)",
            "Return 'FizzBuzz' if n is divisible by 15, 'Fizz' if by 3, 'Buzz' if by 5, else str(n).",
            (((3,), "Fizz"), ((5,), "Buzz"), ((15,), "FizzBuzz"), ((7,), "7"), ((30,), "FizzBuzz"))),
    Problem("max_of_list", "max_of_list(xs)", "Return the largest number of the non-empty list xs.",
            ((([1, 5, 3],), 5), (([-2, -9],), -2), (([7],), 7), (([0, 0, 1],), 1))),
    Problem("count_vowels", "count_vowels(s)", "Return how many letters of s are vowels (aeiou, any case).",
            ((("hello",), 2), (("xyz",), 0), (("AEIOU",), 5), (("Programming",), 3))),
    Problem("is_palindrome", "is_palindrome(s)", "Return True if the string s reads the same backwards.",
            ((("racecar",), True), (("abc",), False), (("",), True), (("abba",), True))),
    Problem("factorial", "factorial(n)", "Return n! for an integer n >= 0.",
            (((0,), 1), ((1,), 1), ((5,), 120), ((10,), 3628800))),
    Problem("sum_of_evens", "sum_of_evens(xs)", "Return the sum of the even integers in the list xs.",
            ((([1, 2, 3, 4],), 6), (([],), 0), (([1, 3],), 0), (([-2, 2, 10],), 10))),
    Problem("fibonacci", "fibonacci(n)", "Return Fibonacci number n (0, 1, 1, 2, 3, 5, ... from n = 0).",
            (((0,), 0), ((1,), 1), ((10,), 55), ((20,), 6765))),
    Problem("count_words", "count_words(s)", "Return the number of whitespace-separated words in s.",
            ((("hello world",), 2), (("",), 0), (("  a  b c ",), 3), (("one",), 1))),
)  # fmt: skip
_BY_NAME = {p.name: p for p in PROBLEMS}


def extract_code(text: str) -> str:
    """The last fenced code block of `text` (its language tag dropped), else the `<answer>` content.

    Found with `rfind`, like `extract_answer`, so adversarial output costs linear time.
    """
    end = text.rfind(_FENCE)
    start = text.rfind(_FENCE, 0, end) if end >= 0 else -1
    if start < 0:
        return extract_answer(text)
    block = text[start + len(_FENCE) : end]
    first, newline, rest = block.partition("\n")
    return (rest if newline and first.strip().isidentifier() else block).strip()


def _parse_results(stdout: str) -> list[str | None] | None:
    """The harness's result line (the last one carrying the marker), or None when it never printed."""
    at = stdout.rfind(_MARKER)
    if at < 0:
        return None
    try:
        results = json.loads(stdout[at + len(_MARKER) :].partition("\n")[0])
    except ValueError:
        return None
    return results if isinstance(results, list) else None


class CodeEnv(Env):
    """One step: the answer's code is run against the problem's hidden tests in `infra.sandbox`.

    Reward = fraction of tests passed; `info["success"]` when all pass. An answer with no code is
    invalid (reward 0). `problem` fixes the problem; otherwise the reset seed picks one. `sandbox`:
    `make_sandbox`'s arguments, which the run sets from `backends.sandbox` (default: bubblewrap).
    """

    name = "code"
    default_profile = Profile.DECODE_HEAVY
    instructions = (
        "Code: write the Python function the task asks for. Put the code in a ```python ... ``` block "
        "or inside <answer>...</answer>; it is graded by hidden tests."
    )

    def __init__(
        self, problem: str | None = None, timeout_s: float = 5.0, sandbox: dict[str, Any] | None = None
    ) -> None:
        if problem is not None and problem not in _BY_NAME:
            raise unknown_choice("code problem", problem, list(_BY_NAME))
        if timeout_s <= 0:
            raise ValueError(f"code env: timeout_s must be > 0, got {timeout_s}")
        self.problem_name = problem
        self.timeout_s = timeout_s
        self.problem: Problem | None = None
        self.sandbox = make_sandbox(**(sandbox or {}))

    async def reset(self, seed: int) -> str:
        name = self.problem_name
        self.problem = _BY_NAME[name] if name else PROBLEMS[seed % len(PROBLEMS)]
        return (
            f"{self.problem.statement}\nWrite a Python function `{self.problem.signature}`. "
            "Answer with the code in a ```python ... ``` block."
        )

    async def step(self, action: str) -> EnvStep:
        problem = self.problem
        if problem is None:
            raise RuntimeError("CodeEnv: step() needs an episode in progress; call reset() first")
        self.problem = None  # one step per episode
        total = len(problem.tests)
        code = extract_code(action)
        if not code:
            info: dict[str, Any] = {
                "passed": 0,
                "total": total,
                "success": False,
                "invalid": True,
                "sandbox": None,
            }
            return EnvStep("No code found.", 0.0, True, info)
        inputs = [args for args, _ in problem.tests]
        harness = _HARNESS % {"source": code, "inputs": inputs, "name": problem.name, "marker": _MARKER}
        result = await asyncio.to_thread(self.sandbox.run_python, harness, timeout_s=self.timeout_s)
        results = _parse_results(result.stdout) or []
        passed = sum(got == repr(want) for got, (_, want) in zip(results, problem.tests, strict=False))
        info = {
            "passed": passed,
            "total": total,
            "success": passed == total,
            "invalid": False,
            "sandbox": {"returncode": result.returncode, "timed_out": result.timed_out},
        }
        return EnvStep(f"Passed {passed} of {total} tests.", passed / total, True, info)
