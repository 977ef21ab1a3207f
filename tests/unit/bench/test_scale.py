"""The control-plane scale benchmark on a tiny grid (wall clock: assertions that load cannot break)."""

import argparse
from dataclasses import asdict

import pytest

from bench.scale import FULL, QUICK, add_arguments, run, summarize


def test_overhead_and_efficiency_are_measured_per_concurrency(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "scale.json"), concurrency=(16, 64), turns=2, env_s=1.0,
        unit_ms=20.0, seeds=(0, 1),
    )  # fmt: skip
    payload = run(args)
    assert payload["clock"] == "wall" and payload["seeds"] == [0, 1]
    small, big = payload["rows"]
    assert (small["concurrency"], big["concurrency"]) == (16, 64)
    assert (small["requests"], big["requests"]) == (32, 128)
    for r in (small, big):
        assert r["overhead_ms_per_request"] > 0  # CPU time of the control plane, per request
        assert 0 < r["ci_low"] <= r["efficiency"] <= r["ci_high"] <= 1.02  # nothing beats exact sleeps
        assert r["overhead_ci_low"] <= r["overhead_ms_per_request"] <= r["overhead_ci_high"]
        assert r["delay_ci_low"] <= r["delay_ms_per_turn"] <= r["delay_ci_high"]
        assert r["ideal_s"] >= 3 * 1.0 * 0.02  # 3 env sleeps of 1 modelled s = 20 ms
        assert r["step_wall_s"] >= r["ideal_s"] * 0.98
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_a_row_is_the_median_over_seeds_with_intervals() -> None:
    def one(eff: float, over: float, delay: float, load: float) -> dict[str, float]:
        return {"efficiency": eff, "overhead_ms_per_request": over, "delay_ms_per_turn": delay,
                "step_wall_s": 2 / eff, "ideal_s": 2.0, "requests": 64, "mean_proxy_ms": 0.1,
                "load_1m": load}  # fmt: skip

    row = summarize(8, [one(0.9, 0.5, 10.0, 1.0), one(0.5, 0.7, 90.0, 3.0), one(0.8, 0.2, 20.0, 2.0)])
    assert (row["efficiency"], row["overhead_ms_per_request"], row["delay_ms_per_turn"]) == (0.8, 0.5, 20.0)
    assert (row["ci_low"], row["ci_high"]) == (0.5, 0.9)  # with 3 seeds: about the range
    assert (row["overhead_ci_low"], row["overhead_ci_high"]) == (0.2, 0.7)
    assert row["step_wall_s"] == pytest.approx(2 / 0.8) and row["requests"] == 64 and row["load_1m"] == 3.0


def test_quick_is_the_full_workload_scaled_down() -> None:
    full, quick = asdict(FULL), asdict(QUICK)
    assert {k for k in full if full[k] != quick[k]} <= {"concurrency", "seeds"}
    assert set(QUICK.concurrency) <= set(FULL.concurrency) and set(QUICK.seeds) <= set(FULL.seeds)
    assert len(FULL.seeds) >= 5 and len(QUICK.seeds) == 3


def test_concurrency_must_fill_whole_groups(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--concurrency", "128,100"])
    assert "multiple of 8" in capsys.readouterr().err
