import argparse
import json

import pytest

from bench.rollout_granularity import FULL, QUICK, Settings, add_arguments, ideal_times, run, settings
from engine.envs.latency import LatencyModel

ROW_KEYS = {"sigma", "traj_s", "batch_s", "speedup", "ideal_traj_s", "ideal_batch_s", "efficiency"}


def test_ideal_times_by_hand():
    # env 0 sleeps 1, 2, 3 units; env 1 sleeps 3, 1, 1 — at 0.5 s per unit
    traj, batch = ideal_times([[1.0, 2.0, 3.0], [3.0, 1.0, 1.0]], unit_s=0.5)
    assert traj == 3.0  # env 0's total, 6 units, is the larger
    assert batch == 4.0  # per stage the slowest: 3 + 2 + 3 = 8 units


def test_quick_is_the_base_and_explicit_options_override_it():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    assert settings(parser.parse_args([])) == FULL
    assert settings(parser.parse_args(["--quick"])) == QUICK
    s = settings(parser.parse_args(["--quick", "--turns", "7", "--sigmas", "0,2.5", "--envs", "16"]))
    assert s == Settings(sigmas=(0.0, 2.5), envs=16, turns=7, unit_ms=QUICK.unit_ms)


@pytest.mark.parametrize(
    "argv", [["--envs", "12"], ["--sigmas", "1,-2"], ["--unit-ms", "0"], ["--seed", "-1"]]
)
def test_bad_options_are_refused_by_the_parser(argv, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    assert "error: argument" in capsys.readouterr().err


def test_tiny_run_measures_both_modes_on_the_same_draws(tmp_path):
    out = tmp_path / "rg.json"
    args = argparse.Namespace(
        quick=False, json=str(out), mu=10.0, sigmas=(0.0, 5.0), envs=16, turns=4, unit_ms=4.0, seed=3
    )
    payload = run(args)

    rows = payload["rows"]
    assert [r["sigma"] for r in rows] == [0.0, 5.0] and all(set(r) >= ROW_KEYS for r in rows)
    flat, spread = rows
    # σ = 0: every reset and step sleeps exactly 10 units of 4 ms, 5 stages, in both ideal schedules
    assert flat["ideal_traj_s"] == pytest.approx(0.2) and flat["ideal_speedup"] == 1.0
    # σ = 5: the ideal from an independent computation over the same seeds (env i: seed 3 + i)
    sums, stages = [], [[] for _ in range(5)]
    for i in range(16):
        env = LatencyModel(10.0, 5.0, seed=3 + i, stream=0).draws(1)
        env += LatencyModel(10.0, 5.0, seed=3 + i, stream=1).draws(4)
        sums.append(sum(env))
        for k, x in enumerate(env):
            stages[k].append(x)
    assert spread["ideal_traj_s"] == pytest.approx(max(sums) * 0.004, rel=1e-12)
    assert spread["ideal_batch_s"] == pytest.approx(sum(max(s) for s in stages) * 0.004, rel=1e-12)
    assert spread["speedup"] > 1.0 and spread["speedup"] == spread["batch_s"] / spread["traj_s"]
    assert spread["efficiency"] == spread["ideal_traj_s"] / spread["traj_s"]
    for r in rows:  # nothing runs faster than its ideal schedule
        assert r["traj_s"] >= r["ideal_traj_s"] and r["batch_s"] >= r["ideal_batch_s"]
    assert payload["draws_checked"] is True  # run() raises when an env slept other latencies

    assert json.loads(out.read_text()) == payload
    assert payload["config"]["envs"] == 16 and payload["config"]["turns"] == 4
    assert (tmp_path / "rg.png").stat().st_size > 0
