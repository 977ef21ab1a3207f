"""`rollart bench alpha-sweep`: rollart's step time and staleness aborts as the bound α grows (paper §7).

The same real system and synthetic latency envs as `async-modes` (see `bench.async_runs`), in `rollart`
mode only, once per α. A larger α admits more groups ahead of the trainer (a group starts only if the
batch it lands in is within α of the version served), so more rollout overlaps training, on staler
samples; aborts (work the admission did not foresee) should stay at 0. The paper finds the gain
plateaus: at most 1.22× the throughput of α = 1.

The default runs twice the envs one batch needs, so rollout runs ahead of training and α decides how
much of that lead survives; env latency is spread wider than in `async-modes` (σ = μ/2) so long
trajectories span several versions.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, replace
from typing import Any

from bench.async_runs import RunSettings, add_run_arguments, median_run, run_all
from bench.report import load_note, new_figure, pick_settings, print_table, save_figure, write_json

PAPER_MAX_GAIN = 1.22  # best α over α = 1, throughput
FULL = replace(RunSettings(), concurrency=32, env_sigma_ms=75.0)
QUICK = replace(FULL, steps=3, rounds=1)
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


def build_rows(runs: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One row per α (ascending); the gain is throughput over the smallest α swept (α = 1 by default)."""
    runs = sorted(runs, key=lambda r: r["alpha"])
    base = runs[0]["tokens_per_s"]
    return [
        {
            "alpha": r["alpha"],
            "step_s": r["step_s"],
            "tokens_per_s": r["tokens_per_s"],
            "speedup_vs_alpha1": r["tokens_per_s"] / base if runs[0]["alpha"] == 1 else None,
            "aborted": r["aborted"],
            "aborted_per_step": r["aborted"] / steps,
            "staleness_max": r["staleness_max"],
        }
        for r in runs
    ]


def _table(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The printed columns (80 characters); the JSON keeps every field."""
    return [
        {
            "α": str(r["alpha"]),
            "step_s": f"{r['step_s']:.2f}",
            "tok/s": f"{r['tokens_per_s']:.0f}",
            "×α=1": "—" if r["speedup_vs_alpha1"] is None else f"{r['speedup_vs_alpha1']:.2f}",
            "aborted": str(r["aborted"]),
            "aborted/step": f"{r['aborted_per_step']:.1f}",
            "max staleness": str(r["staleness_max"]),
        }
        for r in rows
    ]


def _plot(rows: list[dict[str, Any]], path: str | None) -> str:
    fig, ax = new_figure(6, 4, cols=1)
    alphas = [r["alpha"] for r in rows]
    ax.plot(alphas, [r["step_s"] for r in rows], "o-", color="tab:blue", label="step time")
    ax.set(xlabel="staleness bound α", ylabel="seconds per step", title="rollart: step time and aborts vs α")
    twin = ax.twinx()
    twin.bar(alphas, [r["aborted_per_step"] for r in rows], alpha=0.3, color="tab:red", label="aborted/step")
    twin.set_ylabel("trajectories aborted per step")
    ax.set_ylim(bottom=0)
    ax.set_zorder(twin.get_zorder() + 1)  # the line over the bars
    ax.patch.set_visible(False)
    ax.legend(loc="upper right")
    twin.legend(loc="upper center")
    return save_figure(fig, path, "alpha_sweep.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    alphas = alphas_of(args)
    load_before = os.getloadavg()
    results = run_all(s, [("rollart", a) for a in alphas])
    load_after = os.getloadavg()
    rows = build_rows([median_run(rs) for rs in results], s.steps)
    gains = [r["speedup_vs_alpha1"] for r in rows if r["speedup_vs_alpha1"] is not None]
    note = (
        f"rollart; {s.batch_groups} groups x G={s.group_size} per step, {s.envs} envs, "
        f"T={s.turns_text} turns, env latency N({s.env_ms:g}, {s.env_sigma_ms:g}) ms; "
        f"median of {s.rounds} interleaved run(s) of {s.steps} steps (+{s.warmup} warm-up).\n"
        f"Paper: the gain plateaus, at most {PAPER_MAX_GAIN}x over α=1. "
        + (f"Ours: best {max(gains):.2f}x over α=1.\n" if gains else "\n")
        + load_note(load_before, load_after, os.cpu_count())
    )
    print_table("α sweep: rollart step time and staleness aborts", _table(rows), note)
    payload: dict[str, Any] = {
        "rows": rows,
        "note": note,
        "runs": [[{k: v for k, v in r.items() if k != "steps"} for r in rs] for rs in results],
        "paper": {"max_gain_vs_alpha1": PAPER_MAX_GAIN},
        "config": asdict(s)
        | {"alphas": list(alphas), "envs": s.envs, "quick": bool(getattr(args, "quick", False))},
        "load_avg": {"before": list(load_before), "after": list(load_after)},
    }
    payload["png"] = _plot(rows, getattr(args, "json", None))
    write_json(getattr(args, "json", None), payload)
    return payload
