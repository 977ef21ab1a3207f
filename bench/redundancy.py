"""`rollart bench redundancy`: redundant env rollouts against stragglers and failures (paper §6.1).

Each GRPO group of G starts G + r members (`RolloutScheduler(redundancy=r)`); the first G *by launch order*
that end well are kept and the rest cancelled (so a slow member is waited for, not selected against: spares
stand in for members that die, without the delay of starting a replacement); a member whose env dies with
no spare left is replaced while the group can still be completed.
The envs (`bench.harness.WorkloadEnv` in a `LatencyEnv`) are multi-turn with Gaussian step latency; a
`straggler_rate` share of them is `straggler_factor` times slower (an overloaded sandbox host) and a
`fail_rate` share dies at a random step (a crashed sandbox). The paper does not give its straggler
distribution, so share and slowdown are a grid (full: {5, 10, 20} % x {2, 4, 8}), not one assumed point.

Equal generation capacity: every r of a configuration runs on the same number of modelled H800 engines
(`--engines`, or one per 64 envs of the r = 0 step), so the extra members of r > 0 compete with the kept
ones for the same decode batches: the speedup includes the cost of generating for spares, and can be < 1.
speedup = step time with r = 0 / step time with r, paired per seed (same G, groups, straggling, engines
and seed), median over the seeds with a bootstrap 95 % interval (`median_ci`); `pays` says whether that
interval lies above 1 ("yes"), below 1 ("no") or holds it ("~"). `gen_tokens`: tokens the engines
generated (median over seeds), `wasted_token_frac`: the share of them outside the kept members (cancelled
spares, including their turns cut off in the engine, and failed members; at r = 0 only the failed ones).
Envs are named by (group, member) in launch order and draw their straggling, failure and latencies from the
name and seed, so r = 2 plays the same first G members per group as r = 0, plus two.
Modelled: the model calls (roofline `ModelledBackend`, Qwen2.5-7B) and the env latencies, on the simulated
clock by default (`--clock wall` for real, scaled waiting; the JSON's `clock` says which). Assumed: the
episode shape (8–16 turns, 200-token observations, 16–64-token actions), N(1 s, 0.3 s) env steps, 5 % dying
envs and 64 envs per engine. Full: G in {4, 8, 16} x {8, 32} groups x 9 straggler points x r in
{0, 1, 2, 4} x 5 seeds = 1,080 steps; `--quick`: G in {4, 8} x 8 groups x {5, 20} % x {2, 8} x r in
{0, 1, 2} x 3 seeds = 72 steps. With 3 seeds the interval of a median is about the range of the three.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

from bench import report
from bench.clock import run as run_loop
from bench.harness import (
    Workload,
    add_clock_arguments,
    clock_note,
    clock_unit_s,
    modelled_slots,
    rollout_step,
)
from engine.types import TrajStatus

PAPER_MAX_SPEEDUP = 1.62
MODEL = "qwen2.5-7b"
ENVS_PER_ENGINE = 64  # of the r = 0 step, when --engines is not given


@dataclass(frozen=True)
class Settings:
    group_sizes: tuple[int, ...] = (4, 8, 16)
    env_groups: tuple[int, ...] = (8, 32)
    redundancy: tuple[int, ...] = (0, 1, 2, 4)
    straggler_rates: tuple[float, ...] = (0.05, 0.1, 0.2)
    straggler_factors: tuple[float, ...] = (2.0, 4.0, 8.0)
    fail_rate: float = 0.05
    engines: int | None = None  # None: one per ENVS_PER_ENGINE envs of the r = 0 step
    turns: tuple[int, int] = (8, 16)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    clock: str = "virtual"
    unit_ms: float = 20.0


FULL = Settings()
QUICK = Settings(
    group_sizes=(4, 8), env_groups=(8,), redundancy=(0, 1, 2), straggler_rates=(0.05, 0.2),
    straggler_factors=(2.0, 8.0), seeds=(0, 1, 2),
)  # fmt: skip


@dataclass(frozen=True)
class Point:
    """One configuration; every r of it runs on the same engines and seeds."""

    group_size: int
    env_groups: int
    straggler_rate: float
    straggler_factor: float


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group-sizes", type=report.numbers(int, 1), help="GRPO group sizes G (default 4,8,16)")
    p.add_argument("--env-groups", type=report.numbers(int, 1), help="groups per step (default 8,32)")
    p.add_argument(
        "--redundancy", type=report.numbers(int, 0), help="extra members per group r (default 0,1,2,4)"
    )
    p.add_argument(
        "--straggler-rates", type=report.numbers(float, 0), help="shares of slow envs (default 0.05,0.1,0.2)"
    )
    p.add_argument(
        "--straggler-factors", type=report.numbers(float, 1), help="how much slower (default 2,4,8)"
    )
    p.add_argument("--fail-rate", type=float, help=f"share of envs that die (default {FULL.fail_rate})")
    p.add_argument(
        "--engines",
        type=report.at_least(int, 1),
        help=f"generation engines for every r (default: one per {ENVS_PER_ENGINE} envs of r = 0)",
    )
    p.add_argument(
        "--seeds", type=report.numbers(int, 0), help="seeds of each configuration (default 0,1,2,3,4)"
    )
    add_clock_arguments(p, FULL.unit_ms)


def workload(s: Settings, p: Point) -> Workload:
    return Workload(
        "agent", "prefill-heavy", s.turns, 200, (16, 64), group_size=p.group_size, env_latency=(1.0, 0.3),
        fail_rate=s.fail_rate, straggler_rate=p.straggler_rate, straggler_factor=p.straggler_factor,
    )  # fmt: skip


def engines_for(s: Settings, p: Point) -> int:
    return s.engines or math.ceil(p.env_groups * p.group_size / ENVS_PER_ENGINE)


async def _step(s: Settings, p: Point, r: int, seed: int) -> dict[str, float]:
    """One step: its modelled time, the tokens generated and kept, and the scheduler's counts."""
    unit_s = clock_unit_s(s.clock, s.unit_ms)
    w = [workload(s, p)]
    gen = modelled_slots(
        MODEL, {"H800": engines_for(s, p)}, w, unit_s=unit_s, capacity=ENVS_PER_ENGINE, seed=seed
    )
    step = await rollout_step(w, gen, groups=p.env_groups, unit_s=unit_s, seed=seed, redundancy=r)
    generated = sum(slot.target.stats()["generated_tokens"] for slot in gen)
    ended_well = (TrajStatus.DONE, TrajStatus.TRUNCATED)  # redundant ones end ABORTED
    kept = sum(t.num_action_tokens for t in step.trajectories if t.status in ended_well)
    return {
        "rollout_s": step.modelled_s,
        "gen_tokens": generated,
        "wasted_token_frac": 1 - kept / generated,
        "failed": step.counts.get("trajectories_failed", 0),
        "cancelled": step.counts.get("trajectories_aborted", 0),
        "groups_dropped": sum(v for k, v in step.counts.items() if k.startswith("groups_dropped")),
    }


def _row(
    s: Settings, p: Point, r: int, runs: list[dict[str, float]], base: list[dict[str, float]]
) -> dict[str, Any]:
    """The seeds of one (configuration, r): medians, the speedup's interval, counts summed over seeds."""
    speedup, low, high = report.median_ci(
        [b["rollout_s"] / x["rollout_s"] for b, x in zip(base, runs, strict=True)]
    )
    pays = "base" if r == 0 else "yes" if low > 1 else "no" if high < 1 else "~"
    return asdict(p) | {
        "redundancy": r,
        "engines": engines_for(s, p),
        "rollout_s": statistics.median(x["rollout_s"] for x in runs),
        "speedup": speedup,
        "ci_low": low,
        "ci_high": high,
        "pays": pays,
        "gen_tokens": round(statistics.median(x["gen_tokens"] for x in runs)),
        "wasted_token_frac": statistics.median(x["wasted_token_frac"] for x in runs),
        **{k: sum(int(x[k]) for x in runs) for k in ("failed", "cancelled", "groups_dropped")},
    }


def points(s: Settings) -> list[Point]:
    return [
        Point(*c)
        for c in itertools.product(s.group_sizes, s.env_groups, s.straggler_rates, s.straggler_factors)
    ]


async def _measure(s: Settings) -> list[dict[str, Any]]:
    rows = []
    for p in points(s):
        runs = {r: [await _step(s, p, r, seed) for seed in s.seeds] for r in s.redundancy}
        rows += [_row(s, p, r, runs[r], runs[0]) for r in s.redundancy]
    return rows


def _plot(rows: list[dict[str, Any]], s: Settings, json_path: str | None) -> str:
    """One heat map per r > 0: median speedup per configuration (rows) and straggling (columns)."""
    from matplotlib.colors import Normalize

    spares = [r for r in s.redundancy if r > 0]
    shapes = list(itertools.product(s.group_sizes, s.env_groups))
    tails = list(itertools.product(s.straggler_rates, s.straggler_factors))
    fig, axes = report.new_figure(
        2 + 0.9 * len(tails) * len(spares), 1.5 + 0.4 * len(shapes), cols=len(spares)
    )
    axes = list(axes) if len(spares) > 1 else [axes]
    half = max([0.01] + [abs(r["speedup"] - 1) for r in rows])  # symmetric about 1: equal gains and losses
    norm = Normalize(1 - half, 1 + half)
    for ax, r in zip(axes, spares, strict=True):
        at = {(x["group_size"], x["env_groups"], x["straggler_rate"], x["straggler_factor"]): x
              for x in rows if x["redundancy"] == r}  # fmt: skip
        grid = [[at[(*shape, *tail)] for tail in tails] for shape in shapes]
        ax.imshow([[x["speedup"] for x in line] for line in grid], cmap="RdBu", norm=norm)
        for i, line in enumerate(grid):
            for j, x in enumerate(line):
                mark = {"yes": "+", "no": "-"}.get(x["pays"], "")
                ink = "w" if abs(norm(x["speedup"]) - 0.5) > 0.3 else "k"
                ax.text(j, i, f"{x['speedup']:.3f}{mark}", ha="center", va="center", fontsize=6, color=ink)
        ax.set_xticks(range(len(tails)), [f"{a:.0%}\nx{f:g}" for a, f in tails], fontsize=6)
        ax.set_yticks(range(len(shapes)), [f"G={g}, {n} groups" for g, n in shapes], fontsize=6)
        ax.set_title(f"r = {r}: speedup over r = 0", fontsize=8)
        ax.set_xlabel("straggler share, slowdown", fontsize=7)
    fig.suptitle(
        f"blue: faster than r = 0, red: slower; + / -: 95% interval above / below 1 (paper: up to "
        f"{PAPER_MAX_SPEEDUP}x); the same engines for every r",
        fontsize=7,
    )
    return report.save_figure(fig, json_path, "redundancy.png")


def _extremes(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """The rows with spares (r > 0), and among them the best and the worst speedup over r = 0."""
    spare = [r for r in rows if r["redundancy"] > 0]
    return spare, max(spare, key=lambda r: r["speedup"]), min(spare, key=lambda r: r["speedup"])


def _where(r: dict[str, Any]) -> str:
    """A row's configuration: G, groups, straggler share and slowdown, r."""
    return (
        f"G={r['group_size']}, {r['env_groups']} groups, {r['straggler_rate']:.0%} "
        f"x{r['straggler_factor']:g}, r={r['redundancy']}"
    )


def _note(rows: list[dict[str, Any]], s: Settings) -> str:
    spare, best, worst = _extremes(rows)

    def where(r: dict[str, Any]) -> str:
        return f"{r['speedup']:.3f}x [{r['ci_low']:.3f}, {r['ci_high']:.3f}] ({_where(r)})"

    count = {v: sum(r["pays"] == v for r in spare) for v in ("yes", "no")}
    engines = f"--engines {s.engines}" if s.engines else f"one H800 per {ENVS_PER_ENGINE} envs of r = 0"
    return (
        f"Paper: redundant rollouts speed a step up by up to {PAPER_MAX_SPEEDUP}x. Ours (median over "
        f"{len(s.seeds)} seeds, 95% interval): from {where(worst)} to {where(best)}; r pays in "
        f"{count['yes']} of {len(spare)} configurations and costs in {count['no']}.\n"
        f"Same engines for every r ({engines}); {s.turns[0]}–{s.turns[1]} turns, env step N(1 s, 0.3 s), "
        f"{s.fail_rate:.0%} of envs die mid-episode; "
        f"failed/cancelled/groups_dropped summed over seeds; {clock_note(s.clock, s.unit_ms)}"
    )


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The best (paper: up to 1.62x) and the worst speedup over r = 0 of the configurations with spares, as
    in the note, and the share of them where r pays (its interval above 1)."""
    spare, best, worst = _extremes(payload["rows"])
    pays = sum(r["pays"] == "yes" for r in spare) / len(spare)
    return [
        report.headline_row(
            f"step, r=0 / r, best of {len(spare)} ({_where(best)})",
            best["speedup"],
            best["ci_low"],
            best["ci_high"],
            PAPER_MAX_SPEEDUP,
        ),
        report.headline_row(
            f"step, r=0 / r, worst of {len(spare)} ({_where(worst)})",
            worst["speedup"],
            worst["ci_low"],
            worst["ci_high"],
        ),
        report.headline_row(f"share of the {len(spare)} configurations with spares where r pays", pays),
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    if 0 not in s.redundancy:
        s = replace(s, redundancy=(0, *s.redundancy))  # the baseline every speedup needs
    if not any(r > 0 for r in s.redundancy):
        raise SystemExit("--redundancy needs an r > 0 to compare with r = 0")
    rows = run_loop(_measure(s), s.clock == "virtual")
    note = _note(rows, s)
    return report.publish(
        args,
        "Redundant env rollouts: step time and speedup over r = 0, equal engines",
        s,
        rows,
        note,
        config={"model": MODEL},
        plot=lambda path: _plot(rows, s, path),
        paper={"max_speedup": PAPER_MAX_SPEEDUP},
    )
