import argparse
import json
import math

import pytest

from bench import weight_sync
from bench.report import median_ci, pick_settings
from bench.weight_rig import CpuLoad
from bench.weight_sync import (
    FULL,
    QUICK,
    MiB,
    add_arguments,
    hidden_fraction,
    layer_shapes,
    pull_in_push,
    summarize,
)
from tests.unit.bench.cli import bench_parser


def parser() -> argparse.ArgumentParser:
    return bench_parser(add_arguments)


def test_options_override_the_quick_or_full_base():
    assert pick_settings(parser().parse_args([]), FULL, QUICK) == FULL
    assert FULL.window_s is None and FULL.steps >= 5 and QUICK.steps == 3  # the contract's repeats
    got = pick_settings(
        parser().parse_args(["--quick", "--stores", "ray", "--model-mb", "4,8", "--window-s", "0"]),
        FULL,
        QUICK,
    )
    assert (got.stores, got.model_mb, got.bucket_mb, got.window_s) == (("ray",), (4, 8), QUICK.bucket_mb, 0.0)


@pytest.mark.parametrize(
    "argv",
    [["--stores", "s3"], ["--model-mb", "0"], ["--bucket-mb", "x"], ["--steps", "0"], ["--window-s", "-1"]],
)
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)


@pytest.mark.parametrize("mb", [1, 16, 128, 512])
def test_layer_shapes_fill_the_size_with_whole_layers(mb):
    shapes = layer_shapes(mb * MiB)
    nbytes = 4 * sum(math.prod(s) for s in shapes)
    assert len(shapes) % 9 == 0  # q k v o, gate up down, two norms
    assert 0.75 * mb * MiB <= nbytes <= 1.25 * mb * MiB


def test_hidden_fraction_counts_what_the_trainer_and_the_update_waited_for():
    # on path 0.01, push 0.1, pull 0.4 of which the update waited 0.1: 1 - (0.01 + 0.1) / 0.5
    assert hidden_fraction(0.01, 0.1, 0.4, 0.1) == pytest.approx(0.78)
    assert hidden_fraction(0.0, 0.5, 0.5, 0.0) == pytest.approx(1.0)  # nobody waited: all of it hidden
    assert hidden_fraction(0.5, 0.5, 0.5, 0.0) == pytest.approx(0.5)  # a push on the path hides nothing
    assert hidden_fraction(0.0, 0.2, 0.6, 0.8) == pytest.approx(0.0)  # the update waited for all of it


def test_pull_in_push_is_the_reading_before_the_push_ended():
    pulled = {"started_at": 10.0, "publish_wait_s": 0.2, "pull_s": 0.3}  # the pull ends at 10.5
    assert pull_in_push(pulled, push_end=10.4) == pytest.approx(0.2)  # its last 0.1 s came after
    assert pull_in_push(pulled, push_end=11.0) == pytest.approx(0.3)  # all of it while pushing
    assert pull_in_push(pulled, push_end=10.0) == pytest.approx(0.0)  # all of it afterwards


def _step(push: float, pull: float, exposed: float, on_path: float = 0.1) -> dict[str, float]:
    return {
        "push_s": push,
        "pack_s": 0.01,
        "push_on_path_s": on_path,
        "pull_s": pull,
        "pull_in_push_s": pull / 2,
        "exposed_pull_s": exposed,
        "bytes": 64 * MiB,
        "buckets": 4.0,
    }


def test_summarize_gives_medians_and_the_interval_over_steps():
    steps = [_step(0.2, 0.6, 0.0), _step(0.4, 0.8, 0.2), _step(0.1, 0.3, 0.3)]
    row = summarize({"store": "ray", "window": "idle"}, steps, seed=3)
    per_step = [1 - 0.1 / 0.8, 1 - 0.3 / 1.2, 1 - 0.4 / 0.4]  # 0.875, 0.75, 0.0
    med, low, high = median_ci(per_step, 3)
    assert row == {
        "store": "ray",
        "window": "idle",
        "bytes": 64 * MiB,
        "buckets": 4,
        "push_s": pytest.approx(0.2),
        "pack_s": pytest.approx(0.01),
        "push_on_path_s": pytest.approx(0.1),
        "pull_s": pytest.approx(0.6),
        "pull_in_push_s": pytest.approx(0.3),
        "exposed_pull_s": pytest.approx(0.2),
        "hidden_fraction": pytest.approx(0.75),
        "ci_low": pytest.approx(low),
        "ci_high": pytest.approx(high),
        "hidden_max": pytest.approx(0.875),  # 1 - on path / (push + pull): median of 0.875, 0.917, 0.75
        "n_steps": 3,
    }
    assert med == pytest.approx(0.75) and low < 0.75 < high


def test_the_window_is_the_median_measured_rollout(monkeypatch):
    import bench.async_runs

    seen = []

    def fake_run_all(s, plan):
        seen.append((s.warmup, s.steps, s.rounds, s.seed, plan))
        return [[{"steps": [{"wait_batch_s": x} for x in (0.9, 0.7, 1.4)]}]]

    monkeypatch.setattr(bench.async_runs, "run_all", fake_run_all)
    window = weight_sync.measure_window(seed=5)
    assert seen == [(1, 3, 1, 5, [("sync+", 0)])]  # rollout alone, after one warm-up step
    assert window["window_s"] == 0.9 and window["rollout_s"] == [0.9, 0.7, 1.4]


def test_cpu_load_spins_and_stops():
    load = CpuLoad(2)
    load.spin_for(0.01)
    load.spin_for(0.0)
    assert load.close() == [0, 0]


def _rows(window_s: float) -> list[dict]:
    rows = []
    for window, hidden in (("idle", 0.45), ("loaded", 0.2)):
        steps = [_step(0.1, 0.2, 0.1 * (1 - hidden) * 3 - 0.1)] * 3
        row = summarize({"store": "ray", "model_mb": 16, "bucket_mb": 16, "window_s": window_s}, steps, 0)
        rows.append(row | {"window": window, "steps": steps})
    return rows


@pytest.mark.parametrize(("argv", "source"), [(["--window-s", "0.5"], "given"), ([], "measured")])
def test_run_writes_the_contract(monkeypatch, tmp_path, argv, source):
    monkeypatch.setattr(weight_sync, "measure_window", lambda seed: {"window_s": 0.8, "source": "measured"})
    monkeypatch.setattr(weight_sync, "_measure_all", lambda s, window_s: _rows(window_s))
    monkeypatch.setattr(weight_sync, "_plot", lambda rows, path: "w.png")
    out = tmp_path / "w.json"
    payload = weight_sync.run(parser().parse_args(["--quick", "--json", str(out), *argv]))
    assert (payload["clock"], payload["seeds"], payload["repeats"]) == ("wall", [0], QUICK.steps)
    assert payload["window"]["source"] == source
    assert [r["window_s"] for r in payload["rows"]] == [0.5 if argv else 0.8] * 2
    assert [r["hidden_fraction"] for r in payload["rows"]] == pytest.approx([0.45, 0.2])
    assert all(r["ci_low"] <= r["hidden_fraction"] <= r["ci_high"] for r in payload["rows"])
    assert "Ours at worst: idle 0.450, loaded 0.200 (BELOW the target)" in payload["note"]
    assert json.loads(out.read_text()) == payload


def test_registered_with_the_cli():
    from flows.cli import _parser

    args = _parser().parse_args(["bench", "weight-sync", "--json", "w.json", "--bucket-mb", "8"])
    assert (args.name, args.quick, args.json, args.bucket_mb) == ("weight-sync", False, "w.json", (8,))


def _async_modes(**config) -> dict:
    """An async-modes payload: its config on the default workload, three sync+ runs' mean rollouts."""
    from dataclasses import asdict

    from bench.async_runs import RunSettings

    runs = [{"wait_batch_s": x} for x in (1.3, 1.1, 1.25)]
    return {"config": asdict(RunSettings()) | {"rounds": 3, "steps": 3} | config, "runs": {"sync+": runs}}


def test_in_bench_all_the_window_comes_from_async_modes_sync_plus_runs_on_the_same_workload(monkeypatch):
    monkeypatch.setattr(weight_sync, "measure_window", lambda seed: pytest.fail("measured again"))
    monkeypatch.setattr(weight_sync, "_measure_all", lambda s, window_s: _rows(window_s))
    monkeypatch.setattr(weight_sync, "_plot", lambda rows, path: "w.png")
    args = parser().parse_args(["--quick"])
    weight_sync.suite_args(args, {"async-modes": {"payload": _async_modes()}})
    payload = weight_sync.run(args)
    assert payload["window"]["window_s"] == 1.25 and payload["window"]["rollout_s"] == [1.3, 1.1, 1.25]
    assert "async-modes' sync+ rollout, median of its 3 runs" in payload["window"]["source"]
    assert [r["window_s"] for r in payload["rows"]] == [1.25] * 2


@pytest.mark.parametrize(
    "payload", [_async_modes(env_ms=100.0), _async_modes(store="ray"), {"config": {}, "runs": {}}]
)
def test_another_workload_or_no_sync_plus_runs_give_no_window(payload):
    assert weight_sync.window_from_async_modes(payload) is None


def test_a_given_window_wins_over_async_modes():
    args = parser().parse_args(["--window-s", "0.5"])
    weight_sync.suite_args(args, {"async-modes": {"payload": _async_modes()}})
    assert getattr(args, "window_measured", None) is None
