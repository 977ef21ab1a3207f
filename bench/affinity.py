"""`rollart bench affinity` (paper R1): equal-cost rollout fleets — H800 only, H20 only, mixed.

One multi-task step (`bench.harness.agentic_mix`): a prefill-heavy SWE-like task (30–100 turns, long
observations, short actions) and a decode-heavy long-CoT task (≤5 turns, thousands of tokens per answer).
Each fleet costs the same per hour (`DeviceProfile.cost_per_hour`: an H20 costs half an H800): `budget`
H800s, or 2·`budget` H20s, or half the budget on each. The LLMProxy routes by the task's profile —
prefill-heavy to the compute pool (H800), decode-heavy to the bandwidth pool (H20) — and falls back to the
other pool when every preferred engine holds `capacity` requests; a single-type fleet serves everything on
its one kind (every request is then a "fallback").

Model: Qwen2.5-7B, one engine per GPU (TP 1), roofline at datasheet peaks. Observation and answer lengths
and the env latency are our assumptions, stated in the config of the JSON; the paper does not give them.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

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
from bench.report import new_figure, pick_settings, print_table, save_figure, write_json

PAPER = {"vs_h20": (1.30, 1.68), "vs_h800": (1.12, 1.37)}  # R1: mixed-fleet speedup ranges
FLEETS = ("h800", "h20", "mixed")


@dataclass(frozen=True)
class Settings:
    budget: int = 8  # fleet cost in H800-hours per hour
    groups: int = 16  # GRPO groups of 8 per step, each task with probability 1/2
    swe_turns: tuple[int, int] = (30, 100)
    swe_obs_tokens: int = 1000
    cot_tokens: tuple[int, int] = (2048, 8192)
    capacity: int = 32  # requests an engine holds before the proxy falls back to the other pool
    clock: str = "virtual"
    unit_ms: float = 40.0  # with clock="wall": wall ms per modelled second
    model: str = "qwen2.5-7b"
    seed: int = 0


FULL = Settings()
QUICK = Settings(
    budget=4, groups=4, swe_turns=(30, 50), swe_obs_tokens=1500, cot_tokens=(1024, 4096), unit_ms=25.0
)


def workloads(s: Settings) -> list[Workload]:
    return agentic_mix(s.swe_turns, s.swe_obs_tokens, s.cot_tokens)


def fleet(name: str, budget: int) -> dict[str, int]:
    """Devices of an equal-cost fleet (H800 = 1 cost unit, H20 = 0.5)."""
    from engine.devices import get_device

    h800, h20 = (round(budget / get_device(d).cost_per_hour) for d in ("H800", "H20"))
    return {"h800": {"H800": h800}, "h20": {"H20": h20}, "mixed": {"H800": h800 // 2, "H20": h20 // 2}}[name]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=int, help=f"fleet cost in H800 units, even (default {FULL.budget})")
    p.add_argument("--groups", type=int, help=f"groups of 8 per step (default {FULL.groups})")
    add_clock_arguments(p, FULL.unit_ms)
    p.add_argument("--seed", type=int)


async def _measure(s: Settings) -> list[dict[str, Any]]:
    from engine.devices import get_device

    w = workloads(s)
    unit_s = clock_unit_s(s.clock, s.unit_ms)
    rows = []
    for name in FLEETS:
        devices = fleet(name, s.budget)
        slots = modelled_slots(s.model, devices, w, unit_s=unit_s, capacity=s.capacity, seed=s.seed)
        step = await rollout_step(w, slots, groups=s.groups, unit_s=unit_s, seed=s.seed)
        rows.append(
            {
                "fleet": name,
                "step_s": step.modelled_s,
                "gpus": "+".join(f"{n}x{d}" for d, n in devices.items()),
                "cost": sum(n * get_device(d).cost_per_hour for d, n in devices.items()),
                "busy": busy_share(slots, step.modelled_s),
                "fallbacks": step.proxy["fallbacks"],
                "requests": step.proxy["requests"],
            }
        )
    by = {r["fleet"]: r["step_s"] for r in rows}
    for r in rows:
        r["speedup_of_mixed"] = r["step_s"] / by["mixed"]
    return rows


def _plot(rows: list[dict[str, Any]], json_path: str | None) -> str:
    fig, ax = new_figure()
    ax.bar(
        [r["fleet"] for r in rows], [r["step_s"] for r in rows], color=["tab:blue", "tab:orange", "tab:green"]
    )
    for i, r in enumerate(rows):
        ax.text(
            i,
            r["step_s"],
            f"{r['step_s']:.0f} s\nmixed {r['speedup_of_mixed']:.2f}x",
            ha="center",
            va="bottom",
        )
    ax.set(ylabel="rollout step (modelled s)", title="R1 hardware affinity: equal-cost fleets")
    ax.margins(y=0.2)
    return save_figure(fig, json_path, "affinity.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    if s.budget < 2 or s.budget % 2:
        raise SystemExit(f"--budget must be an even number >= 2 (the mixed fleet halves it), got {s.budget}")
    rows = run_loop(_measure(s), s.clock == "virtual")
    by = {r["fleet"]: r for r in rows}
    vs_h20, vs_h800 = by["h20"]["speedup_of_mixed"], by["h800"]["speedup_of_mixed"]
    note = (
        f"Paper (R1): mixed {PAPER['vs_h20'][0]}–{PAPER['vs_h20'][1]}x faster than H20-only, "
        f"{PAPER['vs_h800'][0]}–{PAPER['vs_h800'][1]}x than H800-only. "
        f"Ours: {vs_h20:.2f}x and {vs_h800:.2f}x.\n"
        f"Step = {s.groups} groups of 8, each task with probability 1/2 (SWE-like: {s.swe_turns[0]}–"
        f"{s.swe_turns[1]} turns of {s.swe_obs_tokens}-token observations; long-CoT: 1–5 turns of "
        f"{s.cot_tokens[0]}–{s.cot_tokens[1]} tokens) of {s.model}; {clock_note(s.clock, s.unit_ms)}"
    )
    print_table("R1: rollout step time of equal-cost fleets", rows, note)
    payload: dict[str, Any] = {
        "rows": rows,
        "config": asdict(s)
        | {"quick": bool(getattr(args, "quick", False)), "workloads": [asdict(x) for x in workloads(s)]},
        "paper": PAPER,
        "note": note,
        "png": _plot(rows, getattr(args, "json", None)),
    }
    write_json(getattr(args, "json", None), payload)
    return payload
