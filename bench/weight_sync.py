"""`rollart bench weight-sync`: how much of the bucketed weight transfer nobody waits for (paper §6.3).

Per store (Mooncake on a local master, or the Ray object store), model size and bucket size, the real
weight path publishes one version per step (wall clock) in the protocol's order: a generation-side Ray
actor (another process) starts the `WeightPrefetcher` pull of the version; the trainer side (this
process) packs the state dict into buckets and hands them to `WeightPublisher.publish`, whose
background thread pushes them while the pull reads each bucket as it lands; then the *window* (the
rollout the protocol overlaps with the transfer); then `update` waits for what is left of the pull (the
*exposed* pull, timed inside the worker).

The window is one batch's rollout, measured first unless `--window-s` gives it (or, in `rollart bench all`,
async-modes ran the same workload before: the median of its sync+ runs): the median `wait_batch_s`
of 3 `sync+` steps (rollout alone) of `async-modes`' workload (`bench.async_runs`: tiny Qwen2, HF
generation, 4 groups x G=4, 4 turns, env latency N(150, 50) ms). That bounds the protocol's window from
above: in the continuous modes training overlaps rollout, and a batch ready when training ends leaves
~0 s. Each step runs twice, interleaved: an *idle* window (the bench runs nothing) and a *loaded* one (a
busy loop per CPU competes with the pull, as a CPU rollout on the same machine would; a real rollout,
mostly env waiting, lies between).

Per step: push (the bucket writes, in the background; `pack_s`, the copy into buckets first, apart),
`push_on_path_s` (what the publish call cost the trainer beyond the pack: the wait for the previous push
and the hand-over), pull (the worker's reading, not its waits for buckets), `pull_in_push_s` (reading
done before the push ended, from CLOCK_MONOTONIC timestamps of both processes), the exposed pull and
`hidden = 1 − (push_on_path + exposed) / (push + pull)`. `IterationProtocol.step` awaits the publish
call before its next step, so that part is on the trainer's path; the writes and the pull can hide
(while the trainer goes on and in the window): hidden ≤ `hidden_max` = 1 − push_on_path / (push + pull)
whatever the window. Under load the transfer runs slower (a larger denominator), and the exposed pull
also counts its polls and waits for a core: it can exceed the pull (hidden below 0). Per
row (one run): medians over steps, the hidden fraction with a bootstrap 95% interval over steps; the
seed draws the weights. Paper: 67–78% hidden; target ≥ 0.9. Model sizes are fp32 state dicts shaped like
a transformer's layers (random values; the cost depends on bytes and tensor count).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

from bench import report
from bench.sync_window import measure_window, window_from_async_modes
from bench.weight_rig import CpuLoad, Puller, store_spec

MiB = 1 << 20
PAPER_HIDDEN = (0.67, 0.78)
TARGET_HIDDEN = 0.9
WINDOWS = ("idle", "loaded")
TIMES = ("push_s", "pack_s", "push_on_path_s", "pull_s", "pull_in_push_s", "exposed_pull_s")


@dataclass(frozen=True)
class Settings:
    stores: tuple[str, ...] = ("mooncake", "ray")
    model_mb: tuple[int, ...] = (16, 128, 512)
    bucket_mb: tuple[int, ...] = (16, 64, 256)
    steps: int = 5
    window_s: float | None = None  # None: measured (module doc)
    seed: int = 0


FULL = Settings()
# The harder setting of each store: the larger model in the smaller buckets (the most buckets to push and
# pull; its loaded rows were the least hidden in every quick suite run with 64 MiB buckets beside them)
QUICK = replace(FULL, model_mb=(128,), bucket_mb=(16,), steps=3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    f, q, add, rp = FULL, QUICK, parser.add_argument, report
    add("--stores", type=rp.names_of(("mooncake", "ray")), help="mooncake,ray (default both)")
    add("--model-mb", type=rp.numbers(int, 1), help=f"weights, MiB ({f.model_mb}; quick {q.model_mb})")
    add("--bucket-mb", type=rp.numbers(int, 1), help=f"buckets, MiB ({f.bucket_mb}; quick {q.bucket_mb})")
    add("--steps", type=rp.at_least(int, 1), help=f"steps per setting, window ({f.steps}; quick {q.steps})")
    add("--window-s", type=rp.at_least(float, 0), help="the window (default: one batch's rollout, measured)")
    add("--seed", type=rp.at_least(int, 0), help="seeds the weights and the bootstrap (default 0)")


# -- pure parts --------------------------------------------------------------------------------------
def layer_shapes(total_bytes: int) -> list[tuple[int, ...]]:
    """fp32 shapes of a transformer-like state dict of about `total_bytes` (whole layers, at least one).

    Hidden size h = 256 · (size / 16 MiB)^½, rounded down to a multiple of 64; each layer has q, k, v, o
    (h×h), gate, up, down (h×4h) and two norms (h).
    """
    h = max(64, int(256 * (total_bytes / (16 * MiB)) ** 0.5) // 64 * 64)
    layer: list[tuple[int, ...]] = [(h, h)] * 4 + [(4 * h, h), (4 * h, h), (h, 4 * h), (h,), (h,)]
    per_layer = 4 * sum(math.prod(shape) for shape in layer)
    return layer * max(1, round(total_bytes / per_layer))


def hidden_fraction(on_path_s: float, push_s: float, pull_s: float, exposed_s: float) -> float:
    """1 − (push_on_path + exposed) / (push + pull): what the trainer and the update waited for, of the
    whole transfer (module doc)."""
    return 1.0 - (on_path_s + exposed_s) / (push_s + pull_s)


def pull_in_push(pulled: dict[str, float], push_end: float) -> float:
    """The pull's reading time before `push_end`, from its {started_at, publish_wait_s, pull_s}: at least,
    as all of the pull after `push_end` (it ended at start + waits + reading) counts as reading (every
    bucket has landed then; a poll still asleep, or a wait for a core, would be counted too)."""
    after = pulled["started_at"] + pulled["publish_wait_s"] + pulled["pull_s"] - push_end
    return pulled["pull_s"] - min(max(after, 0.0), pulled["pull_s"])


def summarize(key: dict[str, Any], steps: Sequence[dict[str, Any]], seed: int) -> dict[str, Any]:
    """One row from one window's steps: the medians of the times, the hidden fraction with its interval."""
    hidden = [
        hidden_fraction(s["push_on_path_s"], s["push_s"], s["pull_s"], s["exposed_pull_s"]) for s in steps
    ]
    med, low, high = report.median_ci(hidden, seed)
    return {
        **key,
        "bytes": int(steps[0]["bytes"]),
        "buckets": int(steps[0]["buckets"]),
        **{k: statistics.median(s[k] for s in steps) for k in TIMES},
        "hidden_fraction": med,
        "ci_low": low,
        "ci_high": high,
        "hidden_max": statistics.median(
            hidden_fraction(s["push_on_path_s"], s["push_s"], s["pull_s"], 0.0) for s in steps
        ),
        "n_steps": len(steps),
    }


def suite_args(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    """In `rollart bench all`, after the benchmarks before it: unless `--window-s` is given, the window comes
    from async-modes' sync+ runs when they ran its workload (the measurement `measure_window` would only
    repeat, over more steps and seeds)."""
    payload = results.get("async-modes", {}).get("payload")
    if getattr(args, "window_s", None) is None and payload:
        args.window_measured = window_from_async_modes(payload)


# -- the measurement ---------------------------------------------------------------------------------
def _state_dict(model_mb: int, seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.rand(shape, generator=gen) for i, shape in enumerate(layer_shapes(model_mb * MiB))}


@dataclass
class _Rig:
    """What the settings of one run share; the writer's store and the puller actor are one store's."""

    s: Settings
    window_s: float
    load: CpuLoad
    store: Any = None
    puller: Any = None


def _one_version(
    rig: _Rig, publisher: Any, state: dict[str, Any], version: int, bucket_mb: int, window: str
) -> dict[str, Any]:
    """Pull `version` while it is published, then the window ("warm-up": none), then wait for the pull."""
    import ray

    ray.get(rig.puller.start.remote(publisher.run_id, version))  # reads each bucket as it lands
    t0 = time.perf_counter()
    packed = publisher.publish(state, version, bucket_mb * MiB)
    on_path = time.perf_counter() - t0 - packed["pack_s"]
    if window == "loaded":
        rig.load.spin_for(rig.window_s)
    elif window == "idle":
        time.sleep(rig.window_s)
    pulled = ray.get(rig.puller.wait.remote(publisher.run_id, version))
    pushed = publisher.wait()  # ended: the pull read its last bucket
    assert pushed is not None
    if pulled["bytes"] != packed["bytes"]:
        raise RuntimeError(
            f"{publisher.run_id} v{version}: pulled {pulled['bytes']}, pushed {packed['bytes']}"
        )
    return {
        "window": window,
        **{k: packed[k] for k in ("pack_s", "bytes", "buckets")},
        "push_s": pushed["push_s"],
        "push_on_path_s": on_path,
        **{k: pulled[k] for k in ("pull_s", "publish_wait_s")},
        "exposed_pull_s": pulled["exposed_s"],
        "pull_in_push_s": pull_in_push(pulled, push_end=pushed["pushed_at"]),
    }


def _measure(rig: _Rig, run_id: str, model_mb: int, bucket_mb: int) -> list[dict[str, Any]]:
    """One warm-up version (connections, first allocations), then `steps` x (idle, loaded) windows."""
    from engine.weights.transfer import WeightPublisher

    state = _state_dict(model_mb, rig.s.seed)
    publisher = WeightPublisher(rig.store, run_id)
    plan = ["warm-up", *(w for _ in range(rig.s.steps) for w in WINDOWS)]
    try:
        steps = [_one_version(rig, publisher, state, v, bucket_mb, w) for v, w in enumerate(plan)]
    finally:
        rig.store.delete_prefix(f"{run_id}/")  # frees the writer's segment for the next setting
    return steps[1:]


def _per_store(rig: _Rig, kind: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (model size, bucket size) through one store: one writer client here, one puller actor."""
    import ray

    from infra.weightstore.factory import open_store

    rig.store, rig.puller = open_store(spec), ray.remote(Puller).options(num_cpus=0).remote(spec)
    rows = []
    try:
        for model_mb in rig.s.model_mb:
            for bucket_mb in rig.s.bucket_mb:
                steps = _measure(rig, f"ws-{kind}-{model_mb}-{bucket_mb}", model_mb, bucket_mb)
                key = {"store": kind, "model_mb": model_mb, "bucket_mb": bucket_mb, "window_s": rig.window_s}
                for window in WINDOWS:
                    mine = [x for x in steps if x["window"] == window]
                    rows.append(summarize(key | {"window": window}, mine, rig.s.seed) | {"steps": mine})
    finally:
        ray.get(rig.puller.close.remote())
        ray.kill(rig.puller)
        rig.store.close()
    return rows


def _measure_all(s: Settings, window_s: float) -> list[dict[str, Any]]:
    import ray

    from engine.experiment import WORKER_ENV
    from infra.local_ray import init_local_ray

    os.environ.update(WORKER_ENV)
    biggest = max(4 * sum(math.prod(shape) for shape in layer_shapes(mb * MiB)) for mb in s.model_mb)
    rig = _Rig(s, window_s, CpuLoad(os.cpu_count() or 1))
    rows = []
    try:
        init_local_ray(
            num_cpus=2,
            include_dashboard=False,
            runtime_env={"env_vars": WORKER_ENV},
            object_store_memory=max(4 * biggest, 512 * MiB),
        )
        for kind in s.stores:
            with ExitStack() as stack:
                # Mooncake: the writer's segment holds the newest two versions (keep_last=2) plus slack
                rows += _per_store(rig, kind, store_spec(kind, 2 * biggest + 64 * MiB, stack))
    finally:
        ray.shutdown()
        rig.load.close()
    return rows


SHOWN = {"MiB": "model_mb", "bucket": "bucket_mb", "n": "buckets", "in_push_s": "pull_in_push_s"}
SHOWN |= {"exposed_s": "exposed_pull_s", "hidden": "hidden_fraction", "max": "hidden_max"}
SHOWN |= {"on_path_s": "push_on_path_s"}


def _table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The printed columns (floats to 3 decimals); the JSON keeps every field."""
    cols = ("store", "MiB", "bucket", "n", "window", "pack_s", "on_path_s", "push_s", "pull_s", "in_push_s")
    cols += ("exposed_s", "hidden")
    return [{c: r[SHOWN.get(c, c)] for c in (*cols, "ci_low", "ci_high", "max")} for r in rows]


def _plot(rows: list[dict[str, Any]], path: str | None) -> str:
    fig, axes = report.new_figure(10, 4, cols=2)
    sizes, bottom = sorted({r["model_mb"] for r in rows}), min(0.0, *(r["ci_low"] for r in rows)) - 0.05
    for ax, window in zip(axes, WINDOWS, strict=True):
        for store, bucket in sorted({(r["store"], r["bucket_mb"]) for r in rows}):
            pts = [r for r in rows if (r["store"], r["bucket_mb"], r["window"]) == (store, bucket, window)]
            mid = [r["hidden_fraction"] for r in pts]
            err = report.ci_errors(pts, "hidden_fraction", "ci_low", "ci_high")
            fmt, label = "o-" if store == "mooncake" else "s--", f"{store}, {bucket} MiB buckets"
            ax.errorbar([r["model_mb"] for r in pts], mid, yerr=err, fmt=fmt, capsize=3, label=label)
        ax.axhspan(*PAPER_HIDDEN, color="tab:orange", alpha=0.2, label="paper (67–78%)")
        ax.axhline(TARGET_HIDDEN, color="k", ls=":", label="target 0.9")
        ax.set(xscale="log", xlabel="state dict, MiB", ylabel="1 − (on path + exposed) / (push + pull)")
        ax.set(title=f"{window} window ({rows[0]['window_s']:.2f} s): median, 95% CI", ylim=(bottom, 1))
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    return report.save_figure(fig, path, "weight_sync.png")


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The least hidden row per window (the note's "at worst"), its `hidden_max` the ideal; target >= 0.9."""
    least_first = sorted(payload["rows"], key=lambda r: r["hidden_fraction"])
    worst = (next(x for x in least_first if x["window"] == w) for w in WINDOWS)
    label = "hidden, worst {window}: {store} {model_mb} MiB, bucket {bucket_mb}"
    hidden = ("hidden_fraction", "ci_low", "ci_high")
    return [
        report.headline_row(label.format_map(r), *map(r.get, hidden), PAPER_HIDDEN, r["hidden_max"])
        for r in worst
    ]


def _note(s: Settings, window: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    worst = {w: min(r["hidden_fraction"] for r in rows if r["window"] == w) for w in WINDOWS}
    ours = ", ".join(f"{w} {v:.3f}" for w, v in worst.items())
    return (
        f"{s.steps} steps per setting and window (+1 warm-up), idle and CPU-loaded windows interleaved; "
        f"window {window['window_s']:.3f} s ({window['source']}). MiB: state dict; n: buckets; in_push_s: "
        "pull reading while the push still ran; pack_s: the copy into buckets, on the trainer's path in any "
        "scheme and left out of both terms below; on_path_s: what the publish call cost the trainer beyond "
        "the pack (the push itself runs in the background); medians over steps.\nhidden = 1 - (on_path + "
        "exposed) / (push + pull); max = 1 - on_path / (push + pull). Loaded: the load slows the transfer "
        "nobody waits for (a larger denominator); exposed_s is what it costs."
        f"\nPaper: {PAPER_HIDDEN[0]:.0%}–{PAPER_HIDDEN[1]:.0%} hidden; target >= {TARGET_HIDDEN}. Ours at "
        f"worst: {ours} ({'meets' if min(worst.values()) >= TARGET_HIDDEN else 'BELOW'} the target)."
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    load_before = os.getloadavg()
    window = (
        {"window_s": s.window_s, "source": "given"}
        if s.window_s is not None
        else getattr(args, "window_measured", None) or measure_window(s.seed)  # (`suite_args`)
    )
    measured = _measure_all(s, window["window_s"])
    load_after = os.getloadavg()
    rows = [{k: v for k, v in r.items() if k != "steps"} for r in measured]
    note = _note(s, window, rows) + "\n" + report.load_note(load_before, load_after, os.cpu_count())
    return report.publish(
        args,
        "Weight sync: push, pull, exposed pull per step",
        s,
        rows,
        note,
        table=_table(rows),
        clock="wall",
        seeds=[s.seed],
        config={"cpus": os.cpu_count()},
        plot=lambda path: _plot(rows, path),
        repeats=s.steps,
        interval="percentile bootstrap over the steps of a row (one run per row)",
        window=window,
        steps=[r["steps"] for r in measured],
        paper={"hidden_fraction": list(PAPER_HIDDEN), "target": TARGET_HIDDEN},
        load_avg={"before": list(load_before), "after": list(load_after)},
    )
