import argparse
import json
from dataclasses import replace

import pytest

from bench.alpha_sweep import (
    FULL,
    FULL_ALPHAS,
    QUICK,
    QUICK_ALPHAS,
    add_arguments,
    alphas_of,
    best_alpha,
    build_rows,
    run,
)
from bench.async_runs import MEDIAN_KEYS, SEED_STRIDE, RunSettings, round_seeds
from bench.report import pick_settings
from tests.unit.bench.cli import bench_parser


def parser() -> argparse.ArgumentParser:
    return bench_parser(add_arguments)


def runs_of(alpha: int, tokens_per_s: list[float], **fields: list[float] | float) -> list[dict]:
    """One run per seed (0, SEED_STRIDE, ...) with these throughputs; a field is one value per run or one
    for all, every other `MEDIAN_KEYS` field 1.0."""
    out = []
    for k, tps in enumerate(tokens_per_s):
        given = {key: v[k] if isinstance(v, list) else v for key, v in fields.items()}
        base = dict.fromkeys(MEDIAN_KEYS, 1.0) | {"tokens_per_s": tps, "staleness_max": 0}
        out.append({"mode": "rollart", "alpha": alpha, "seed": k * SEED_STRIDE, **base, **given})
    return out


def test_alphas_default_to_one_through_six_and_quick_to_fewer():
    assert alphas_of(parser().parse_args([])) == FULL_ALPHAS == (1, 2, 3, 4, 5, 6)
    assert alphas_of(parser().parse_args(["--quick"])) == QUICK_ALPHAS
    assert alphas_of(parser().parse_args(["--quick", "--alphas", "3,1"])) == (1, 3)  # sorted
    assert pick_settings(parser().parse_args(["--quick", "--steps", "7"]), FULL, QUICK).steps == 7
    assert FULL.envs == 2 * FULL.batch_groups * FULL.group_size  # rollout can run a batch ahead


def test_full_runs_five_seeds_per_alpha_quick_three_of_the_same_workload():
    assert pick_settings(parser().parse_args(["--quick"]), FULL, QUICK) == QUICK
    assert (FULL.rounds, QUICK.rounds) == (5, 3) and QUICK.steps < FULL.steps
    assert RunSettings(concurrency=32, env_sigma_ms=75.0, rounds=5) == FULL
    assert replace(FULL, steps=QUICK.steps, rounds=3) == QUICK  # only steps and seeds differ


@pytest.mark.parametrize("text", ["0,1", "1,1", "a", "1.5"])
def test_bad_alphas_are_refused(text, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--alphas", text])
    assert "--alphas" in capsys.readouterr().err


def test_rows_are_medians_over_seeds_with_intervals_and_a_gain_paired_by_seed():
    results = {
        3: runs_of(3, [330.0, 360.0, 200.0], step_s=[1.0, 0.9, 1.5], aborted=[0, 1, 0], staleness_max=3),
        1: runs_of(1, [300.0, 300.0, 250.0], step_s=[1.2, 1.2, 1.4], aborted=[8, 4, 6], staleness_max=1),
    }
    rows = build_rows(results, steps=4)
    assert [(r["alpha"], r["runs"]) for r in rows] == [(1, 3), (3, 3)]
    one, three = rows
    assert (three["step_s"], three["ci_low"], three["ci_high"]) == (1.0, 0.9, 1.5)
    assert (three["tokens_per_s"], three["tokens_per_s_ci_low"], three["tokens_per_s_ci_high"]) == (
        330.0,
        200.0,
        360.0,
    )
    # per seed: 330/300, 360/300, 200/250 = 1.1, 1.2, 0.8 (the ratio of medians, 330/300, hides seed 3)
    gain = (three["speedup_vs_alpha1"], three["speedup_ci_low"], three["speedup_ci_high"])
    assert gain == pytest.approx((1.1, 0.8, 1.2))
    assert (one["speedup_vs_alpha1"], one["speedup_ci_low"], one["speedup_ci_high"]) == (1.0, 1.0, 1.0)
    assert [r["aborted"] for r in rows] == [6, 0] and [r["aborted_per_step"] for r in rows] == [1.5, 0.0]
    assert [r["staleness_max"] for r in rows] == [1, 3]
    no_base = build_rows({3: results[3]}, steps=4)  # α = 1 not swept: no ratio
    assert (no_base[0]["speedup_vs_alpha1"], no_base[0]["speedup_ci_low"]) == (None, None)


def test_gains_are_refused_across_seeds():
    results = {1: runs_of(1, [300.0, 300.0]), 2: runs_of(2, [330.0, 330.0])}
    results[2][1]["seed"] = 7
    with pytest.raises(ValueError, match="different seeds"):
        build_rows(results, steps=4)


def test_the_best_alpha_comes_with_its_interval():
    results = {
        1: runs_of(1, [100.0] * 5),
        2: runs_of(2, [110.0, 112.0, 108.0, 111.0, 109.0]),  # ahead on every seed
        4: runs_of(4, [150.0, 90.0, 130.0, 95.0, 125.0]),  # a larger median gain, but not on every seed
    }
    best = best_alpha(build_rows(results, steps=5))
    assert best is not None and best["alpha"] == 4
    assert (best["speedup_vs_alpha1"], best["ci_low"], best["ci_high"]) == (1.25, 0.9, 1.5)
    assert best["beats_alpha1"] is False and best["within_paper_max"] is True
    del results[4]
    best = best_alpha(build_rows(results, steps=5))
    assert best is not None and (best["alpha"], best["speedup_vs_alpha1"]) == (2, pytest.approx(1.1))
    assert best["beats_alpha1"] is True and best["ci_low"] > 1
    assert best_alpha(build_rows({1: results[1]}, steps=5)) is None  # nothing to compare
    assert best_alpha(build_rows({2: results[2], 3: runs_of(3, [1.0] * 5)}, steps=5)) is None  # no α = 1


def fake_run_all(s: RunSettings, plan: list[tuple[str, int]]) -> list[list[dict]]:
    """rollart at each α on `s.rounds` seeds: a larger α is faster, α = 4 trains one sample too stale."""
    out = []
    for mode, alpha in plan:
        assert mode == "rollart"
        rs = runs_of(alpha, [100.0 + 10 * alpha + k for k in range(s.rounds)], aborted=0.0)
        for r, seed in zip(rs, round_seeds(s), strict=True):
            r.update(seed=seed, step_s=4.0 / alpha, staleness_max=alpha + (alpha == 4))
        out.append(rs)
    return out


def test_the_json_carries_clock_seeds_medians_with_intervals_and_the_bound(monkeypatch, tmp_path):
    monkeypatch.setattr("bench.alpha_sweep.run_all", fake_run_all)
    out = tmp_path / "as.json"
    payload = run(parser().parse_args(["--quick", "--json", str(out)]))
    assert payload["clock"] == "wall" and payload["seeds"] == [0, SEED_STRIDE, 2 * SEED_STRIDE]
    rows = payload["rows"]
    assert [(r["alpha"], r["runs"]) for r in rows] == [(1, 3), (2, 3), (4, 3)]
    assert all(r["ci_low"] <= r["step_s"] <= r["ci_high"] for r in rows)
    assert [r["tokens_per_s"] for r in rows] == [111, 121, 141]  # the middle seed
    assert payload["best"]["alpha"] == 4
    assert payload["best"]["speedup_vs_alpha1"] == pytest.approx(141 / 111)
    assert (payload["best"]["ci_low"], payload["best"]["ci_high"]) == pytest.approx((142 / 112, 140 / 110))
    assert payload["best"]["beats_alpha1"] is True
    assert payload["bound_held"] is False and "BROKEN" in payload["note"]  # α = 4's staleness 5
    assert "best α=4, 1.27 [1.27, 1.27]x over α=1" in payload["note"] and "Load average" in payload["note"]
    assert [len(rs) for rs in payload["runs"].values()] == [3, 3, 3] and list(payload["runs"]) == [
        "1",
        "2",
        "4",
    ]
    assert json.loads(out.read_text()) == payload
    assert (tmp_path / "as.png").stat().st_size > 0


def test_registered_with_the_cli():
    from flows.cli import _parser

    args = _parser().parse_args(["bench", "alpha-sweep", "--quick", "--alphas", "1,2", "--store", "ray"])
    assert (args.name, args.quick, args.alphas, args.store) == ("alpha-sweep", True, (1, 2), "ray")
