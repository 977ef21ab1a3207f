import argparse
import json

import pytest

from bench.rollout_granularity import FULL, QUICK, Settings, add_arguments, ideal_times, run, settings
from engine.envs.latency import LatencyModel

ROW_KEYS = {"sigma", "traj_s", "batch_s", "speedup", "ideal_traj_s", "ideal_batch_s", "efficiency"}


def test_ideal_times_by_hand():
    # env 0 sleeps 1, 2, 3 s; env 1 sleeps 3, 1, 1
    traj, batch = ideal_times([[1.0, 2.0, 3.0], [3.0, 1.0, 1.0]])
    assert traj == 6.0  # env 0's total is the larger
    assert batch == 8.0  # per stage the slowest: 3 + 2 + 3


def test_quick_is_the_same_workload_at_fewer_lengths_and_explicit_options_override_it():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    assert settings(parser.parse_args([])) == FULL
    assert settings(parser.parse_args(["--quick"])) == QUICK
    assert (QUICK.mu, QUICK.envs, QUICK.clock) == (FULL.mu, FULL.envs, FULL.clock)
    assert set(QUICK.turns) < set(FULL.turns) and QUICK.seeds == (0, 1, 2) and len(FULL.seeds) == 5
    assert set(QUICK.sigmas) < set(FULL.sigmas) and {1.0, 10.0} <= set(QUICK.sigmas)  # the paper's two
    s = settings(parser.parse_args(["--quick", "--turns", "7,9", "--sigmas", "0,2.5", "--envs", "16"]))
    assert s == Settings(sigmas=(0.0, 2.5), envs=16, turns=(7, 9), unit_ms=QUICK.unit_ms, seeds=QUICK.seeds)


@pytest.mark.parametrize(
    "argv",
    [
        ["--envs", "12"],
        ["--sigmas", "1,-2"],
        ["--sigmas", "1,x"],
        ["--turns", "0"],
        ["--unit-ms", "0"],
        ["--clock", "sundial"],
        ["--seeds", "-1"],
    ],
)
def test_bad_options_are_refused_by_the_parser(argv, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    assert "error: argument" in capsys.readouterr().err


def _args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(
        quick=False, json=str(tmp_path / "rg.json"), mu=10.0, envs=16, clock=None, unit_ms=None, seeds=(3, 4)
    )
    return argparse.Namespace(**(base | kw))


def _ideal_from_the_draws(turns: int, sigma: float, seed: int) -> tuple[float, float]:
    """Trajectory and batch step time, computed apart from the bench (env i of a seed: 1e6 seed + i; a
    reset, T steps)."""
    sums, stages = [], [[] for _ in range(turns + 1)]
    for i in range(16):
        env = LatencyModel(10.0, sigma, seed=1_000_000 * seed + i, stream=0).draws(1)
        env += LatencyModel(10.0, sigma, seed=1_000_000 * seed + i, stream=1).draws(turns)
        sums.append(sum(env))
        for k, x in enumerate(env):
            stages[k].append(x)
    return max(sums), sum(max(s) for s in stages)


def test_on_the_simulated_clock_both_modes_take_their_ideal_time_within_3_percent(tmp_path):
    payload = run(_args(tmp_path, sigmas=(0.0, 5.0), turns=(4, 8)))

    assert payload["clock"] == "virtual" and payload["seeds"] == [3, 4]
    rows = payload["rows"]
    assert [(r["turns"], r["sigma"]) for r in rows] == [(4, 0.0), (4, 5.0), (8, 0.0), (8, 5.0)]
    assert all(set(r) >= ROW_KEYS for r in rows)
    for r in rows:
        assert [run["seed"] for run in r["runs"]] == [3, 4]
        for one in r["runs"]:
            traj, batch = _ideal_from_the_draws(r["turns"], r["sigma"], one["seed"])
            assert one["ideal_traj_s"] == pytest.approx(traj, rel=1e-12)
            assert one["ideal_batch_s"] == pytest.approx(batch, rel=1e-12)
            # generation (16 tokens of a 7B model on an H800) is what the ideal leaves out: ~1% of a 10 s step
            assert traj <= one["traj_s"] <= 1.03 * traj and batch <= one["batch_s"] <= 1.03 * batch
            assert one["speedup"] == one["batch_s"] / one["traj_s"]
            assert one["efficiency"] == traj / one["traj_s"]
        speedups = sorted(one["speedup"] for one in r["runs"])
        assert r["speedup"] == pytest.approx(sum(speedups) / 2)  # the median of two seeds
        assert r["ci_low"] == speedups[0] and r["ci_high"] == speedups[1]  # bootstrap of two: their range
    flat = rows[0]
    # σ = 0: every reset and step sleeps exactly 10 s, 5 stages, in both ideal schedules
    assert flat["ideal_traj_s"] == pytest.approx(50.0) and flat["ideal_speedup"] == 1.0
    for spread in rows[1], rows[3]:  # σ = 5: batch mode waits for each turn's slowest env
        assert spread["speedup"] > 1.1 and spread["speedup"] == pytest.approx(
            spread["ideal_speedup"], rel=0.03
        )
    assert payload["draws_checked"] is True  # run() raises when an env slept other latencies
    assert json.loads((tmp_path / "rg.json").read_text()) == payload
    assert payload["config"]["envs"] == 16 and payload["config"]["turns"] == [4, 8]
    assert (tmp_path / "rg.png").stat().st_size > 0

    again = run(_args(tmp_path, sigmas=(0.0, 5.0), turns=(4, 8), json=None))
    assert again["rows"] == rows  # the simulated clock: the same draws give the same times, to the bit


def test_the_wall_clock_run_is_kept_and_never_beats_its_ideal(tmp_path):
    payload = run(_args(tmp_path, sigmas=(2.0,), turns=(2,), clock="wall", unit_ms=2.0))
    assert payload["clock"] == "wall" and payload["load_1m"] >= 0
    (row,) = payload["rows"]
    assert row["traj_s"] >= row["ideal_traj_s"] and row["batch_s"] >= row["ideal_batch_s"]
