"""`bench time-to-score`'s rows: each run's time to the target, the per-mode summary over seeds, the
wall-time budget that every mode of a seed trains for (sync+'s own time for its steps) and the plot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from bench import report

TARGET_SHARE = 0.9  # of sync+'s median gain over the untrained model, when no --target is given


def budgets(runs: list[dict[str, Any]]) -> dict[tuple[str, str, int], float]:
    """The training wall time of each (setting, layout, seed)'s sync+ run: what every other mode of that
    seed may train for. A fixed number of steps would stop a mode that is faster per step at an earlier
    wall time, so it could be sooner to a score only by learning more per step; with the same budget it
    takes the steps that fit, and sooner means sooner on the clock."""
    return {
        (r["setting"], r["layout"], r["seed"]): r["points"][-1]["train_wall_s"]
        for r in runs
        if r["mode"] == "sync+"
    }


def should_stop(step: int, clock_s: float, max_steps: int, budget_s: float | None) -> bool:
    """After `step` (ended `clock_s` into the run): stop at the budget, or at `max_steps` (the steps asked
    when there is no budget, a cap when there is)."""
    return step >= max_steps or (budget_s is not None and clock_s >= budget_s)


def auto_target(runs: list[dict[str, Any]], before: float) -> float:
    """The untrained model's success `before` plus TARGET_SHARE × the median gain sync+'s runs (in any
    setting) made by their end. A share of the final score alone can lie below `before`, and then every
    mode's first checkpoint "reaches" it whatever it learned. If sync+ gained nothing the target is
    `before` itself (`run` says so beside the table: those times measure no learning)."""
    finals = [r["points"][-1]["success"] for r in runs if r["mode"] == "sync+"]
    if not finals:
        raise ValueError("no sync+ run to set the target from: pass --target")
    return before + TARGET_SHARE * max(0.0, statistics.median(finals) - before)


def time_to_target(run: dict[str, Any], target: float) -> dict[str, Any]:
    """The JSON row of one run: when its first checkpoint at or above `target` was reached, after how many
    steps, and the run's mean step time (its training wall time over its steps); apart, its first step
    (which warms every process up in any mode) and the mean of the steps after it."""
    hit = next((p for p in run["points"] if p["success"] >= target), None)
    last = run["points"][-1]
    first = run["phases"][0]["step_s"]
    return {
        "setting": run["setting"],
        "layout": run["layout"],
        "mode": run["mode"],
        "alpha": run["alpha"],
        "seed": run["seed"],
        "target": target,
        "time_to_target_s": hit["train_wall_s"] if hit else None,
        "tokens_to_target": hit["tokens"] if hit else None,
        "reached": hit is not None,
        "steps_to_target": hit["step"] if hit else None,
        "steps": last["step"],
        "step_s": last["train_wall_s"] / last["step"],
        "first_step_s": first,
        "later_step_s": (last["train_wall_s"] - first) / (last["step"] - 1) if last["step"] > 1 else None,
        "budget_s": run.get("budget_s"),
        "final_success": last["success"],
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (setting, layout, mode, α): runs that reached the target, the median time over seeds counting a
    run that never reached it as never (as a median survival time is read: defined only when more than half
    got there), its bootstrap 95% interval over seeds (`ci_high` None where the resampled median can be
    "never"), the range of the times that were reached, and the speedup of the median over sync+'s in the
    same setting and layout (None where either median is undefined).

    The time to the target is steps × step time, so two more figures say which of them a speedup comes
    from: the median steps to the target (a miss counted as never, as the time) and
    `step_speedup_vs_sync_plus`, sync+'s median step time over the mode's (how much faster it steps,
    whatever it learns per step); `later_step_speedup_vs_sync_plus` the same for the steps after the first
    (a start-up every mode pays: the speedup the steps tend to as a run gets longer)."""
    groups: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["layout"], r["mode"], r["alpha"]), []).append(r)
    out = []
    for (setting, layout, mode, alpha), rs in groups.items():
        times = [r["time_to_target_s"] for r in rs if r["reached"]]
        never = [r["time_to_target_s"] if r["reached"] else math.inf for r in rs]
        median, low, high = (_finite(x) for x in report.median_ci(never))
        steps = statistics.median(r["steps_to_target"] if r["reached"] else math.inf for r in rs)
        out.append(
            {
                "setting": setting,
                "layout": layout,
                "mode": mode,
                "alpha": alpha,
                "reached": f"{len(times)}/{len(rs)}",
                "median_s": median,
                "ci_low": low,  # a bootstrap 95% interval of the median over seeds
                "ci_high": high,
                "min_s": min(times, default=None),
                "max_s": max(times, default=None),
                "steps_to_target": _finite(steps),
                "step_s": statistics.median(r["step_s"] for r in rs),
                "later_step_s": _median_known(r["later_step_s"] for r in rs),
            }
        )
    base = {(o["setting"], o["layout"]): o for o in out if o["mode"] == "sync+"}
    for o in out:
        b = base.get((o["setting"], o["layout"]))
        o["speedup_vs_sync_plus"] = (
            b["median_s"] / o["median_s"] if b and b["median_s"] and o["median_s"] else None
        )
        o["step_speedup_vs_sync_plus"] = b["step_s"] / o["step_s"] if b else None
        o["later_step_speedup_vs_sync_plus"] = (
            b["later_step_s"] / o["later_step_s"] if b and b["later_step_s"] and o["later_step_s"] else None
        )
    return out


def _median_known(xs: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None where none is."""
    known = [x for x in xs if x is not None]
    return statistics.median(known) if known else None


def _finite(x: float) -> float | None:
    """None for "never" (an infinite time), else `x`."""
    return None if math.isinf(x) else x


def table(summary: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The printed columns of `summarize`'s rows."""
    return [
        {
            "setting": o["setting"],
            "layout": o["layout"],
            "mode": o["mode"],
            "α": str(o["alpha"]),
            "reached": o["reached"],
            "median s": report.or_dash(o["median_s"]),
            "range s": f"{report.or_dash(o['min_s'])}–{report.or_dash(o['max_s'])}",
            "×sync+": report.or_dash(o["speedup_vs_sync_plus"], ".2f"),
            "steps": report.or_dash(o["steps_to_target"]),
            "step s": report.or_dash(o["step_s"], ".1f"),
            "step ×sync+": report.or_dash(o["step_speedup_vs_sync_plus"], ".2f"),
            "later ×sync+": report.or_dash(o["later_step_speedup_vs_sync_plus"], ".2f"),
        }
        for o in summary
    ]


def plot(runs: list[dict[str, Any]], target: float, path: str | None) -> str:
    """Held-out success over training wall time, one line per run, a panel per (setting, layout)."""
    panels = sorted({(r["setting"], r["layout"]) for r in runs})
    fig, axes = report.new_figure(6 * len(panels), 4, cols=len(panels))
    axes = axes if len(panels) > 1 else [axes]
    for ax, (setting, layout) in zip(axes, panels, strict=True):
        for r in (r for r in runs if (r["setting"], r["layout"]) == (setting, layout)):
            xs = [0.0] + [p["train_wall_s"] for p in r["points"]]
            ys = [r["before"]] + [p["success"] for p in r["points"]]
            ax.plot(xs, ys, marker="o", label=f"{r['mode']} α={r['alpha']} s{r['seed']}")
        ax.axhline(target, color="k", linestyle="--", label=f"target {target:.2f}")
        ax.set(xlabel="training wall time (s)", ylabel="held-out success", title=f"{setting}, {layout}")
        ax.legend(fontsize=7)
    return report.save_figure(fig, path, "time_to_score.png")


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """rollart α=1's time to the target, sync+'s median / its, per setting and layout (paper: 2.05×); and
    beside it the step time's ratio, the part of that speedup that stepping faster alone would give."""
    ours = [o for o in payload["summary"] if (o["mode"], o["alpha"]) == ("rollart", 1)]
    rows = []
    for o in ours:
        where = f"sync+ / rollart α=1 ({o['setting']} envs, {o['layout']} cores)"
        rows += [
            report.headline_row(f"time to target, {where}", o["speedup_vs_sync_plus"], paper=2.05),
            report.headline_row(f"step time, {where}", o["step_speedup_vs_sync_plus"]),
        ]
    return rows
