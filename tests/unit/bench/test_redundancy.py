"""Redundant rollouts on a tiny step with stragglers and failures."""

import argparse

import pytest

from bench.redundancy import add_arguments, run


def test_redundancy_masks_stragglers(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "red.json"), group_sizes=(4,), env_groups=(4,), redundancy=(2, 1),
        turns=(4, 6), straggler_rate=0.2, fail_rate=0.1,
    )  # fmt: skip
    rows = run(args)["rows"]
    assert [r["redundancy"] for r in rows] == [0, 2, 1]  # the r = 0 baseline is always measured
    base, two, one = rows
    assert base["speedup"] == 1.0 and base["cancelled"] == 0
    assert two["speedup"] == base["rollout_s"] / two["rollout_s"] > 1.2
    assert two["rollout_s"] <= one["rollout_s"] * 1.01  # more spares never wait longer: same first members
    assert two["envs_started"] >= 4 * 6 and two["cancelled"] > 0
    assert sum(r["failed"] for r in rows) > 0  # dying envs were replaced, groups still completed
    assert all(r["groups_dropped"] == 0 for r in rows)
    assert (tmp_path / "red.png").stat().st_size > 0


def test_bad_lists_are_refused(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--redundancy", "0,2"]).redundancy == (0, 2)
    with pytest.raises(SystemExit):
        parser.parse_args(["--group-sizes", "4,x"])
    assert "comma-separated integers" in capsys.readouterr().err
