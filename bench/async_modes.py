"""`rollart bench async-modes`: step time and throughput of the five training modes (paper §7, end to end).

Every mode runs the same real system (see `bench.async_runs`): a tiny Qwen2 trained with GRPO by a torch
`TrainWorker` actor, an HF-backend `GenerationWorker` actor, weights through Mooncake, the
`IterationProtocol` driving one step at a time. Envs are fixed-length synthetic episodes whose every
reset and step sleeps a seeded Gaussian draw (`LatencyEnv`); env k sleeps seed k's draws in every mode.

Why env latency, and how much: this machine has 2 CPU cores shared by generation, training and other
users, so overlapping two CPU-bound phases gains little — they only take turns on the same cores. What
overlap can hide for free is time that uses no CPU: env latency (a sandbox, a web page, a judge). The
defaults make one batch's rollout mostly env time (5 × 150 ms per trajectory, ~16 cheap decode steps)
and of the same order as one training step, which is where overlap matters most (at most 2×).

Reported per mode: mean step time, trained tokens/s (whole sequences) and the throughput ratio over
`sync`; beside rollart, the ideal overlapped step `max(rollout, train) + exposed sync`, with rollout and
train taken from `sync+` (each measured alone) and exposed sync from rollart's own steps.
"""

from __future__ import annotations

import argparse
import itertools
import os
from dataclasses import asdict, replace
from typing import Any

from bench.async_runs import (
    MODE_ORDER,
    RunSettings,
    add_run_arguments,
    at_least,
    median_run,
    run_all,
    throughput_se,
)
from bench.report import load_note, new_figure, pick_settings, print_table, save_figure, write_json

PAPER_SPEEDUP = (2.65, 4.58)  # RollArt end-to-end throughput over the synchronous baseline
FULL = RunSettings()
QUICK = replace(FULL, steps=3, rounds=1)
BIAS_KEYS = ("trained_mean_turns", "started_mean_turns", "aborted_token_frac")  # selection bias
ROW_KEYS = ("mode", "alpha", "step_s", "tokens_per_s", "tokens_per_s_se", "speedup_vs_sync", *BIAS_KEYS)
TIE_SE = 2.0  # throughputs closer than this many combined standard errors are a tie


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
        "--alpha", type=at_least(int, 1), default=1, help="α of areal and rollart (default 1)"
    )
    add_run_arguments(parser, FULL, QUICK)


def mode_alpha(mode: str, alpha: int) -> int:
    """The bound each mode runs under: sync modes are on-policy, one-off is one step behind by design."""
    return {"sync": 0, "sync+": 0, "one-off": 1}.get(mode, alpha)


def ideal_step_s(rollout_s: float, train_s: float, exposed_sync_s: float) -> float:
    """Perfect overlap: a step lasts as long as the longer of rollout and training, plus what sync exposes."""
    return max(rollout_s, train_s) + exposed_sync_s


def build_rows(runs: dict[str, dict[str, Any]], se: dict[str, float]) -> list[dict[str, Any]]:
    """One row per mode (in the expected order) from its median run; speedup is throughput over sync's.

    `se`: each mode's throughput standard error (`throughput_se` over all its rounds).
    """
    base = runs["sync"]["tokens_per_s"] if "sync" in runs else None
    return [
        {
            "mode": mode,
            "alpha": r["alpha"],
            "step_s": r["step_s"],
            "tokens_per_s": r["tokens_per_s"],
            "tokens_per_s_se": se[mode],
            "speedup_vs_sync": r["tokens_per_s"] / base if base else None,
            **{k: r[k] for k in BIAS_KEYS},
        }
        for mode in MODE_ORDER
        if (r := runs.get(mode)) is not None
    ]


def ideal(runs: dict[str, dict[str, Any]]) -> dict[str, float] | None:
    """rollart's ideal step: sync+'s rollout and train times, rollart's exposed sync (None without both)."""
    if "sync+" not in runs or "rollart" not in runs:
        return None
    alone, ours = runs["sync+"], runs["rollart"]
    step = ideal_step_s(alone["wait_batch_s"], alone["train_s"], ours["sync_s"])
    return {
        "rollout_s": alone["wait_batch_s"],
        "train_s": alone["train_s"],
        "exposed_sync_s": ours["sync_s"],
        "ideal_step_s": step,
        "rollart_step_s": ours["step_s"],
        "efficiency": step / ours["step_s"],  # ideal / measured: 1.0 is perfect overlap
        "ideal_speedup_vs_sync_plus": alone["step_s"] / step,
    }


def order_violations(rows: list[dict[str, Any]]) -> list[str]:
    """Where throughput breaks sync < sync+ < one-off ≤ areal ≤ rollart (over the modes present, in order).

    The strict steps (sync < sync+ < the rest) compare the measured throughputs. From one-off on, the
    modes may tie: one-off, areal and rollart run the same schedule unless a trajectory outlives a
    version, so `a ≤ b` is only broken when `a` is ahead by more than `TIE_SE` combined standard errors.
    """
    tps = {r["mode"]: r["tokens_per_s"] for r in rows}
    se = {r["mode"]: r.get("tokens_per_s_se", 0.0) for r in rows}
    present = [m for m in MODE_ORDER if m in tps]
    out = []
    for a, b in itertools.pairwise(present):
        if a in ("sync", "sync+"):
            if tps[a] >= tps[b]:
                out.append(f"{a} {tps[a]:.0f} >= {b} {tps[b]:.0f} tokens/s")
            continue
        margin = TIE_SE * (se[a] ** 2 + se[b] ** 2) ** 0.5
        if tps[a] - tps[b] > margin:
            out.append(f"{a} {tps[a]:.0f} > {b} {tps[b]:.0f} tokens/s (by more than {margin:.0f})")
    return out


BREAKDOWN = (
    "wait_batch_s",
    "train_s",
    "sync_s",
    "push_s",
    "pull_s",
    "exposed_pull_s",
    "aborted",
    "trajectories_started",
    "staleness_max",
)


def _table(rows: list[dict[str, Any]], runs: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """The printed columns: the JSON rows plus where each step's time went."""
    return [
        {
            "mode": r["mode"],
            "α": str(r["alpha"]),
            "step_s": f"{r['step_s']:.2f}",
            "tok/s": f"{r['tokens_per_s']:.0f}±{r['tokens_per_s_se']:.0f}",
            "×sync": "—" if r["speedup_vs_sync"] is None else f"{r['speedup_vs_sync']:.2f}",
            "wait_s": f"{runs[r['mode']]['wait_batch_s']:.2f}",
            "train_s": f"{runs[r['mode']]['train_s']:.2f}",
            "sync_s": f"{runs[r['mode']]['sync_s']:.2f}",
            "aborted": str(runs[r["mode"]]["aborted"]),
            "stale": str(runs[r["mode"]]["staleness_max"]),
            "turns trained/started": f"{r['trained_mean_turns']:.2f}/{r['started_mean_turns']:.2f}",
            "aborted tok": f"{r['aborted_token_frac']:.0%}",
        }
        for r in rows
    ]


def _plot(
    rows: list[dict[str, Any]],
    runs: dict[str, dict[str, Any]],
    best: dict[str, float] | None,
    path: str | None,
) -> str:
    fig, (left, right) = new_figure(10, 4, cols=2)
    names = [r["mode"] for r in rows]
    if rows and rows[0]["speedup_vs_sync"] is not None:
        left.bar(names, [r["speedup_vs_sync"] for r in rows], color="tab:blue", label="ours")
        left.axhspan(*PAPER_SPEEDUP, color="tab:orange", alpha=0.2, label="paper, rollart (2.65–4.58×)")
        left.set(ylabel="throughput / sync", title="Trained tokens/s over sync")
        left.legend(loc="upper left")
    bottom = [0.0] * len(rows)
    for key, color in (("wait_batch_s", "tab:green"), ("train_s", "tab:red"), ("sync_s", "tab:gray")):
        vals = [runs[m][key] for m in names]
        right.bar(names, vals, bottom=bottom, color=color, label=key.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if best is not None:
        x = names.index("rollart")
        right.plot([x - 0.4, x + 0.4], [best["ideal_step_s"]] * 2, "k--", label="rollart ideal")
    right.set(ylabel="seconds per step", title="Step time: wait for batch / train / sync")
    right.legend(fontsize=8)
    return save_figure(fig, path, "async_modes.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    modes: tuple[str, ...] = getattr(args, "modes", MODE_ORDER)
    alpha: int = getattr(args, "alpha", 1)
    plan = [(m, mode_alpha(m, alpha)) for m in modes]
    load_before = os.getloadavg()
    results = run_all(s, plan)
    load_after = os.getloadavg()
    runs = {mode: median_run(rs) for (mode, _), rs in zip(plan, results, strict=True)}
    rows = build_rows(runs, {mode: throughput_se(rs) for (mode, _), rs in zip(plan, results, strict=True)})
    best = ideal(runs)
    broken = order_violations(rows)
    ours = runs.get("rollart")
    note = (
        f"{s.batch_groups} groups x G={s.group_size} per step, {s.envs} envs, T={s.turns_text} turns, "
        f"{s.max_tokens}-token actions, env latency N({s.env_ms:g}, {s.env_sigma_ms:g}) ms per reset/step; "
        f"model {s.size}, weights via {s.store}; median of {s.rounds} interleaved run(s) of "
        f"{s.steps} steps (+{s.warmup} warm-up).\n"
        f"Paper: rollart {PAPER_SPEEDUP[0]}–{PAPER_SPEEDUP[1]}x the throughput of sync. "
        + (
            f"Ours: rollart {ours['tokens_per_s'] / runs['sync']['tokens_per_s']:.2f}x. "
            if ours and "sync" in runs
            else ""
        )
        + "Expected order sync < sync+ < one-off <= areal <= rollart (<: a tie within "
        + f"{TIE_SE:g} standard errors of tok/s, printed as ±): "
        + (f"does NOT hold ({'; '.join(broken)}).\n" if broken else "holds.\n")
        + (
            f"rollart step {best['rollart_step_s']:.2f} s vs ideal max(rollout {best['rollout_s']:.2f}, "
            f"train {best['train_s']:.2f}) + exposed sync {best['exposed_sync_s']:.2f} = "
            f"{best['ideal_step_s']:.2f} s (ideal/rollart {best['efficiency']:.2f}; rollout and train "
            "from sync+, each alone: its rollout includes the wave's straggler tail, which rollart's "
            "trajectory-level admission also removes).\n"
            if best
            else ""
        )
        + "stale: the most versions a trained sample's start lagged the trainer (never above α: areal and "
        "rollart admit a group only if the batch it lands in is within α). Selection bias: trained vs "
        "started mean turns apart, or aborted tokens above a few percent, mean a mode trains a biased "
        "sample.\n" + load_note(load_before, load_after, os.cpu_count())
    )
    print_table("Async modes: step time and throughput", _table(rows, runs), note)
    payload: dict[str, Any] = {
        "rows": rows,
        "note": note,
        "ideal": best,
        "order_violations": broken,
        "breakdown": [{"mode": m, **{k: runs[m][k] for k in BREAKDOWN}} for m in modes],
        "runs": {
            m: [{k: v for k, v in r.items() if k != "steps"} for r in rs]
            for (m, _), rs in zip(plan, results, strict=True)
        },
        "paper": {"speedup_vs_sync": list(PAPER_SPEEDUP)},
        "config": asdict(s)
        | {
            "modes": list(modes),
            "alpha": alpha,
            "envs": s.envs,
            "quick": bool(getattr(args, "quick", False)),
            "cpus": os.cpu_count(),
        },
        "load_avg": {"before": list(load_before), "after": list(load_after)},
    }
    payload["png"] = _plot(rows, runs, best, getattr(args, "json", None))
    write_json(getattr(args, "json", None), payload)
    return payload
