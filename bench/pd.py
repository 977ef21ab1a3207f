"""`rollart bench pd`: PD disaggregation — colocated vs 1P3D vs 2P2D, for a dense and an MoE model.

Four GPUs of one kind (H800 by default) serve one agentic step (`bench.harness.agentic_mix`); every cost is
a roofline of `engine.devices`. Dense, Qwen2.5-7B (15 GB): one engine per GPU (data parallel). MoE,
Qwen3-30B-A3B (61 GB, 128 experts, top-8): one engine over all the GPUs of a role, expert parallel with
data-parallel attention, as SGLang and vLLM serve MoEs — on one 80 GB GPU its weights would leave KV memory
for ~190k tokens, two or three long SWE contexts. Colocated: the engines prefill and decode, each prefill
pass stalling their decode batch. xPyD: a `PrefillStage` on x GPUs (one engine, TP or EP x) feeds the
decode engines on the other y, shipping each prefilled token's KV over a 400 Gb/s NIC; a decode engine
reserves a request's KV memory before the stage prefills it (`engine.backends.pd`).

Workload, fixed before the run (our assumptions, not the paper's, which gives no lengths): each group of 8
is, with equal chance, an SWE-like task of 30–100 turns of 1,000-token observations or a long-CoT task of
1–5 turns with 2–8k-token answers; one step of 8 and one of 16 groups (64 and 128 trajectories) per
configuration. `--quick` is the same workload at 8 groups only, on 3 seeds instead of 5.

Statistics: every (model, groups, configuration) runs on the same seeds (full 0–4, quick 0–2); a seed fixes
each group's task, the episode lengths, env latencies and output lengths, the same under all three
configurations, so the speedup is paired: the median over seeds of colocated's step time / this one's,
`ci_low`/`ci_high` its percentile-bootstrap 95% interval (`median_ci`); `rollout_s` the median step time
with `rollout_ci_*`; busy shares and KV-transfer time are medians. `vs_paper` says whether the interval
lies below, overlaps or lies above the paper's range. Every configuration is reported; none is picked.

What decides the result here:
- PD takes the prefill passes off the decode GPUs. An agentic turn's prefill attends to the whole cached
  history: on 40k cached tokens a new token costs Qwen2.5-7B about as many attention FLOPs as weight FLOPs.
- MoE: in a colocated expert-parallel engine, a request's prefill attention runs on one GPU while the
  others wait at the next all-to-all (SGLang's "DP attention imbalance"), so one GPU's work stalls four;
  on the prefill GPU it stalls nothing.
- Against that, PD gives x of the 4 GPUs to prefill: it pays only if prefill is about x/4 of the work.
  2P2D overprovisions prefill for both models here.
- The decode engines keep the trajectories' prefix caches, and fewer decode GPUs hold less KV. Once the
  contexts outgrow it, evicted histories are prefilled again (attention quadratic in their length) and
  shipped again, and the prefill GPUs saturate. Whether they outgrow it depends on the seed's draw (how
  many groups are SWE ones, how long their episodes run), and the per-seed speedups spread widely: MoE
  1P3D at 8 groups gave 0.98, 0.75, 0.90, 1.13 and 0.29x on seeds 0–4, the prefill GPU busy 33, 86, 21,
  52 and 92% of the step (the two slow seeds are the two where it saturates).

Measured (full run, 5 seeds, median [95% interval]; paper: dense 1.03–1.05x, MoE 1.11–1.21x): dense 1P3D 0.99x
[0.96, 1.09] at 8 groups and 0.91x [0.67, 1.08] at 16, 2P2D 0.90x [0.84, 0.92] and 0.27x [0.18, 0.74]; MoE
1P3D 0.90x [0.29, 1.13] and 0.55x [0.39, 0.78], 2P2D 0.23x [0.15, 0.58] and 0.46x [0.17, 0.67]. Quick (8
groups, seeds 0–2): dense 1P3D 0.99x [0.96, 1.02], 2P2D 0.85x [0.84, 0.92]; MoE 1P3D 0.90x [0.75, 0.98], 2P2D
0.58x [0.19, 0.58]. No median reaches the paper's range; in the full run the intervals of 1P3D at 8 groups
(and dense 1P3D at 16) overlap it, in the quick one none does. So on this workload PD does not pay on 4 GPUs:
prefill is too small a share of the work for a quarter of the GPUs, and the KV it takes from decode costs
re-prefills. Effects the paper's cluster has and this model lacks, each favouring PD: a KV store in host
memory (Mooncake), from which an evicted history is reloaded rather than recomputed; wider expert parallelism
(a larger MoE over many GPUs, where one rank's prefill stalls more of them); prefill and decode pools sized to
the workload rather than in quarters of 4 GPUs. Also not modelled: collective latency, vLLM's mixed
prefill/decode batches, a prefix cache on the prefill side.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, replace
from typing import Any

from bench import report
from bench.clock import run as run_loop
from bench.harness import (
    add_clock_arguments,
    agentic_mix,
    busy_share,
    clock_note,
    clock_unit_s,
    output_tokens,
    rollout_step,
)

PAPER = {"dense": (1.03, 1.05), "moe": (1.11, 1.21)}  # speedup of PD over colocated
MODELS = {"dense": "qwen2.5-7b", "moe": "qwen3-30b-a3b"}
CONFIGS = {"colocated": (0, 4), "1P3D": (1, 3), "2P2D": (2, 2)}  # (prefill GPUs, decode GPUs)
Run = dict[str, float]  # one step of one configuration on one seed


@dataclass(frozen=True)
class Settings:
    groups: tuple[int, ...] = (8, 16)  # 64 and 128 trajectories on 4 GPUs (module doc)
    swe_turns: tuple[int, int] = (30, 100)
    swe_obs_tokens: int = 1000
    cot_tokens: tuple[int, int] = (2048, 8192)
    prefill_device: str = "H800"
    decode_device: str = "H800"
    clock: str = "virtual"
    unit_ms: float = 40.0
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)


FULL = Settings()
QUICK = replace(FULL, groups=(8,), seeds=(0, 1, 2))  # the same workload: one sweep point, fewer seeds


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--groups",
        type=report.numbers(int, 1),
        help=f"groups of 8 per step, comma-separated (default {FULL.groups})",
    )
    p.add_argument("--prefill-device", help="device of the prefill GPUs (default H800)")
    p.add_argument("--decode-device", help="device of the decode GPUs, and of colocated ones (default H800)")
    add_clock_arguments(p, FULL.unit_ms)
    p.add_argument(
        "--seeds", type=report.numbers(int, 0), help="seeds of each configuration (default 0,1,2,3,4)"
    )


def slots(s: Settings, model_name: str, config: str, unit_s: float, seed: int) -> list[Any]:
    """The proxy's generation slots of one configuration."""
    from engine.backends.modelled import ModelledBackend
    from engine.backends.pd import PDBackend, PrefillStage
    from engine.devices import get_device, get_model
    from engine.rollout.proxy import GenSlot

    model, decode = get_model(model_name), get_device(s.decode_device)
    prefill_gpus, decode_gpus = CONFIGS[config]
    count, tp = (1, decode_gpus) if model.experts else (decode_gpus, 1)  # MoE: one EP engine (module doc)
    kw = {"time_scale": unit_s, "output_tokens": output_tokens(_workloads(s)), "seed": seed}
    if not prefill_gpus:
        engines = [ModelledBackend(model, decode, tp, **kw) for _ in range(count)]
    else:
        stage = PrefillStage(model, get_device(s.prefill_device), prefill_gpus, time_scale=unit_s)
        engines = [PDBackend(model, stage, decode, tp, **kw) for _ in range(count)]
    return [GenSlot(f"{config}-{i}", "gpu-compute", e, capacity=1 << 20) for i, e in enumerate(engines)]


def _workloads(s: Settings) -> list[Any]:
    return agentic_mix(s.swe_turns, s.swe_obs_tokens, s.cot_tokens)


async def measure(s: Settings, model: str, config: str, groups: int, seed: int) -> Run:
    """One rollout step of `groups` groups on one configuration and seed."""
    unit_s = clock_unit_s(s.clock, s.unit_ms)
    gen = slots(s, model, config, unit_s, seed)
    step = await rollout_step(_workloads(s), gen, groups=groups, unit_s=unit_s, seed=seed)
    stats = gen[0].target.stats()
    return {
        "rollout_s": step.modelled_s,
        "decode_busy": busy_share(gen, step.modelled_s),
        "prefill_busy": stats.get("prefill_busy_s", 0.0) / step.modelled_s,
        "kv_transfer_s": stats.get("kv_transfer_s", 0.0),
    }


def summarize(kind: str, groups: int, config: str, runs: list[Run], base: list[Run]) -> dict[str, Any]:
    """One row from a configuration's runs and colocated's on the same seeds (in the same order): the
    speedup is the median of per-seed ratios colocated / this, `ci_low`/`ci_high` its 95% interval."""
    speedup, low, high = report.median_ci(
        [b["rollout_s"] / r["rollout_s"] for b, r in zip(base, runs, strict=True)]
    )
    rollout, rollout_low, rollout_high = report.median_ci([r["rollout_s"] for r in runs])
    paper_low, paper_high = (1.0, 1.0) if config == "colocated" else PAPER[kind]
    vs_paper = "below" if high < paper_low else "above" if low > paper_high else "overlaps"
    return {
        "model": kind,
        "groups": groups,
        "config": config,
        "speedup": speedup,
        "ci_low": low,
        "ci_high": high,
        "paper": f"{paper_low:.2f}–{paper_high:.2f}",
        "vs_paper": "—" if config == "colocated" else vs_paper,
        "rollout_s": rollout,
        "rollout_ci_low": rollout_low,
        "rollout_ci_high": rollout_high,
        **{
            k: statistics.median(r[k] for r in runs) for k in ("decode_busy", "prefill_busy", "kv_transfer_s")
        },
    }


async def _measure(s: Settings) -> list[dict[str, Any]]:
    rows = []
    for kind, model in MODELS.items():
        for groups in s.groups:
            runs = {c: [await measure(s, model, c, groups, seed) for seed in s.seeds] for c in CONFIGS}
            rows += [summarize(kind, groups, c, runs[c], runs["colocated"]) for c in CONFIGS]
    return rows


def _plot(rows: list[dict[str, Any]], json_path: str | None) -> str:
    """Speedup bars with their 95% intervals, one cluster per (model, groups); the paper's range per model."""
    fig, ax = report.new_figure(max(6.0, 1.6 * len(rows) / len(CONFIGS)), 4)
    clusters = list(dict.fromkeys((r["model"], r["groups"]) for r in rows))
    width = 0.25
    for i, config in enumerate(CONFIGS):
        got = [
            next(r for r in rows if (r["model"], r["groups"], r["config"]) == (*c, config)) for c in clusters
        ]
        errors = [[r["speedup"] - r["ci_low"] for r in got], [r["ci_high"] - r["speedup"] for r in got]]
        x = [k + (i - 1) * width for k in range(len(clusters))]
        ax.bar(x, [r["speedup"] for r in got], width, yerr=errors, capsize=3, label=config)
    for k, (kind, _) in enumerate(clusters):
        low, high = PAPER[kind]
        ax.plot([k - 0.4, k + 0.4], [high, high], "k--", lw=1, label="paper range" if k == 0 else None)
        ax.plot([k - 0.4, k + 0.4], [low, low], "k--", lw=1)
    ax.set_xticks(range(len(clusters)), [f"{kind}\n{g} groups" for kind, g in clusters])
    ax.set(
        ylabel="speedup over colocated (median, 95% CI)",
        title=f"PD disaggregation on 4 GPUs: {MODELS['dense']}, {MODELS['moe']}",
    )
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend(fontsize=7, loc="lower left", framealpha=0.9)
    return report.save_figure(fig, json_path, "pd.png")


def _note(rows: list[dict[str, Any]], s: Settings) -> str:
    def ours(kind: str) -> str:
        pd_rows = [r for r in rows if r["model"] == kind and r["config"] != "colocated"]
        return "; ".join(
            f"{r['groups']} groups {r['config']} {r['speedup']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
            for r in pd_rows
        )

    return (
        f"Paper: PD over colocated, dense {PAPER['dense'][0]}–{PAPER['dense'][1]}x, MoE {PAPER['moe'][0]}–"
        f"{PAPER['moe'][1]}x. Ours (median of per-seed ratios over {len(s.seeds)} seeds, 95% interval; "
        f"every configuration, none picked): dense {ours('dense')}. MoE {ours('moe')}.\n"
        "PD gains the prefill passes that stall colocated decode (for the MoE, each prefill's attention on "
        "one GPU of the expert-parallel group while the others wait), minus the GPUs and KV memory it gives "
        "to prefill; when the histories outgrow the decode GPUs' KV, re-prefilling them saturates the "
        "prefill GPUs. Where and why ours differs from the paper: module docstring of bench/pd.py.\n"
        f"4 GPUs (prefill {s.prefill_device}, decode {s.decode_device}); groups of 8; SWE {s.swe_turns[0]}–"
        f"{s.swe_turns[1]} turns of {s.swe_obs_tokens}-token observations, CoT {s.cot_tokens[0]}–"
        f"{s.cot_tokens[1]} tokens; {clock_note(s.clock, s.unit_ms)}"
    )


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Every PD configuration's speedup over colocated (none picked), the paper's range for its model."""
    return [
        report.headline_row(
            f"step, colocated / {r['config']} ({r['model']}, {r['groups']} groups)",
            r["speedup"],
            r["ci_low"],
            r["ci_high"],
            PAPER[r["model"]],
        )
        for r in payload["rows"]
        if r["config"] != "colocated"
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    rows = run_loop(_measure(s), s.clock == "virtual")
    note = _note(rows, s)
    return report.publish(
        args,
        "PD disaggregation: rollout step time and speedup over colocated",
        s,
        rows,
        note,
        config={"models": MODELS},
        plot=lambda path: _plot(rows, path),
        paper=PAPER,
    )
