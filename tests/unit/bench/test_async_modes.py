import argparse
import json

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
    paired,
    run,
)
from bench.async_runs import MEDIAN_KEYS, MODE_ORDER, SEED_STRIDE, RunSettings, round_seeds, summarize_runs
from bench.report import pick_settings
from tests.unit.bench.cli import bench_parser


def parser() -> argparse.ArgumentParser:
    return bench_parser(add_arguments)


def runs_of(mode: str, tokens_per_s: list[float], **fields: list[float] | float) -> list[dict]:
    """One run per seed (0, SEED_STRIDE, ...) with these throughputs; a field is one value per run or
    one for all, every other `MEDIAN_KEYS` field 1.0."""
    out = []
    for k, tps in enumerate(tokens_per_s):
        given = {key: v[k] if isinstance(v, list) else v for key, v in fields.items()}
        base = dict.fromkeys(MEDIAN_KEYS, 1.0) | {"tokens_per_s": tps, "staleness_max": 0}
        out.append({"mode": mode, "alpha": mode_alpha(mode, 1), "seed": k * SEED_STRIDE, **base, **given})
    return out


def summaries_of(results: dict[str, list[dict]]) -> dict[str, dict]:
    return {m: summarize_runs(rs) for m, rs in results.items()}


def test_modes_are_parsed_into_the_expected_order_and_checked():
    args = parser().parse_args(["--modes", "rollart,sync", "--alpha", "2"])
    assert args.modes == ("sync", "rollart") and args.alpha == 2
    assert parser().parse_args([]).modes == MODE_ORDER
    for bad in (["--modes", "sync,async"], ["--modes", "sync,sync"], ["--alpha", "0"]):
        with pytest.raises(SystemExit):
            parser().parse_args(bad)


def test_full_runs_five_seeds_quick_three_of_the_same_workload():
    assert pick_settings(parser().parse_args(["--quick"]), FULL, QUICK) == QUICK
    assert (FULL.rounds, QUICK.rounds) == (5, 3) and QUICK.steps < FULL.steps
    assert FULL.envs == FULL.batch_groups * FULL.group_size == QUICK.envs
    assert RunSettings(steps=QUICK.steps, rounds=3) == QUICK  # only steps and seeds differ from the defaults
    assert RunSettings(rounds=5) == FULL


def test_each_mode_runs_under_its_own_bound():
    assert [mode_alpha(m, 3) for m in MODE_ORDER] == [0, 0, 1, 3, 3]


def test_ideal_step_is_the_longer_phase_plus_exposed_sync():
    assert ideal_step_s(rollout_s=2.0, train_s=1.5, exposed_sync_s=0.25) == 2.25
    assert ideal_step_s(rollout_s=0.5, train_s=1.5, exposed_sync_s=0.0) == 1.5


def test_pairs_are_taken_seed_by_seed_and_refused_across_seeds():
    results = {"rollart": runs_of("rollart", [300.0, 200.0]), "areal": runs_of("areal", [100.0, 50.0])}
    assert paired(results, "rollart", "areal", lambda x, y: x / y) == [3.0, 4.0]
    results["areal"][1]["seed"] = 7
    with pytest.raises(ValueError, match="different seeds"):
        paired(results, "rollart", "areal", lambda x, y: x - y)


def test_rows_are_medians_over_seeds_with_intervals_and_a_speedup_paired_by_seed():
    results = {
        "rollart": runs_of("rollart", [300.0, 330.0, 180.0], step_s=[1.0, 0.9, 1.6]),
        "sync": runs_of("sync", [100.0, 110.0, 90.0], step_s=[4.0, 3.6, 4.4], started_mean_turns=2.5),
        "sync+": runs_of("sync+", [200.0, 150.0, 250.0], step_s=[2.0, 3.0, 1.5]),
    }
    rows = build_rows(results, summaries_of(results))
    assert [r["mode"] for r in rows] == ["sync", "sync+", "rollart"]
    assert all(tuple(r) == ROW_KEYS for r in rows)
    assert [r["alpha"] for r in rows] == [0, 0, 1] and [r["runs"] for r in rows] == [3, 3, 3]
    sync, _, ours = rows
    assert (sync["step_s"], sync["ci_low"], sync["ci_high"]) == (4.0, 3.6, 4.4)
    assert (ours["tokens_per_s"], ours["tokens_per_s_ci_low"], ours["tokens_per_s_ci_high"]) == (
        300,
        180,
        330,
    )
    # per seed: 300/100, 330/110, 180/90 = 3, 3, 2 (the ratio of medians, 300/100, would hide seed 3)
    assert (ours["speedup_vs_sync"], ours["speedup_ci_low"], ours["speedup_ci_high"]) == (3.0, 2.0, 3.0)
    assert (sync["speedup_vs_sync"], sync["speedup_ci_low"], sync["speedup_ci_high"]) == (1.0, 1.0, 1.0)
    assert sync["started_mean_turns"] == 2.5 and ours["started_mean_turns"] == 1.0  # selection bias travels
    del results["sync"]
    no_base = build_rows(results, summaries_of(results))
    assert [(r["speedup_vs_sync"], r["speedup_ci_low"]) for r in no_base] == [(None, None)] * 2


def test_an_even_number_of_seeds_takes_the_mean_of_the_middle_two():
    results = {"sync": runs_of("sync", [100.0, 80.0], step_s=[2.0, 3.0])}
    (row,) = build_rows(results, summaries_of(results))
    assert (row["step_s"], row["tokens_per_s"]) == (2.5, 90.0)  # not the slower run (3.0, 80)


def five_modes(rollart_step: list[float], sync_s: dict[str, float]) -> dict[str, dict]:
    """Summaries of five modes over three seeds: sync+ waits 2.0 s for its batch and trains 1.2 s."""
    step = {"sync": [4.0] * 3, "sync+": [3.4, 3.5, 3.6], "one-off": [2.6] * 3, "areal": [2.5] * 3}
    step["rollart"] = rollart_step
    results = {
        m: runs_of(m, [100.0] * 3, step_s=step[m], sync_s=sync_s[m], wait_batch_s=2.0, train_s=1.2)
        for m in MODE_ORDER
    }
    return summaries_of(results)


def test_the_ideal_takes_the_smallest_exposed_sync_of_any_mode_not_rollarts_own():
    sync_s = {"sync": 0.5, "sync+": 0.4, "one-off": 0.05, "areal": 0.2, "rollart": 0.1}
    got = ideal(five_modes([2.1, 2.2, 2.3], sync_s))
    assert got is not None
    assert (got["rollout_s"], got["train_s"]) == (2.0, 1.2)  # sync+, each alone
    assert (got["exposed_sync_s"], got["exposed_sync_mode"]) == (0.05, "one-off")
    assert got["ideal_step_s"] == pytest.approx(2.05)
    assert (got["rollart_step_s"], got["rollart_ci_low"], got["rollart_ci_high"]) == (2.2, 2.1, 2.3)
    assert got["efficiency"] == pytest.approx(2.05 / 2.2)
    assert (got["efficiency_ci_low"], got["efficiency_ci_high"]) == pytest.approx((2.05 / 2.3, 2.05 / 2.1))
    assert got["ideal_speedup_vs_sync_plus"] == pytest.approx(3.5 / 2.05)
    # rollart's whole interval lies above the ideal: it falls short (with its own sync, 2.1, it would not)
    assert got["meets_ideal"] is False
    assert ideal(five_modes([2.0, 2.2, 2.3], sync_s))["meets_ideal"] is True  # the ideal is within it


def test_the_ideal_uses_rollarts_sync_when_it_is_the_smallest_and_needs_sync_plus():
    sync_s = {"sync": 0.5, "sync+": 0.4, "one-off": 0.3, "areal": 0.2, "rollart": 0.1}
    summaries = five_modes([2.1, 2.2, 2.3], sync_s)
    got = ideal(summaries)
    assert got is not None and (got["exposed_sync_s"], got["exposed_sync_mode"]) == (0.1, "rollart")
    assert got["ideal_step_s"] == pytest.approx(2.1) and got["meets_ideal"] is True
    del summaries["sync+"]
    assert ideal(summaries) is None


def order_of(**tps: list[float]) -> dict[str, list[dict]]:
    modes = {m: m.replace("_", "-").replace("plus", "+") for m in tps}  # one_off=... is one-off's
    return {modes[m]: runs_of(modes[m], t) for m, t in tps.items()}


@pytest.mark.parametrize(
    ("tps", "broken"),
    [
        ({"sync": [1], "syncplus": [2], "one_off": [3], "areal": [3], "rollart": [3]}, []),  # ties allowed
        (
            {"sync": [1, 1], "syncplus": [1, 1], "one_off": [3, 3], "rollart": [5, 5]},
            ["sync 1 >= sync+ 1 tokens/s"],
        ),
        ({"sync": [200, 0], "rollart": [50, 50]}, ["sync 100 >= rollart 50 tokens/s"]),  # modes left out
        ({"syncplus": [2], "areal": [3]}, []),
    ],
)
def test_expected_order(tps, broken):
    assert order_violations(order_of(**tps)) == broken


def test_a_lead_counts_only_when_its_per_seed_interval_excludes_zero():
    # areal ahead of rollart on every one of five seeds: the interval of the per-seed leads is above 0
    ahead = order_of(areal=[1010, 1020, 1030, 1040, 1050], rollart=[1000] * 5)
    assert order_violations(ahead) == ["areal 1030 > rollart 1000 tokens/s (lead per seed 30, 95% CI 10–50)"]
    # the same medians, but behind on one seed: the interval reaches below 0, a tie
    assert order_violations(order_of(areal=[1010, 1020, 1030, 1040, 995], rollart=[1000] * 5)) == []
    assert order_violations(order_of(one_off=[1010, 1020, 1030, 1040, 995], areal=[1000] * 5)) == []
    # sync is no candidate for a tie: any lead of its median breaks the order
    assert order_violations(order_of(sync=[1001, 900, 1100], rollart=[1000] * 3)) == [
        "sync 1001 >= rollart 1000 tokens/s"
    ]


def fake_run_all(s: RunSettings, plan: list[tuple[str, int]]) -> list[list[dict]]:
    """Every mode on `s.rounds` seeds, faster down the mode order; rollart's sync is not the smallest."""
    speed = {"sync": 1.0, "sync+": 1.5, "one-off": 2.0, "areal": 2.2, "rollart": 2.4}
    sync_s = {"sync": 0.5, "sync+": 0.4, "one-off": 0.05, "areal": 0.1, "rollart": 0.2}
    out = []
    for mode, _ in plan:
        rs = runs_of(mode, [100.0 * speed[mode] + k for k in range(s.rounds)], sync_s=sync_s[mode])
        for r, seed in zip(rs, round_seeds(s), strict=True):
            r.update(seed=seed, step_s=4.0 / speed[mode], wait_batch_s=2.0, train_s=1.0, staleness_max=0)
        out.append(rs)
    return out


def test_the_json_carries_clock_seeds_and_medians_with_intervals(monkeypatch, tmp_path):
    monkeypatch.setattr("bench.async_modes.run_all", fake_run_all)
    out = tmp_path / "am.json"
    payload = run(parser().parse_args(["--quick", "--json", str(out)]))
    assert payload["clock"] == "wall" and payload["seeds"] == [0, SEED_STRIDE, 2 * SEED_STRIDE]
    rows = payload["rows"]
    assert [r["mode"] for r in rows] == list(MODE_ORDER) and all(r["runs"] == 3 for r in rows)
    assert all(r["ci_low"] <= r["step_s"] <= r["ci_high"] for r in rows)
    assert [r["tokens_per_s"] for r in rows] == pytest.approx([101, 151, 201, 221, 241])  # the middle seed
    assert payload["order_violations"] == []
    assert payload["ideal"]["exposed_sync_mode"] == "one-off"
    assert payload["ideal"]["ideal_step_s"] == pytest.approx(2.05)  # max(2.0, 1.0) + one-off's 0.05
    assert payload["ideal"]["meets_ideal"] is True  # rollart's 4/2.4 = 1.67 s beats the ideal
    assert [len(rs) for rs in payload["runs"].values()] == [3] * 5
    assert "mean of the middle two" in payload["note"] and "Load average" in payload["note"]
    assert json.loads(out.read_text()) == payload
    assert (tmp_path / "am.png").stat().st_size > 0


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
