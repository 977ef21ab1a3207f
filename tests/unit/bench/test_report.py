import argparse
from dataclasses import dataclass

from bench.report import markdown_table, pick_settings


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
