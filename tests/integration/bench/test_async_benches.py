"""`async-modes` and `alpha-sweep` end to end on local Ray, at the smallest size that still trains."""

import argparse
import json

import pytest
import ray

from bench import alpha_sweep, async_modes
from bench.async_runs import RunSettings, run_all, suite_session
from engine.weights.transfer import WeightPrefetcher

POLL_MAX_S = WeightPrefetcher.POLL_S[1] + 1e-3  # a pull looks for a bucket not there yet at most this often

SMALL = dict(
    quick=False,
    size="tiny",
    group_size=2,
    batch_groups=2,
    turns=2,
    max_tokens=2,
    env_ms=30.0,
    env_sigma_ms=10.0,
    warmup=0,
    steps=2,
    rounds=1,
    seed=0,
)


def test_async_modes_measures_each_mode_and_the_ideal_step(tmp_path):
    out = tmp_path / "am.json"
    args = argparse.Namespace(
        **SMALL, json=str(out), modes=("sync+", "rollart"), alpha=1, concurrency=None, store="ray"
    )
    payload = async_modes.run(args)

    rows = payload["rows"]
    assert [(r["mode"], r["alpha"]) for r in rows] == [("sync+", 0), ("rollart", 1)]
    assert all(r["speedup_vs_sync"] is None for r in rows)  # sync not run: no baseline
    parts = {b["mode"]: b for b in payload["breakdown"]}
    assert parts["sync+"]["staleness_max"] == 0 and parts["sync+"]["aborted"] == 0  # on-policy
    assert parts["rollart"]["staleness_max"] <= 1  # the bound held ...
    assert parts["rollart"]["aborted"] == 0 and rows[1]["aborted_token_frac"] == 0  # ... dropping nothing
    for r in rows:
        b = parts[r["mode"]]
        assert r["tokens_per_s"] > 0 and r["step_s"] > b["wait_batch_s"] + b["train_s"]
        # weights went through the store; the workers' update waited at most for what was left of the push
        # (it runs in the background since the trainer's publish returned) and of the pull, and a last poll
        assert b["pull_s"] > 0 and b["exposed_pull_s"] <= b["push_s"] + b["pull_s"] + POLL_MAX_S
    ideal = payload["ideal"]
    assert (
        ideal["rollout_s"] == parts["sync+"]["wait_batch_s"] and ideal["train_s"] == parts["sync+"]["train_s"]
    )
    best_sync = min(b["sync_s"] for b in parts.values())  # the smallest of any mode, not rollart's own
    assert ideal["exposed_sync_s"] == best_sync and ideal["exposed_sync_mode"] in parts
    assert ideal["ideal_step_s"] == pytest.approx(max(ideal["rollout_s"], ideal["train_s"]) + best_sync)
    assert ideal["meets_ideal"] == (ideal["ideal_step_s"] >= ideal["rollart_ci_low"])
    assert payload["clock"] == "wall" and payload["seeds"] == [0]
    assert all(r["runs"] == 1 and r["ci_low"] == r["step_s"] == r["ci_high"] for r in rows)  # one seed
    assert ideal["rollart_step_s"] == rows[1]["step_s"]
    assert (payload["order_violations"] == []) == (rows[0]["tokens_per_s"] < rows[1]["tokens_per_s"])
    assert "2.65–4.58x" in payload["note"] and "Load average" in payload["note"]
    assert json.loads(out.read_text()) == payload
    assert (tmp_path / "am.png").stat().st_size > 0


def test_alpha_sweep_bounds_staleness_by_each_alpha(tmp_path):
    out = tmp_path / "as.json"
    args = argparse.Namespace(**SMALL, json=str(out), alphas=(1, 2), concurrency=8, store="mooncake")
    payload = alpha_sweep.run(args)

    rows = payload["rows"]
    assert [r["alpha"] for r in rows] == [1, 2] and rows[0]["speedup_vs_alpha1"] == 1.0
    for r in rows:
        assert 0 <= r["staleness_max"] <= r["alpha"]
        assert r["aborted_per_step"] == r["aborted"] / 2 and r["tokens_per_s"] > 0
    assert rows[1]["speedup_vs_alpha1"] == rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    assert payload["config"]["envs"] == 8
    assert json.loads(out.read_text()) == payload
    assert (tmp_path / "as.png").stat().st_size > 0


def test_run_all_calls_in_a_suite_session_share_ray_and_the_workers():
    s = RunSettings(**{k: v for k, v in SMALL.items() if k != "quick"}, store="ray")
    with suite_session() as warm:
        [[first]] = run_all(s, [("sync+", 0)])
        assert ray.is_initialized() and warm.reused == 0  # kept for the next call
        [[second]] = run_all(s, [("sync", 0)])
        assert warm.reused >= 3  # trainer, generation worker, rollout: rebuilt, not started again
    assert not ray.is_initialized()
    assert first["mode"] == "sync+" and second["mode"] == "sync" and second["tokens_per_s"] > 0
    run_all(s, [("sync", 0)])  # outside a session: its own Ray, shut down on the way out
    assert not ray.is_initialized()
