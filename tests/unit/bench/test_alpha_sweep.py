import argparse

import pytest

from bench.alpha_sweep import FULL, FULL_ALPHAS, QUICK, QUICK_ALPHAS, add_arguments, alphas_of, build_rows
from bench.report import pick_settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    add_arguments(p)
    return p


def test_alphas_default_to_one_through_six_and_quick_to_fewer():
    assert alphas_of(parser().parse_args([])) == FULL_ALPHAS == (1, 2, 3, 4, 5, 6)
    assert alphas_of(parser().parse_args(["--quick"])) == QUICK_ALPHAS
    assert alphas_of(parser().parse_args(["--quick", "--alphas", "3,1"])) == (1, 3)  # sorted
    assert pick_settings(parser().parse_args(["--quick", "--steps", "7"]), FULL, QUICK).steps == 7
    assert FULL.envs == 2 * FULL.batch_groups * FULL.group_size  # rollout can run a batch ahead


@pytest.mark.parametrize("text", ["0,1", "1,1", "a", "1.5"])
def test_bad_alphas_are_refused(text, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--alphas", text])
    assert "--alphas" in capsys.readouterr().err


def test_rows_by_alpha_with_gain_over_alpha_one_and_aborts_per_step():
    runs = [
        {"alpha": 3, "step_s": 1.0, "tokens_per_s": 330.0, "aborted": 0, "staleness_max": 3},
        {"alpha": 1, "step_s": 1.2, "tokens_per_s": 300.0, "aborted": 8, "staleness_max": 1},
    ]
    rows = build_rows(runs, steps=4)
    assert [r["alpha"] for r in rows] == [1, 3]
    assert [r["speedup_vs_alpha1"] for r in rows] == [1.0, pytest.approx(1.1)]
    assert [r["aborted_per_step"] for r in rows] == [2.0, 0.0]
    assert build_rows(runs[:1], steps=4)[0]["speedup_vs_alpha1"] is None  # α = 1 not swept: no ratio


def test_registered_with_the_cli():
    from flows.cli import _parser

    args = _parser().parse_args(["bench", "alpha-sweep", "--quick", "--alphas", "1,2", "--store", "ray"])
    assert (args.name, args.quick, args.alphas, args.store) == ("alpha-sweep", True, (1, 2), "ray")
