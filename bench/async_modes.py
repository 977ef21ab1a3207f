"""`rollart bench async-modes`: step time and throughput of the five training modes (paper §7, end to end).

Every mode runs the same real system (see `bench.async_runs`): a tiny Qwen2 trained with GRPO by a torch
`TrainWorker` actor, an HF-backend `GenerationWorker` actor, weights through Mooncake, the
`IterationProtocol` driving one step at a time. Envs are fixed-length synthetic episodes whose every
reset and step sleeps a seeded Gaussian draw (`LatencyEnv`); on seed s, env k sleeps seed s + k's draws
in every mode.

Why env latency, and how much: this machine has 2 CPU cores shared by generation, training and other
users, so overlapping two CPU-bound phases gains little — they only take turns on the same cores. What
overlap can hide for free is time that uses no CPU: env latency (a sandbox, a web page, a judge). The
defaults make one batch's rollout mostly env time (5 × 150 ms per trajectory, ~16 cheap decode steps)
and of the same order as one training step, which is where overlap matters most (at most 2×).

Statistics: every mode runs once per seed (`--rounds` seeds: 5 in the full run, 3 with `--quick`),
seed by seed, the modes rotated each seed (`bench.async_runs.run_order`; over 5 seeds each of the 5
modes runs once in every position) so drift on the machine does not favour one mode. A run yields
one value (its mean step time; its trained tokens over its time); a mode's number is the median of
those over its seeds (`statistics.median`: with an even number of seeds, the mean of the middle two)
with a percentile-bootstrap 95% interval over the same run-level values. Steps within a run are
autocorrelated (a slow env or a busy core spans several), so they are never pooled. The speedup over
`sync` and the lead of one mode over the next are paired by seed (the runs of one seed play the same
env draws): medians and intervals of per-seed ratios or differences.

Reported per mode: median step time, trained tokens/s (whole sequences) and the speedup over `sync`;
beside rollart, the ideal overlapped step `max(rollout, train) + exposed sync`, with rollout and train
taken from `sync+` (each measured alone) and exposed sync the smallest any mode measured (not
rollart's own, so rollart is not compared with an ideal built partly from itself). The ideal is met
when it is within or above rollart's step-time interval; it is a point built from other modes'
medians, and its own noise is not in that interval. The rollout of `sync+` includes the wave's
straggler tail, which rollart's trajectory-level admission can remove, so rollart may beat the ideal.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench import report
from bench.async_runs import (
    MEDIAN_KEYS,
    MODE_ORDER,
    RunSettings,
    add_run_arguments,
    interval_columns,
    interval_fields,
    round_seeds,
    run_all,
    suite_session,
    summarize_runs,
)
from engine.modes import policy

SUITE_SESSION = suite_session  # bench/all.py: one Ray and its kept workers with the next such benchmark
PAPER_SPEEDUP = (2.65, 4.58)  # RollArt end-to-end throughput over the synchronous baseline
FULL = replace(RunSettings(), rounds=5)  # 5 seeds per mode
QUICK = replace(FULL, steps=3, rounds=3)  # the same workload, fewer steps and seeds
BIAS_KEYS = ("trained_mean_turns", "started_mean_turns", "aborted_token_frac")  # selection bias
ROW_KEYS = (
    "mode",
    "alpha",
    "runs",
    "step_s",
    "ci_low",
    "ci_high",
    "tokens_per_s",
    "tokens_per_s_ci_low",
    "tokens_per_s_ci_high",
    "speedup_vs_sync",
    "speedup_ci_low",
    "speedup_ci_high",
    *BIAS_KEYS,
)
Runs = dict[str, list[dict[str, Any]]]  # per mode, its runs in seed order (as `run_all` returns them)


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in modes if m not in MODE_ORDER]
    if unknown or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(
            f"expected distinct modes from {', '.join(MODE_ORDER)}, got {text!r}"
        )
    return tuple(m for m in MODE_ORDER if m in modes)  # the expected order, whatever was typed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--modes", type=_modes, default=MODE_ORDER, help="comma-separated (default: all five)"
    )
    parser.add_argument(
        "--alpha", type=report.at_least(int, 1), default=1, help="α of areal and rollart (default 1)"
    )
    add_run_arguments(parser, FULL, QUICK)


def mode_alpha(mode: str, alpha: int) -> int:
    """The bound each mode runs under: sync modes are on-policy, one-off is one step behind by design."""
    return policy(mode).alpha(alpha)


def ideal_step_s(rollout_s: float, train_s: float, exposed_sync_s: float) -> float:
    """Perfect overlap: a step lasts as long as the longer of rollout and training, plus what sync exposes."""
    return max(rollout_s, train_s) + exposed_sync_s


def paired(results: Runs, a: str, b: str, f: Callable[[float, float], float]) -> list[float]:
    """`f(a's tokens/s, b's tokens/s)` per seed: the runs of one seed play the same env draws."""
    pairs = list(zip(results[a], results[b], strict=True))
    if any(x["seed"] != y["seed"] for x, y in pairs):
        raise ValueError(f"{a} and {b} ran on different seeds")
    return [f(x["tokens_per_s"], y["tokens_per_s"]) for x, y in pairs]


def build_rows(results: Runs, summaries: dict[str, dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """One row per mode (in the expected order): median step time over its seeds (`ci_low`/`ci_high`:
    its bootstrap 95% interval), median throughput, and the speedup over sync paired by seed (the
    median of per-seed throughput ratios, with its interval; None without sync)."""
    rows = []
    for mode in MODE_ORDER:
        if (m := summaries.get(mode)) is None:
            continue
        speedup: tuple[float | None, ...] = (None, None, None)
        if "sync" in results:
            speedup = report.median_ci(paired(results, mode, "sync", lambda x, y: x / y), seed)
        rows.append(
            {
                "mode": mode,
                "alpha": m["alpha"],
                **interval_fields(m),
                "speedup_vs_sync": speedup[0],
                "speedup_ci_low": speedup[1],
                "speedup_ci_high": speedup[2],
                **{k: m[k] for k in BIAS_KEYS},
            }
        )
    return rows


def ideal(summaries: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """rollart's ideal step (None without sync+ and rollart): sync+'s median rollout and train times,
    each measured alone, plus the smallest median exposed sync of any mode run.

    Met when the ideal is within or above rollart's step-time interval (`ideal >= ci_low`).
    """
    if "sync+" not in summaries or "rollart" not in summaries:
        return None
    alone, ours = summaries["sync+"], summaries["rollart"]
    best = min((m for m in MODE_ORDER if m in summaries), key=lambda m: summaries[m]["sync_s"])
    step = ideal_step_s(alone["wait_batch_s"], alone["train_s"], summaries[best]["sync_s"])
    return {
        "rollout_s": alone["wait_batch_s"],
        "train_s": alone["train_s"],
        "exposed_sync_s": summaries[best]["sync_s"],
        "exposed_sync_mode": best,
        "ideal_step_s": step,
        "rollart_step_s": ours["step_s"],
        "rollart_ci_low": ours["step_s_ci_low"],
        "rollart_ci_high": ours["step_s_ci_high"],
        "efficiency": step / ours["step_s"],  # ideal / measured: 1.0 is perfect overlap
        "efficiency_ci_low": step / ours["step_s_ci_high"],
        "efficiency_ci_high": step / ours["step_s_ci_low"],
        "meets_ideal": step >= ours["step_s_ci_low"],
        "ideal_speedup_vs_sync_plus": alone["step_s"] / step,
    }


def order_violations(results: Runs, seed: int = 0) -> list[str]:
    """Where throughput breaks sync < sync+ < one-off ≤ areal ≤ rollart (over the modes present, in order).

    The strict steps (sync < sync+ < the rest) compare the median throughputs. From one-off on, the
    modes may tie: one-off, areal and rollart run the same schedule unless a trajectory outlives a
    version, so `a ≤ b` is only broken when the bootstrap 95% interval of a's per-seed lead over b
    lies above 0 (with 5 seeds or fewer: a is ahead on every seed).
    """
    tps = {m: statistics.median(r["tokens_per_s"] for r in rs) for m, rs in results.items()}
    present = [m for m in MODE_ORDER if m in tps]
    out = []
    for a, b in itertools.pairwise(present):
        if policy(a).on_policy:
            if tps[a] >= tps[b]:
                out.append(f"{a} {tps[a]:.0f} >= {b} {tps[b]:.0f} tokens/s")
            continue
        lead, low, high = report.median_ci(paired(results, a, b, lambda x, y: x - y), seed)
        if low > 0:
            out.append(
                f"{a} {tps[a]:.0f} > {b} {tps[b]:.0f} tokens/s "
                f"(lead per seed {lead:.0f}, 95% CI {low:.0f}–{high:.0f})"
            )
    return out


# per mode, where a step's time went (medians over its runs) and the largest staleness trained
BREAKDOWN = (
    *MEDIAN_KEYS[MEDIAN_KEYS.index("wait_batch_s") : MEDIAN_KEYS.index("trained_mean_turns")],
    "staleness_max",
)


def _table(rows: list[dict[str, Any]], summaries: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """The printed columns: the JSON rows (median [95% interval]) plus where each step's time went."""
    return [
        {
            "mode": r["mode"],
            "α": str(r["alpha"]),
            **interval_columns(r),
            "×sync": report.ci_text(r["speedup_vs_sync"], r["speedup_ci_low"], r["speedup_ci_high"], ".2f"),
            "wait_s": f"{summaries[r['mode']]['wait_batch_s']:.2f}",
            "train_s": f"{summaries[r['mode']]['train_s']:.2f}",
            "sync_s": f"{summaries[r['mode']]['sync_s']:.2f}",
            "aborted": f"{summaries[r['mode']]['aborted']:g}",
            "stale": str(summaries[r["mode"]]["staleness_max"]),
            "turns trained/started": f"{r['trained_mean_turns']:.2f}/{r['started_mean_turns']:.2f}",
            "aborted tok": f"{r['aborted_token_frac']:.0%}",
        }
        for r in rows
    ]


def _plot(
    rows: list[dict[str, Any]],
    summaries: dict[str, dict[str, Any]],
    best: dict[str, Any] | None,
    path: str | None,
) -> str:
    fig, (left, right) = report.new_figure(10, 4, cols=2)
    names = [r["mode"] for r in rows]
    if rows and rows[0]["speedup_vs_sync"] is not None:
        speedups = [r["speedup_vs_sync"] for r in rows]
        yerr = report.ci_errors(rows, "speedup_vs_sync", "speedup_ci_low", "speedup_ci_high")
        left.bar(names, speedups, yerr=yerr, capsize=3, color="tab:blue", label="ours (95% CI)")
        left.axhspan(*PAPER_SPEEDUP, color="tab:orange", alpha=0.2, label="paper, rollart (2.65–4.58×)")
        left.set(ylabel="throughput / sync", title="Trained tokens/s over sync (paired by seed)")
        left.legend(loc="upper left")
    bottom = [0.0] * len(rows)
    for key, color in (("wait_batch_s", "tab:green"), ("train_s", "tab:red"), ("sync_s", "tab:gray")):
        vals = [summaries[m][key] for m in names]
        right.bar(names, vals, bottom=bottom, color=color, label=key.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    steps = [r["step_s"] for r in rows]
    yerr = report.ci_errors(rows, "step_s", "ci_low", "ci_high")
    right.errorbar(names, steps, yerr=yerr, fmt="ko", capsize=3, label="step (95% CI)")
    if best is not None:
        x = names.index("rollart")
        right.plot([x - 0.4, x + 0.4], [best["ideal_step_s"]] * 2, "k--", label="rollart ideal")
    right.set(ylabel="seconds per step", title="Step time: wait for batch / train / sync (medians)")
    right.legend(fontsize=8)
    return report.save_figure(fig, path, "async_modes.png")


def _ideal_note(best: dict[str, Any] | None) -> str:
    if best is None:
        return ""
    verdict = "meets it" if best["meets_ideal"] else "does NOT meet it (the ideal is below its interval)"
    eff = best["efficiency"], best["efficiency_ci_low"], best["efficiency_ci_high"]
    efficiency = report.ci_text(*eff, ".2f")
    return (
        f"rollart step {best['rollart_step_s']:.2f} s [{best['rollart_ci_low']:.2f}, "
        f"{best['rollart_ci_high']:.2f}] vs ideal max(rollout {best['rollout_s']:.2f}, train "
        f"{best['train_s']:.2f}) + exposed sync {best['exposed_sync_s']:.2f} (the smallest of any mode: "
        f"{best['exposed_sync_mode']}) = {best['ideal_step_s']:.2f} s: ideal/rollart "
        f"{efficiency}, "
        f"rollart {verdict}. Rollout "
        "and train from sync+, each alone: its rollout includes the wave's straggler tail, which "
        "rollart's trajectory-level admission also removes.\n"
    )


def _note(s: RunSettings, rows: list[dict[str, Any]], best: dict[str, Any] | None, broken: list[str]) -> str:
    ours = {r["mode"]: r for r in rows}.get("rollart")
    speedup = "—"
    if ours is not None:
        speedup = report.ci_text(
            ours["speedup_vs_sync"], ours["speedup_ci_low"], ours["speedup_ci_high"], ".2f"
        )
    return (
        f"{s.batch_groups} groups x G={s.group_size} per step, {s.envs} envs, T={s.turns_text} turns, "
        f"{s.max_tokens}-token actions, env latency N({s.env_ms:g}, {s.env_sigma_ms:g}) ms per reset/step; "
        f"model {s.size}, weights via {s.store}; {s.rounds} seed(s) per mode, one run of {s.steps} steps "
        f"(+{s.warmup} warm-up) each, seed by seed with the modes rotated per seed. Per mode: the median "
        "over its runs (with an even number, the mean of the middle two) and, in brackets, its "
        "percentile-bootstrap 95% interval over the run-level values; ×sync: the median of per-seed "
        "throughput ratios (paired).\n"
        f"Paper: rollart {PAPER_SPEEDUP[0]}–{PAPER_SPEEDUP[1]}x the throughput of sync. "
        + ("" if speedup == "—" else f"Ours: rollart {speedup}x. ")
        + "Expected order sync < sync+ < one-off <= areal <= rollart (<=: a lead counts only when the 95% "
        + "interval of its per-seed differences excludes 0): "
        + (f"does NOT hold ({'; '.join(broken)}).\n" if broken else "holds.\n")
        + _ideal_note(best)
        + "stale: the most versions a trained sample's start lagged the trainer (never above α: areal and "
        "rollart admit a group only if the batch it lands in is within α). Selection bias: trained vs "
        "started mean turns apart, or aborted tokens above a few percent, mean a mode trains a biased "
        "sample.\n"
    )


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """rollart's throughput over sync (paired by seed; paper 2.65–4.58x; none without sync) and its step time
    beside the ideal overlapped step (None without sync+); nothing without a rollart row."""
    ours = next((r for r in payload["rows"] if r["mode"] == "rollart"), None)
    if ours is None:
        return []
    ideal = payload["ideal"]["ideal_step_s"] if payload["ideal"] else None
    step = report.headline_row(
        "step s, rollart", ours["step_s"], ours["ci_low"], ours["ci_high"], ideal=ideal
    )
    if ours["speedup_vs_sync"] is None:
        return [step]
    speedup = (ours["speedup_vs_sync"], ours["speedup_ci_low"], ours["speedup_ci_high"])
    return [report.headline_row("tokens/s, rollart / sync", *speedup, paper=PAPER_SPEEDUP), step]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    modes: tuple[str, ...] = getattr(args, "modes", MODE_ORDER)
    alpha: int = getattr(args, "alpha", 1)
    plan = [(m, mode_alpha(m, alpha)) for m in modes]
    load_before = os.getloadavg()
    results: Runs = dict(zip(modes, run_all(s, plan), strict=True))
    load_after = os.getloadavg()
    summaries = {m: summarize_runs(rs, s.seed) for m, rs in results.items()}
    rows = build_rows(results, summaries, s.seed)
    best = ideal(summaries)
    broken = order_violations(results, s.seed)
    note = _note(s, rows, best, broken) + report.load_note(load_before, load_after, os.cpu_count())
    return report.publish(
        args,
        "Async modes: step time and throughput",
        s,
        rows,
        note,
        table=_table(rows, summaries),
        clock="wall",
        seeds=round_seeds(s),
        config={"modes": list(modes), "alpha": alpha, "envs": s.envs, "cpus": os.cpu_count()},
        plot=lambda path: _plot(rows, summaries, best, path),
        ideal=best,
        order_violations=broken,
        breakdown=[{"mode": m, **{k: summaries[m][k] for k in BREAKDOWN}} for m in modes],
        runs={m: [{k: v for k, v in r.items() if k != "steps"} for r in rs] for m, rs in results.items()},
        paper={"speedup_vs_sync": list(PAPER_SPEEDUP)},
        load_avg={"before": list(load_before), "after": list(load_after)},
    )
