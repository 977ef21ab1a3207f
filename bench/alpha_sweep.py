"""`rollart bench alpha-sweep`: rollart's step time and staleness aborts as the bound α grows (paper §7).

The same real system and synthetic latency envs as `async-modes` (see `bench.async_runs`), in `rollart`
mode only, once per α and seed. A larger α admits more groups ahead of the trainer (a group starts only
if the batch it lands in is within α of the version served), so more rollout overlaps training, on
staler samples; aborts (work the admission did not foresee) should stay at 0 and no trained sample may
lag more than α versions (`bound_held`, a check that can fail). The paper finds the gain plateaus: at
most 1.22× the throughput of α = 1.

The default runs twice the envs one batch needs, so rollout runs ahead of training and α decides how
much of that lead survives; env latency is spread wider than in `async-modes` (σ = μ/2) so long
trajectories span several versions.

Statistics: every α runs once per seed (`--rounds` seeds: 5 in the full run, 3 with `--quick`), seed by
seed with the α values rotated each seed (`bench.async_runs.run_order`). A row is the median over its
seeds of the run-level values (`summarize_runs`), with a percentile-bootstrap 95% interval; the gain over
α = 1 is paired by seed (runs of one seed play the same env draws): the median of per-seed throughput
ratios, with its interval. The best α is the one of the largest median gain, always reported with that
gain's interval; picking the largest of several medians favours an α that got lucky, and the interval
is that α's own, not corrected for the pick.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from bench import report
from bench.async_modes import paired
from bench.async_runs import (
    RunSettings,
    add_run_arguments,
    interval_columns,
    interval_fields,
    round_seeds,
    run_all,
    suite_session,
    summarize_runs,
)

SUITE_SESSION = suite_session  # bench/all.py: one Ray and its kept workers with the next such benchmark
PAPER_MAX_GAIN = 1.22  # best α over α = 1, throughput
FULL = replace(RunSettings(), concurrency=32, env_sigma_ms=75.0, rounds=5)  # 5 seeds per α
QUICK = replace(FULL, steps=2, rounds=3)  # the same workload: fewer steps, seeds and α values
FULL_ALPHAS = (1, 2, 3, 4, 5, 6)
QUICK_ALPHAS = (1, 2, 4)


def _alphas(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(a) for a in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, e.g. 1,2,3; got {text!r}"
        ) from None
    if any(a < 1 for a in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"alphas must be distinct and >= 1, got {text!r}")
    return tuple(sorted(values))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--alphas", type=_alphas, help=f"bounds to sweep (default {FULL_ALPHAS}; quick {QUICK_ALPHAS})"
    )
    add_run_arguments(parser, FULL, QUICK)


def alphas_of(args: argparse.Namespace) -> tuple[int, ...]:
    given = getattr(args, "alphas", None)
    return given or (QUICK_ALPHAS if getattr(args, "quick", False) else FULL_ALPHAS)


def build_rows(results: dict[int, list[dict[str, Any]]], steps: int, seed: int = 0) -> list[dict[str, Any]]:
    """One row per α (ascending): the medians over its seeds, `ci_low`/`ci_high` the bootstrap 95%
    interval of the step time, and the gain over α = 1 paired by seed (None when α = 1 was not swept)."""
    by_name = {str(a): rs for a, rs in results.items()}  # `paired` takes configurations by name
    rows = []
    for alpha in sorted(results):
        m = summarize_runs(results[alpha], seed)
        gain: tuple[float | None, ...] = (None, None, None)
        if 1 in results:
            gain = report.median_ci(paired(by_name, str(alpha), "1", lambda x, y: x / y), seed)
        rows.append(
            {
                "alpha": alpha,
                **interval_fields(m),
                "speedup_vs_alpha1": gain[0],
                "speedup_ci_low": gain[1],
                "speedup_ci_high": gain[2],
                "aborted": m["aborted"],
                "aborted_per_step": m["aborted"] / steps,
                "staleness_max": m["staleness_max"],
            }
        )
    return rows


def best_alpha(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The α > 1 of the largest median gain over α = 1, with that gain's 95% interval (None without α = 1
    or another α). `beats_alpha1`: the interval lies above 1; `within_paper_max`: it reaches down to the
    paper's largest gain or below (ours is consistent with the plateau)."""
    candidates = [r for r in rows if r["alpha"] > 1 and r["speedup_vs_alpha1"] is not None]
    if not candidates:
        return None
    r = max(candidates, key=lambda r: r["speedup_vs_alpha1"])
    return {
        "alpha": r["alpha"],
        "speedup_vs_alpha1": r["speedup_vs_alpha1"],
        "ci_low": r["speedup_ci_low"],
        "ci_high": r["speedup_ci_high"],
        "beats_alpha1": r["speedup_ci_low"] > 1,
        "within_paper_max": r["speedup_ci_low"] <= PAPER_MAX_GAIN,
    }


def _table(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The printed columns: median [95% interval]; the JSON keeps every field."""
    return [
        {
            "α": str(r["alpha"]),
            **interval_columns(r),
            "×α=1": report.ci_text(r["speedup_vs_alpha1"], r["speedup_ci_low"], r["speedup_ci_high"], ".2f"),
            "aborted/step": f"{r['aborted_per_step']:.1f}",
            "max staleness": str(r["staleness_max"]),
        }
        for r in rows
    ]


def _plot(rows: list[dict[str, Any]], path: str | None) -> str:
    fig, ax = report.new_figure(6, 4, cols=1)
    alphas = [r["alpha"] for r in rows]
    yerr = report.ci_errors(rows, "step_s", "ci_low", "ci_high")
    ax.errorbar(alphas, [r["step_s"] for r in rows], yerr=yerr, fmt="o-", capsize=3, label="step (95% CI)")
    ax.set(xlabel="staleness bound α", ylabel="seconds per step", title="rollart: step time and aborts vs α")
    twin = ax.twinx()
    twin.bar(alphas, [r["aborted_per_step"] for r in rows], alpha=0.3, color="tab:red", label="aborted/step")
    twin.set_ylabel("trajectories aborted per step (median)")
    ax.set_ylim(bottom=0)
    ax.set_zorder(twin.get_zorder() + 1)  # the line over the bars
    ax.patch.set_visible(False)
    ax.legend(loc="upper right")
    twin.legend(loc="upper center")
    return report.save_figure(fig, path, "alpha_sweep.png")


def _note(s: RunSettings, best: dict[str, Any] | None, bound_held: bool) -> str:
    ours = ""
    if best is not None:
        gain = report.ci_text(best["speedup_vs_alpha1"], best["ci_low"], best["ci_high"], ".2f")
        verdict = "above 1" if best["beats_alpha1"] else "reaching 1 or below: no gain shown"
        ours = f"Ours: best α={best['alpha']}, {gain}x over α=1 (interval {verdict}). "
    return (
        f"rollart; {s.batch_groups} groups x G={s.group_size} per step, {s.envs} envs, "
        f"T={s.turns_text} turns, env latency N({s.env_ms:g}, {s.env_sigma_ms:g}) ms; {s.rounds} seed(s) "
        f"per α, one run of {s.steps} steps (+{s.warmup} warm-up) each, seed by seed with the α values "
        "rotated. Per α: the median over its runs and, in brackets, its percentile-bootstrap 95% interval; "
        "×α=1: the median of per-seed throughput ratios (paired). The best α is the largest of several "
        "medians (it favours a lucky α); its interval is its own.\n"
        f"Paper: the gain plateaus, at most {PAPER_MAX_GAIN}x over α=1. {ours}"
        f"Staleness bound (max staleness <= α in every row): {'held' if bound_held else 'BROKEN'}.\n"
    )


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The best α's throughput over α = 1 with that α's own interval, beside the paper's largest gain."""
    best = payload["best"]
    if best is None:
        return []
    metric = f"tokens/s, best α={best['alpha']} (of {len(payload['rows'])} swept) / α=1"
    return [
        report.headline_row(
            metric, best["speedup_vs_alpha1"], best["ci_low"], best["ci_high"], PAPER_MAX_GAIN
        )
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    alphas = alphas_of(args)
    load_before = os.getloadavg()
    results = dict(zip(alphas, run_all(s, [("rollart", a) for a in alphas]), strict=True))
    load_after = os.getloadavg()
    rows = build_rows(results, s.steps, s.seed)
    best = best_alpha(rows)
    bound_held = all(r["staleness_max"] <= r["alpha"] for r in rows)
    note = _note(s, best, bound_held) + report.load_note(load_before, load_after, os.cpu_count())
    return report.publish(
        args,
        "α sweep: rollart step time and staleness aborts",
        s,
        rows,
        note,
        table=_table(rows),
        clock="wall",
        seeds=round_seeds(s),
        config={"alphas": list(alphas), "envs": s.envs},
        plot=lambda path: _plot(rows, path),
        best=best,
        bound_held=bound_held,
        runs={
            str(a): [{k: v for k, v in r.items() if k != "steps"} for r in rs] for a, rs in results.items()
        },
        paper={"max_gain_vs_alpha1": PAPER_MAX_GAIN},
        load_avg={"before": list(load_before), "after": list(load_after)},
    )
