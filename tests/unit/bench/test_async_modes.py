import argparse

import pytest

from bench.async_modes import (
    FULL,
    QUICK,
    ROW_KEYS,
    add_arguments,
    build_rows,
    ideal,
    ideal_step_s,
    mode_alpha,
    order_violations,
)
from bench.async_runs import MODE_ORDER
from bench.report import pick_settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    add_arguments(p)
    return p


def run_of(mode: str, step_s: float, tokens_per_s: float, **kw: float) -> dict:
    bias = {"trained_mean_turns": 2.0, "started_mean_turns": 2.5, "aborted_token_frac": 0.1}
    return {
        "mode": mode,
        "alpha": mode_alpha(mode, 1),
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        **bias,
        **kw,
    }


def test_modes_are_parsed_into_the_expected_order_and_checked():
    args = parser().parse_args(["--modes", "rollart,sync", "--alpha", "2"])
    assert args.modes == ("sync", "rollart") and args.alpha == 2
    assert parser().parse_args([]).modes == MODE_ORDER
    for bad in (["--modes", "sync,async"], ["--modes", "sync,sync"], ["--alpha", "0"]):
        with pytest.raises(SystemExit):
            parser().parse_args(bad)


def test_quick_is_shorter_and_both_run_one_batch_of_envs():
    assert pick_settings(parser().parse_args(["--quick"]), FULL, QUICK) == QUICK
    assert QUICK.steps < FULL.steps and QUICK.rounds == 1
    assert FULL.envs == FULL.batch_groups * FULL.group_size == QUICK.envs


def test_each_mode_runs_under_its_own_bound():
    assert [mode_alpha(m, 3) for m in MODE_ORDER] == [0, 0, 1, 3, 3]


def test_ideal_step_is_the_longer_phase_plus_exposed_sync():
    assert ideal_step_s(rollout_s=2.0, train_s=1.5, exposed_sync_s=0.25) == 2.25
    assert ideal_step_s(rollout_s=0.5, train_s=1.5, exposed_sync_s=0.0) == 1.5


def test_rows_follow_the_mode_order_and_speedup_is_throughput_over_sync():
    runs = {
        m: run_of(m, s, t)
        for m, s, t in [("rollart", 1.0, 400.0), ("sync", 4.0, 100.0), ("sync+", 2.0, 200.0)]
    }
    se = {"rollart": 3.0, "sync": 1.0, "sync+": 2.0}
    rows = build_rows(runs, se)
    assert [r["mode"] for r in rows] == ["sync", "sync+", "rollart"]
    assert all(set(r) == set(ROW_KEYS) for r in rows)
    assert [r["tokens_per_s_se"] for r in rows] == [1.0, 2.0, 3.0]
    assert [r["speedup_vs_sync"] for r in rows] == [1.0, 2.0, 4.0]
    assert [r["alpha"] for r in rows] == [0, 0, 1]
    assert [r["started_mean_turns"] for r in rows] == [2.5] * 3  # the selection bias travels with each row
    del runs["sync"]
    assert [r["speedup_vs_sync"] for r in build_rows(runs, se)] == [None, None]  # no baseline, no ratio


def test_ideal_takes_rollout_and_train_from_sync_plus_and_exposed_sync_from_rollart():
    runs = {
        "sync+": run_of("sync+", 3.5, 100.0, wait_batch_s=2.0, train_s=1.2, sync_s=0.3),
        "rollart": run_of("rollart", 2.5, 140.0, wait_batch_s=1.1, train_s=1.3, sync_s=0.1),
    }
    got = ideal(runs)
    assert got is not None
    assert (got["rollout_s"], got["train_s"], got["exposed_sync_s"]) == (2.0, 1.2, 0.1)
    assert got["ideal_step_s"] == pytest.approx(2.1) and got["rollart_step_s"] == 2.5
    assert got["efficiency"] == pytest.approx(2.1 / 2.5)
    assert got["ideal_speedup_vs_sync_plus"] == pytest.approx(3.5 / 2.1)
    assert ideal({"rollart": runs["rollart"]}) is None


@pytest.mark.parametrize(
    ("tps", "broken"),
    [
        ({"sync": 1, "sync+": 2, "one-off": 3, "areal": 3, "rollart": 3}, []),  # ties allowed from one-off on
        ({"sync": 1, "sync+": 1, "one-off": 3, "areal": 4, "rollart": 5}, ["sync 1 >= sync+ 1 tokens/s"]),
        (
            {"sync": 1, "sync+": 2, "one-off": 3, "areal": 5, "rollart": 4},
            ["areal 5 > rollart 4 tokens/s (by more than 0)"],
        ),
        ({"sync": 1, "rollart": 0.5}, ["sync 1 >= rollart 0 tokens/s"]),  # modes left out: the rest in order
        ({"sync+": 2, "areal": 3}, []),
    ],
)
def test_expected_order(tps, broken):
    assert order_violations([{"mode": m, "tokens_per_s": float(t)} for m, t in tps.items()]) == broken


def test_a_lead_within_the_noise_is_a_tie_but_not_among_the_strict_modes():
    def rows(se: float, **tps: float) -> list[dict]:
        return [
            {"mode": m.replace("_", "-"), "tokens_per_s": t, "tokens_per_s_se": se} for m, t in tps.items()
        ]

    # areal ahead by 100 with s.e. 30 each: the margin is 2·√(30² + 30²) ≈ 85 -> a real lead
    assert order_violations(rows(30.0, areal=1100.0, rollart=1000.0)) == [
        "areal 1100 > rollart 1000 tokens/s (by more than 85)"
    ]
    assert order_violations(rows(40.0, areal=1100.0, rollart=1000.0)) == []  # margin 113: a tie
    assert order_violations(rows(40.0, one_off=1100.0, areal=1000.0)) == []
    strict = order_violations(rows(400.0, sync=1100.0, rollart=1000.0))  # no tie for sync
    assert strict == ["sync 1100 >= rollart 1000 tokens/s"]


def test_registered_with_the_cli():
    from flows.cli import _parser

    args = _parser().parse_args(
        ["bench", "async-modes", "--quick", "--json", "x.json", "--modes", "rollart,sync"]
    )
    assert (args.name, args.quick, args.json, args.modes) == (
        "async-modes",
        True,
        "x.json",
        ("sync", "rollart"),
    )
