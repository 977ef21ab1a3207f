"""`rollart bench affinity` (paper R1): equal-cost rollout fleets — H800 only, H20 only, mixed — swept
over the H20/H800 price ratio and the devices' achieved efficiency.

Workload: one multi-task step (`bench.harness.agentic_mix`) of `groups` GRPO groups of 8 (8 groups on a
budget of 4 H800s: 16 trajectories per H800 of budget), each group a
prefill-heavy SWE-like task (30–100 turns of 1,000-token observations, short actions) or a decode-heavy
long-CoT task (1–5 turns, 2,048–8,192 tokens per answer) with probability 1/2. Lengths and env latency are
our assumptions (the paper gives none), stated in the JSON's config. Model: Qwen2.5-7B, one engine per
GPU (TP 1), modelled by the roofline of `engine.devices` on the simulated clock (`--clock wall` for real,
scaled waiting). The LLMProxy routes prefill-heavy requests to the compute pool (H800) and decode-heavy
ones to the bandwidth pool (H20), falling back to the other pool when every preferred engine holds
`capacity` requests; a single-type fleet serves everything on its one kind.

Two assumptions the paper leaves open are swept, not fixed:
- Price: an H20 costs `ratio` H800s, ratio in {0.3, ..., 0.7}. For each ratio the fleets are rebuilt at a
  cost of `budget` H800s: `budget` H800s; round(budget / ratio) H20s; half the budget on each kind
  (budget/2 H800s + round(budget / 2 / ratio) H20s; the split is fixed, not tuned). Whole GPUs make a
  fleet's cost miss the budget by up to half an H20; the fleets are compared on the step time scaled to
  the budget, `step_s x cost / budget` (to first order, a fleet of that exact cost), and the raw step-time
  ratio is reported beside it.
- Efficiency: the achieved fraction `e` of the datasheet peaks, e in {0.5, 0.75, 1.0}, applied to the
  FLOP/s and the bandwidth (`--derate both`, the default) or to one of them (`--derate mfu|mbu`; the
  other stays at peak). A uniform `e` slows every device by the same factor, so only the env latency's
  share of a step moves; derating one side moves the balance between compute- and bandwidth-rich GPUs.

Statistics: every configuration runs on `seeds` seeds (5; `--quick`: 3, on the same workload with ratios
{0.3, 0.5, 0.7} at e = 1.0), each seed playing the same episodes on every fleet; a fleet that two ratios
share (the H800 one, always) runs once per efficiency and seed. On the simulated clock the quick run takes
about a minute on 2 loaded CPU cores, the full one (150 steps) about 9 (estimated from the quick one's
steps, weighted by 1/e). A fleet's row is the median step time over seeds with a percentile-bootstrap 95%
interval (`median_ci`). The mixed fleet's gain is paired per seed:
gain = the faster single-type fleet's scaled step / the mixed fleet's (the faster one picked per seed,
which leans against the mixed fleet), its median and interval over seeds; likewise `vs_h800`, `vs_h20`.
Verdict per (ratio, efficiency): "wins" if the gain's interval lies above 1, "loses" if below, else "tie".
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

from bench import report
from bench.clock import run as run_loop
from bench.harness import (
    Workload,
    add_clock_arguments,
    agentic_mix,
    busy_share,
    clock_note,
    clock_unit_s,
    modelled_slots,
    rollout_step,
)

PAPER = {"vs_h20": (1.30, 1.68), "vs_h800": (1.12, 1.37)}  # R1: mixed-fleet speedup ranges
PAPER_PRICE_RATIO = 0.5  # R1's setting: an H20 at about half an H800's price
FLEETS = ("h800", "h20", "mixed")
DERATE = {"both": (True, True), "mfu": (True, False), "mbu": (False, True)}  # which of (mfu, mbu) is e


@dataclass(frozen=True)
class Settings:
    budget: int = 4  # fleet cost in H800s
    groups: int = 8  # GRPO groups of 8 per step: 16 trajectories per H800 of budget
    ratios: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7)  # price of an H20 in H800s
    efficiencies: tuple[float, ...] = (0.5, 0.75, 1.0)  # achieved fraction of the datasheet peaks
    derate: str = "both"  # which peaks the efficiency applies to: "both", "mfu" or "mbu"
    seeds: int = 5
    seed: int = 0  # the first seed; seeds are seed, seed + 1, ...
    swe_turns: tuple[int, int] = (30, 100)
    swe_obs_tokens: int = 1000
    cot_tokens: tuple[int, int] = (2048, 8192)
    capacity: int = 32  # requests an engine holds before the proxy falls back to the other pool
    clock: str = "virtual"
    unit_ms: float = 40.0  # with clock="wall": wall ms per modelled second
    model: str = "qwen2.5-7b"


FULL = Settings()
QUICK = replace(FULL, ratios=(0.3, 0.5, 0.7), efficiencies=(1.0,), seeds=3)  # same workload, smaller grid


def workloads(s: Settings) -> list[Workload]:
    return agentic_mix(s.swe_turns, s.swe_obs_tokens, s.cot_tokens)


def fleet(name: str, budget: int, ratio: float) -> dict[str, int]:
    """GPUs of a fleet costing about `budget` H800s when an H20 costs `ratio` H800s (module doc)."""
    n = {
        "h800": (budget, 0),
        "h20": (0, round(budget / ratio)),
        "mixed": (budget // 2, round(budget / 2 / ratio)),
    }
    h800, h20 = n[name]
    if name != "h800" and h20 < 1:
        raise SystemExit(f"ratio {ratio} leaves the {name} fleet of budget {budget} without an H20")
    return {k: v for k, v in (("H800", h800), ("H20", h20)) if v}


def fleet_cost(devices: dict[str, int], ratio: float) -> float:
    """Cost in H800s."""
    return devices.get("H800", 0) + ratio * devices.get("H20", 0)


def mfu_mbu(efficiency: float, derate: str) -> tuple[float, float]:
    """(mfu, mbu): `efficiency` for the peaks `derate` names, 1.0 for the other."""
    on_mfu, on_mbu = DERATE[derate]
    return (efficiency if on_mfu else 1.0, efficiency if on_mbu else 1.0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=int, help=f"fleet cost in H800s, even (default {FULL.budget})")
    p.add_argument(
        "--groups", type=report.at_least(int, 1), help=f"groups of 8 per step (default {FULL.groups})"
    )
    p.add_argument(
        "--ratios", type=report.numbers(float, 0, strict=True), help="H20 prices in H800s, e.g. 0.3,0.5"
    )
    p.add_argument(
        "--efficiencies",
        type=report.numbers(float, 0, strict=True),
        help="achieved fractions of peak, e.g. 0.5,1",
    )
    p.add_argument("--derate", choices=list(DERATE), help="peaks the efficiency applies to (default both)")
    p.add_argument("--seeds", type=report.at_least(int, 1), help=f"seeds per configuration ({FULL.seeds})")
    p.add_argument("--seed", type=int, help="first seed (0)")
    add_clock_arguments(p, FULL.unit_ms)


async def _step(s: Settings, devices: dict[str, int], efficiency: float, seed: int) -> dict[str, float]:
    w = workloads(s)
    unit_s = clock_unit_s(s.clock, s.unit_ms)
    mfu, mbu = mfu_mbu(efficiency, s.derate)
    slots = modelled_slots(
        s.model, devices, w, unit_s=unit_s, capacity=s.capacity, seed=seed, mfu=mfu, mbu=mbu
    )
    step = await rollout_step(w, slots, groups=s.groups, unit_s=unit_s, seed=seed)
    return {
        "step_s": step.modelled_s,
        "busy": busy_share(slots, step.modelled_s),
        "fallbacks": step.proxy["fallbacks"],
        "requests": step.proxy["requests"],
    }


Key = tuple[tuple[tuple[str, int], ...], float, int]  # (fleet's GPUs, efficiency, seed)


async def _measure(s: Settings, seeds: list[int]) -> dict[Key, dict[str, float]]:
    """One step per distinct (fleet, efficiency, seed): the H800 fleet, the same at every ratio, runs once."""
    runs: dict[Key, dict[str, float]] = {}
    for e in s.efficiencies:
        for seed in seeds:
            for ratio in s.ratios:
                for name in FLEETS:
                    devices = fleet(name, s.budget, ratio)
                    key = (tuple(sorted(devices.items())), e, seed)
                    if key not in runs:
                        runs[key] = await _step(s, devices, e, seed)
    return runs


def _ci(xs: list[float], seed: int, name: str) -> dict[str, float]:
    mid, low, high = report.median_ci(xs, seed)
    return {name: mid, f"{name}_ci_low": low, f"{name}_ci_high": high}


def gain_cell(scaled: dict[str, list[float]], raw: dict[str, list[float]], seed: int = 0) -> dict[str, Any]:
    """The mixed fleet against the single-type ones from per-seed step times (lists aligned by seed):
    `scaled` (scaled to the budget) for the gains and verdict, `raw` for the unscaled gain (module doc)."""
    mixed = scaled["mixed"]
    best = [min(a, b) / m for a, b, m in zip(scaled["h800"], scaled["h20"], mixed, strict=True)]
    gain, low, high = report.median_ci(best, seed)
    raw_best = [min(a, b) / m for a, b, m in zip(raw["h800"], raw["h20"], raw["mixed"], strict=True)]
    return {
        **_ci([a / m for a, m in zip(scaled["h800"], mixed, strict=True)], seed, "vs_h800"),
        **_ci([b / m for b, m in zip(scaled["h20"], mixed, strict=True)], seed, "vs_h20"),
        "gain": gain,
        "ci_low": low,
        "ci_high": high,
        "gain_raw": report.median_ci(raw_best, seed)[0],
        "verdict": "wins" if low > 1 else "loses" if high < 1 else "tie",
    }


def _fleet_row(
    s: Settings, ratio: float, e: float, name: str, got: list[dict[str, float]]
) -> tuple[dict[str, Any], list[float], list[float]]:
    """A fleet's row at one ratio and efficiency; its per-seed step times, raw and scaled to the budget."""
    devices = fleet(name, s.budget, ratio)
    cost = fleet_cost(devices, ratio)
    raw = [g["step_s"] for g in got]
    scaled = [x * cost / s.budget for x in raw]
    step, low, high = report.median_ci(raw, s.seed)
    row = {
        "ratio": ratio,
        "efficiency": e,
        "fleet": name,
        "gpus": "+".join(f"{n}x{d}" for d, n in devices.items()),
        "cost": round(cost, 3),
        "step_s": step,
        "ci_low": low,
        "ci_high": high,
        "scaled_step_s": statistics.median(scaled),
        **{k: statistics.median(g[k] for g in got) for k in ("busy", "fallbacks", "requests")},
    }
    return row, raw, scaled


def _tables(
    s: Settings, seeds: list[int], runs: dict[Key, dict[str, float]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows (one per ratio, efficiency and fleet) and cells (the mixed fleet's gains, one per ratio and
    efficiency)."""
    rows, cells = [], []
    for ratio in s.ratios:
        for e in s.efficiencies:
            scaled, raw = {}, {}
            for name in FLEETS:
                devices = tuple(sorted(fleet(name, s.budget, ratio).items()))
                row, raw[name], scaled[name] = _fleet_row(
                    s, ratio, e, name, [runs[(devices, e, seed)] for seed in seeds]
                )
                rows.append(row)
            cells.append({"ratio": ratio, "efficiency": e, **gain_cell(scaled, raw, s.seed)})
    return rows, cells


def _plot(s: Settings, cells: list[dict[str, Any]], json_path: str | None) -> str:
    fig, ax = report.new_figure()
    for e in s.efficiencies:
        mine = [c for c in cells if c["efficiency"] == e]
        ax.errorbar(
            [c["ratio"] for c in mine],
            [c["gain"] for c in mine],
            yerr=[[c["gain"] - c["ci_low"] for c in mine], [c["ci_high"] - c["gain"] for c in mine]],
            marker="o",
            capsize=3,
            label=f"efficiency {e:g} ({s.derate})",
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set(
        xlabel="H20 price / H800 price",
        ylabel="mixed-fleet gain over the faster single type",
        title="R1 hardware affinity: equal-cost fleets",
    )
    ax.legend()
    return report.save_figure(fig, json_path, "affinity.png")


def _note(s: Settings, cells: list[dict[str, Any]]) -> str:
    by = {
        v: [f"{c['ratio']:g}/{c['efficiency']:g}" for c in cells if c["verdict"] == v]
        for v in ("wins", "tie", "loses")
    }
    return (
        f"Paper (R1, H20 at about half an H800's price): mixed {PAPER['vs_h20'][0]}–{PAPER['vs_h20'][1]}x "
        f"faster than H20-only, {PAPER['vs_h800'][0]}–{PAPER['vs_h800'][1]}x than H800-only.\n"
        f"Mixed beats both single-type fleets (ratio/efficiency): {', '.join(by['wins']) or 'nowhere'}; "
        f"ties: {', '.join(by['tie']) or 'none'}; loses: {', '.join(by['loses']) or 'nowhere'}.\n"
        f"gain = the faster single-type fleet's step / the mixed fleet's, steps scaled to a cost of "
        f"{s.budget} H800s, median and 95% CI over {s.seeds} seeds paired; gain_raw unscaled. "
        f"Efficiency derates {s.derate}. Step = {s.groups} groups of 8 (SWE-like: "
        f"{s.swe_turns[0]}–{s.swe_turns[1]} turns of {s.swe_obs_tokens}-token observations; long-CoT: 1–5 "
        f"turns of {s.cot_tokens[0]}–{s.cot_tokens[1]} tokens) of {s.model}; {clock_note(s.clock, s.unit_ms)}"
    )


def _check(s: Settings) -> None:
    if s.budget < 2 or s.budget % 2:
        raise SystemExit(f"--budget must be an even number >= 2 (the mixed fleet halves it), got {s.budget}")
    if not all(0 < e <= 1 for e in s.efficiencies):
        raise SystemExit(f"--efficiencies are fractions of peak in (0, 1], got {s.efficiencies}")
    for ratio in s.ratios:
        fleet("mixed", s.budget, ratio)


def _shown(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "ratio": c["ratio"],
        "efficiency": c["efficiency"],
        "vs_h800": c["vs_h800"],
        "vs_h20": c["vs_h20"],
        "gain": c["gain"],
        "ci": f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]",
        "gain_raw": c["gain_raw"],
        "verdict": c["verdict"],
    }


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The mixed fleet's gains at the cell nearest the paper's setting (an H20 at half an H800's price, at
    peak): over each single-type fleet beside the paper's range, and over the faster of the two."""
    c = min(payload["cells"], key=lambda x: (abs(x["ratio"] - PAPER_PRICE_RATIO), -x["efficiency"]))
    at = f"price ratio {c['ratio']:g}, efficiency {c['efficiency']:g}"
    return [
        *(
            report.headline_row(
                f"step, {fleet}-only / mixed ({at})", c[k], c[f"{k}_ci_low"], c[f"{k}_ci_high"], PAPER[k]
            )
            for k, fleet in (("vs_h20", "H20"), ("vs_h800", "H800"))
        ),
        report.headline_row(f"step, faster single type / mixed ({at})", c["gain"], c["ci_low"], c["ci_high"]),
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    _check(s)
    seeds = [s.seed + i for i in range(s.seeds)]
    runs = run_loop(_measure(s, seeds), s.clock == "virtual")
    rows, cells = _tables(s, seeds, runs)
    note = _note(s, cells)
    return report.publish(
        args,
        "R1: mixed fleet against equal-cost single-type fleets",
        s,
        rows,
        note,
        table=[_shown(c) for c in cells],
        seeds=seeds,
        config={"workloads": [asdict(x) for x in workloads(s)]},
        plot=lambda path: _plot(s, cells, path),
        cells=cells,
        paper=PAPER,
    )
