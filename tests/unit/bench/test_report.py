import argparse
import statistics
from dataclasses import dataclass

import pytest

from bench.report import (
    at_least,
    ci_errors,
    ci_text,
    markdown_table,
    median_ci,
    names_of,
    numbers,
    or_dash,
    pick_settings,
)


@dataclass(frozen=True)
class _S:
    a: int = 1
    b: tuple[int, ...] = (1, 2)


def test_quick_is_the_base_and_given_options_override_it() -> None:
    full, quick = _S(), _S(a=5)
    assert pick_settings(argparse.Namespace(quick=False, a=None), full, quick) == full
    assert pick_settings(argparse.Namespace(quick=True, a=None), full, quick) == quick
    assert pick_settings(argparse.Namespace(quick=True, a=7, b=(3,)), full, quick) == _S(7, (3,))


def test_markdown_table() -> None:
    text = markdown_table(
        [{"fleet": "h20", "step_s": 1.23456, "cfg": {"x": 1}}, {"fleet": "mixed", "step_s": 2.0}]
    )
    assert text.splitlines() == [
        "| fleet | step_s | cfg |",
        "|---:|---:|---:|",
        '| h20 | 1.235 | {"x": 1} |',
        "| mixed | 2.000 |  |",
    ]
    assert markdown_table([]) == "(no rows)"


def test_argument_types_check_bounds_and_lists() -> None:
    assert at_least(int, 1)("1") == 1 and at_least(float, 0, strict=True)("0.5") == 0.5
    assert numbers(int, 0)("0,3") == (0, 3) and numbers(float, 0)("1.5") == (1.5,)
    for parse, text, said in [
        (at_least(int, 1), "0", "must be >= 1, got 0"),
        (at_least(float, 0, strict=True), "0", "must be > 0, got 0"),
        (numbers(int, 1), "2,0", "must be >= 1, got 0"),
        (numbers(int, 0), "1,x", "expected comma-separated integers, got '1,x'"),
        (numbers(float, 0), "a", "expected comma-separated numbers, got 'a'"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            parse(text)


def test_the_median_interval_is_a_bootstrap_over_steps():
    xs = [1.0, 2.0, 3.0, 4.0, 100.0]
    med, lo, hi = median_ci(xs)
    assert med == statistics.median(xs) and lo >= 1.0 and hi <= 100.0 and lo < med < hi
    assert median_ci([2.0] * 5) == (2.0, 2.0, 2.0)
    assert median_ci(xs, seed=1) == median_ci(xs, seed=1)


def test_an_interval_is_written_beside_its_median_and_as_error_bars():
    assert ci_text(1.234, 1.0, 1.5, ".2f") == "1.23 [1.00, 1.50]"
    assert ci_text(1.0, None, 2.0, ".2f") == "—"  # no interval (e.g. one seed never got there): no claim
    rows = [{"x": 2.0, "lo": 1.5, "hi": 3.0}, {"x": 1.0, "lo": 1.0, "hi": 1.25}]
    assert ci_errors(rows, "x", "lo", "hi") == [[0.5, 0.0], [1.0, 0.25]]
    assert or_dash(None) == "—" and or_dash(95.4) == "95" and or_dash(1.234, ".2f") == "1.23"


def test_a_list_of_names_is_parsed_and_an_unknown_name_refused():
    parse = names_of(("plain", "waiting"))
    assert parse("waiting, plain") == ("waiting", "plain")
    with pytest.raises(argparse.ArgumentTypeError, match="choose from plain, waiting; got 'wait'"):
        parse("wait")
