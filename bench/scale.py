"""`rollart bench scale`: what the control plane costs as concurrency grows, on this machine's CPUs.

E trajectories (E = 128 → 1024 → 4096) run at once through ONE LLMProxy, each its own EnvManager loop, on
the wall clock (this is the one benchmark where the control plane's CPU time is the measurement). Every
trajectory plays T turns; every reset and step sleeps exactly `env_s` modelled seconds (no variance), and
generation is modelled on H800s (one engine per 256 trajectories), so with a free control plane every
trajectory would take the same ideal time:

    ideal = (T + 1) x env_s + T x (mean modelled time of a request in its engine)

(in wall seconds: x `unit_ms`). overhead_ms_per_request = the process's CPU time during the step / requests:
what the control plane (env loop, tokenisation, proxy routing, engine pacing, scheduler, reward, buffer)
costs per request, which other processes' load does not change. delay_ms_per_turn = (mean trajectory wall
time − ideal) / T: the delay it adds to each turn, load included. efficiency = ideal / step wall time (the
last trajectory's end). One event loop saturates once E x (CPU per turn) exceeds the time between a
trajectory's turns; efficiency falls from there — sooner on a machine that other processes load.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource
from dataclasses import asdict, dataclass
from typing import Any

from bench.harness import Workload, modelled_slots, rollout_step
from bench.report import new_figure, pick_settings, print_table, save_figure, write_json

MODEL, PER_ENGINE, GROUP = "qwen2.5-7b", 256, 8


@dataclass(frozen=True)
class Settings:
    concurrency: tuple[int, ...] = (128, 1024, 4096)
    turns: int = 8
    env_s: float = 2.0
    unit_ms: float = 100.0
    seed: int = 0


FULL = Settings()
QUICK = Settings(concurrency=(128, 1024), turns=3)


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < GROUP or v % GROUP for v in values):
        raise argparse.ArgumentTypeError(
            f"each concurrency must be a positive multiple of {GROUP}, got {text!r}"
        )
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=_concurrency, help="trajectories at once (default 128,1024,4096)")
    p.add_argument(
        "--turns", type=int, help=f"turns per trajectory (default {FULL.turns}; quick {QUICK.turns})"
    )
    p.add_argument("--env-s", type=float, help=f"modelled seconds per env reset/step (default {FULL.env_s})")
    p.add_argument("--unit-ms", type=float, help=f"wall ms per modelled second (default {FULL.unit_ms})")
    p.add_argument("--seed", type=int)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(s: Settings) -> list[dict[str, Any]]:
    unit_s = s.unit_ms / 1000
    w = [Workload("agent", "prefill-heavy", (s.turns, s.turns), 64, (16, 16), env_latency=(s.env_s, 0.0))]
    rows = []
    for e in s.concurrency:
        gen = modelled_slots(
            MODEL, {"H800": math.ceil(e / PER_ENGINE)}, w, unit_s=unit_s, capacity=PER_ENGINE
        )
        cpu0 = _cpu_s()
        step = await rollout_step(w, gen, groups=e // GROUP, unit_s=unit_s, seed=s.seed, timeout_s=3600)
        cpu = _cpu_s() - cpu0
        kept = [t for t in step.trajectories if t.reward is not None]
        ideal = ((s.turns + 1) * s.env_s + s.turns * step.mean_gen_modelled_s) * unit_s
        mean_wall = sum(t.timings["total_s"] for t in kept) / len(kept)
        rows.append(
            {
                "concurrency": e,
                "overhead_ms_per_request": cpu / step.proxy["requests"] * 1000,
                "efficiency": ideal / step.clock_s,
                "delay_ms_per_turn": (mean_wall - ideal) / s.turns * 1000,
                "step_wall_s": step.clock_s,
                "ideal_s": ideal,
                "requests": step.proxy["requests"],
                "mean_proxy_ms": step.proxy["mean_proxy_s"] * 1000,
                "load_1m": os.getloadavg()[0],
            }
        )
    return rows


def _plot(rows: list[dict[str, Any]], json_path: str | None) -> str:
    fig, (left, right) = new_figure(9, 4, cols=2)
    e = [r["concurrency"] for r in rows]
    left.plot(e, [r["overhead_ms_per_request"] for r in rows], "o-", label="CPU per request")
    left.plot(e, [r["delay_ms_per_turn"] for r in rows], "s--", label="delay per turn (wall)")
    left.set(xscale="log", xlabel="concurrent trajectories", ylabel="ms")
    left.legend()
    right.plot(e, [r["efficiency"] for r in rows], "o-")
    right.set(xscale="log", xlabel="concurrent trajectories", ylabel="rollout efficiency (ideal / measured)")
    right.set_ylim(0, 1.05)
    fig.suptitle(f"One LLMProxy on {os.cpu_count()} CPU cores")
    return save_figure(fig, json_path, "scale.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    rows = asyncio.run(_measure(s))
    note = (
        "Paper: no figure for this; it runs thousands of trajectories through its proxy on a CPU cluster. "
        f"Ours, one process on {os.cpu_count()} cores (1-min load after each run: "
        f"{', '.join(format(r['load_1m'], '.1f') for r in rows)}): efficiency "
        f"{' -> '.join(format(r['efficiency'], '.2f') for r in rows)} at "
        f"{' -> '.join(str(r['concurrency']) for r in rows)} trajectories.\n"
        f"T={s.turns} turns, env step {s.env_s} s, 1 modelled s = {s.unit_ms} ms wall, {MODEL} on H800s "
        f"(one per {PER_ENGINE} trajectories)."
    )
    print_table("Control-plane overhead vs concurrency (one LLMProxy)", rows, note)
    payload: dict[str, Any] = {
        "rows": rows,
        "config": asdict(s) | {"quick": bool(getattr(args, "quick", False)), "cpus": os.cpu_count()},
        "paper": None,
        "note": note,
        "png": _plot(rows, getattr(args, "json", None)),
    }
    write_json(getattr(args, "json", None), payload)
    return payload
