"""Redundant rollouts on tiny steps: equal engines for every r, a straggler grid, seeds and intervals."""

import argparse
import json

import pytest

from bench.redundancy import FULL, Point, add_arguments, engines_for, run


def test_redundancy_masks_failures_and_costs_tokens(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "red.json"), group_sizes=(4,), env_groups=(4,), redundancy=(2, 1),
        turns=(4, 6), straggler_rates=(0.2,), straggler_factors=(2.0, 8.0), fail_rate=0.1, seeds=(0, 1, 2),
    )  # fmt: skip
    rows = run(args)["rows"]
    assert [(r["straggler_factor"], r["redundancy"]) for r in rows] == [
        (f, r)
        for f in (2.0, 8.0)
        for r in (0, 2, 1)  # the r = 0 baseline is always measured, first
    ]
    assert {r["engines"] for r in rows} == {1}  # one per 64 envs of r = 0, for every r
    for base, two, one in (rows[:3], rows[3:]):
        assert base["speedup"] == base["ci_low"] == base["ci_high"] == 1.0 and base["pays"] == "base"
        assert base["cancelled"] == 0 and base["failed"] > 0  # dying envs were replaced at r = 0
        assert two["speedup"] > 1.5 and two["ci_low"] <= two["speedup"] <= two["ci_high"]
        assert two["cancelled"] > one["cancelled"] > 0
        # redundant work is not free: more tokens generated, a larger share of them thrown away
        assert two["gen_tokens"] > one["gen_tokens"] > base["gen_tokens"]
        assert two["wasted_token_frac"] > one["wasted_token_frac"] > base["wasted_token_frac"] > 0
        assert all(r["groups_dropped"] == 0 for r in (base, two, one))
    payload = json.loads((tmp_path / "red.json").read_text())
    assert payload["clock"] == "virtual" and payload["seeds"] == [0, 1, 2]
    assert (tmp_path / "red.png").stat().st_size > 0


def test_spares_cost_time_when_nothing_fails_or_straggles(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "red.json"), group_sizes=(8,), env_groups=(8,), redundancy=(4,),
        turns=(4, 6), straggler_rates=(0.0,), straggler_factors=(1.0,), fail_rate=0.0, seeds=(0, 1, 2),
        engines=1,
    )  # fmt: skip
    payload = run(args)
    base, four = payload["rows"]
    assert base["engines"] == four["engines"] == 1
    assert base["wasted_token_frac"] == 0.0 and four["cancelled"] == 3 * 8 * 4  # every spare, every seed
    # the spares' generation shares the one engine: nothing to mask, so r = 4 is slower
    assert four["rollout_s"] > base["rollout_s"] and four["ci_high"] < 1.0 and four["pays"] == "no"
    assert four["gen_tokens"] > 1.3 * base["gen_tokens"]
    assert "costs in 1" in payload["note"]


def test_engines_come_from_the_r0_step_or_the_option() -> None:
    point = Point(group_size=16, env_groups=4, straggler_rate=0.1, straggler_factor=2.0)
    assert engines_for(FULL, point) == 1  # 64 envs at r = 0; r = 2 would need 72
    assert engines_for(FULL, Point(8, 32, 0.1, 2.0)) == 4
    assert engines_for(type(FULL)(engines=3), point) == 3


def test_bad_lists_are_refused(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args(["--redundancy", "0,2", "--straggler-factors", "2,8", "--seeds", "0,1"])
    assert parsed.redundancy == (0, 2) and parsed.straggler_factors == (2.0, 8.0) and parsed.seeds == (0, 1)
    with pytest.raises(SystemExit):
        parser.parse_args(["--group-sizes", "4,x"])
    assert "comma-separated integers" in capsys.readouterr().err
    for bad in (["--straggler-factors", "0.5"], ["--engines", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
