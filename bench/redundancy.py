"""`rollart bench redundancy`: redundant env rollouts against stragglers and failures (paper §6.1).

Each GRPO group of G starts G + r members (`RolloutScheduler(redundancy=r)`); the first G *by launch order*
that end well are kept and the rest cancelled (so a slow member is waited for, not selected against: spares
stand in for members that die, without the delay of starting a replacement); a member whose env dies with
no spare left is replaced while the group can still be completed.
The envs (`bench.harness.WorkloadEnv` in a `LatencyEnv`) are multi-turn with Gaussian step latency; a
`straggler_rate` share of them is `straggler_factor` times slower (an overloaded sandbox host) and a
`fail_rate` share dies at a random step (a crashed sandbox). Generation is ample (one H800 per 64 envs), so
what r buys is the tail, not throughput. speedup = step time with r = 0 / step time with r, same G and
number of groups, same seeds. Envs are named by (group, member) in launch order and draw their straggling,
failure and latencies from the name, so r = 2 plays the same first G members per group as r = 0, plus two.
The straggler share and slowdown set the tail, hence the speedup; the paper does not give its distribution.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from typing import Any

from bench.clock import run as run_loop
from bench.harness import (
    Workload,
    add_clock_arguments,
    clock_note,
    clock_unit_s,
    modelled_slots,
    rollout_step,
)
from bench.report import new_figure, numbers, pick_settings, print_table, save_figure, write_json

PAPER_MAX_SPEEDUP = 1.62
MODEL = "qwen2.5-7b"


@dataclass(frozen=True)
class Settings:
    group_sizes: tuple[int, ...] = (4, 8, 16)
    env_groups: tuple[int, ...] = (8, 32)
    redundancy: tuple[int, ...] = (0, 1, 2, 4)
    turns: tuple[int, int] = (8, 16)
    straggler_rate: float = 0.1
    straggler_factor: float = 3.0
    fail_rate: float = 0.05
    clock: str = "virtual"
    unit_ms: float = 20.0
    seed: int = 0


FULL = Settings()
QUICK = Settings(group_sizes=(4, 8), env_groups=(8, 16), redundancy=(0, 1, 2))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group-sizes", type=numbers(int, 0), help="GRPO group sizes G (default 4,8,16)")
    p.add_argument("--env-groups", type=numbers(int, 0), help="groups per step (default 8,32)")
    p.add_argument("--redundancy", type=numbers(int, 0), help="extra members per group r (default 0,1,2,4)")
    p.add_argument("--straggler-rate", type=float, help=f"share of slow envs (default {FULL.straggler_rate})")
    p.add_argument(
        "--straggler-factor", type=float, help=f"how much slower (default {FULL.straggler_factor})"
    )
    p.add_argument("--fail-rate", type=float, help=f"share of envs that die (default {FULL.fail_rate})")
    add_clock_arguments(p, FULL.unit_ms)
    p.add_argument("--seed", type=int)


def workload(s: Settings, group_size: int) -> Workload:
    return Workload(
        "agent", "prefill-heavy", s.turns, 200, (16, 64), group_size=group_size, env_latency=(1.0, 0.3),
        fail_rate=s.fail_rate, straggler_rate=s.straggler_rate, straggler_factor=s.straggler_factor,
    )  # fmt: skip


async def _measure(s: Settings) -> list[dict[str, Any]]:
    unit_s = clock_unit_s(s.clock, s.unit_ms)
    rows = []
    for g in s.group_sizes:
        for groups in s.env_groups:
            base = 0.0
            for r in s.redundancy:
                w = [workload(s, g)]
                engines = math.ceil(groups * (g + r) / 64)
                gen = modelled_slots(MODEL, {"H800": engines}, w, unit_s=unit_s, capacity=64, seed=s.seed)
                step = await rollout_step(w, gen, groups=groups, unit_s=unit_s, seed=s.seed, redundancy=r)
                base = base or step.modelled_s
                rows.append(
                    {
                        "group_size": g,
                        "env_groups": groups,
                        "redundancy": r,
                        "rollout_s": step.modelled_s,
                        "speedup": base / step.modelled_s,
                        "envs_started": step.counts.get("trajectories_started", 0),
                        "failed": step.counts.get("trajectories_failed", 0),
                        "cancelled": step.counts.get("trajectories_aborted", 0),
                        "groups_dropped": sum(
                            v for k, v in step.counts.items() if k.startswith("groups_dropped")
                        ),
                    }
                )
    return rows


def _plot(rows: list[dict[str, Any]], s: Settings, json_path: str | None) -> str:
    fig, ax = new_figure()
    for g in s.group_sizes:
        for groups in s.env_groups:
            mine = [r for r in rows if r["group_size"] == g and r["env_groups"] == groups]
            ax.plot(
                [r["redundancy"] for r in mine],
                [r["speedup"] for r in mine],
                "o-",
                label=f"G={g}, {groups} groups",
            )
    ax.axhline(PAPER_MAX_SPEEDUP, color="k", ls="--", lw=1, label=f"paper: up to {PAPER_MAX_SPEEDUP}x")
    ax.set(
        xlabel="redundant members per group r", ylabel="speedup over r = 0", title="Redundant env rollouts"
    )
    ax.legend(fontsize=7)
    return save_figure(fig, json_path, "redundancy.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    if 0 not in s.redundancy:
        s = type(s)(**(asdict(s) | {"redundancy": (0, *s.redundancy)}))  # the baseline every speedup needs
    rows = run_loop(_measure(s), s.clock == "virtual")
    best = max(rows, key=lambda r: r["speedup"])
    note = (
        f"Paper: redundant rollouts speed a step up by up to {PAPER_MAX_SPEEDUP}x. Ours: up to "
        f"{best['speedup']:.2f}x (G={best['group_size']}, {best['env_groups']} groups, "
        f"r={best['redundancy']}).\n"
        f"{s.turns[0]}–{s.turns[1]} turns, env step N(1 s, 0.3 s); {s.straggler_rate:.0%} of envs "
        f"{s.straggler_factor:g}x slower, {s.fail_rate:.0%} die mid-episode; {clock_note(s.clock, s.unit_ms)}"
    )
    print_table("Redundant env rollouts: step time and speedup over r = 0", rows, note)
    payload: dict[str, Any] = {
        "rows": rows,
        "config": asdict(s) | {"quick": bool(getattr(args, "quick", False)), "model": MODEL},
        "paper": {"max_speedup": PAPER_MAX_SPEEDUP},
        "note": note,
        "png": _plot(rows, s, getattr(args, "json", None)),
    }
    write_json(getattr(args, "json", None), payload)
    return payload
