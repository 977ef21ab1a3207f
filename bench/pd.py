"""`rollart bench pd`: PD disaggregation — colocated vs 1P3D vs 2P2D, for a dense and an MoE model.

Four GPUs of one kind (H800 by default) serve one agentic step (`bench.harness.agentic_mix`). Colocated:
four engines, each prefilling and decoding (an iteration's prefill stalls its decode batch). xPyD: a
`PrefillStage` on x GPUs (one prefill engine, TP x) feeds y decode-only `PDBackend` engines, shipping each
prefilled token's KV over a 400 Gb/s NIC. Dense: Qwen2.5-7B; MoE: Qwen3-30B-A3B (128 experts, top-8). A
decode step of an MoE batch reads every expert some token of the batch picked (nearly all of them from a few
dozen sequences on), and a prefill batch on a dedicated device reads them at least once (`engine.devices`).

Under this roofline PD gains what colocated engines lose to prefill stalling their decode batch, minus the
decode capacity the prefill GPUs no longer provide: 0.9–1.0x for the dense model; for the MoE it is a
loss: its decode step costs nearly the same at any batch size (all experts read), so each decode GPU given
up costs throughput, and its 61 GB of weights leave ~19 GB of KV cache on an 80 GB H800, so long SWE contexts
are evicted and re-prefilled (and re-shipped). The paper's MoE gain (1.11–1.21x) needs effects this model
lacks (e.g. expert-parallel decode over many GPUs, chunked-prefill interference beyond the roofline).
With 32 groups (256 trajectories on 4 GPUs) the prefix caches thrash: evicted SWE contexts are re-prefilled,
which PD pays twice (the one prefill GPU saturates, and the KV is shipped again): 0.62x dense, 0.66x MoE.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from bench.clock import run as run_loop
from bench.harness import (
    add_clock_arguments,
    agentic_mix,
    busy_share,
    clock_note,
    clock_unit_s,
    min_sleep_s,
    output_tokens,
    rollout_step,
)
from bench.report import new_figure, pick_settings, print_table, save_figure, write_json

PAPER = {"dense": (1.03, 1.05), "moe": (1.11, 1.21)}  # speedup of PD over colocated
MODELS = {"dense": "qwen2.5-7b", "moe": "qwen3-30b-a3b"}
CONFIGS = {"colocated": (0, 4), "1P3D": (1, 3), "2P2D": (2, 2)}  # (prefill GPUs, decode GPUs)


@dataclass(frozen=True)
class Settings:
    groups: int = 16  # 128 trajectories on 4 GPUs (at 32 the prefix caches thrash: module doc)
    swe_turns: tuple[int, int] = (30, 100)
    swe_obs_tokens: int = 1000
    cot_tokens: tuple[int, int] = (2048, 8192)
    prefill_device: str = "H800"
    decode_device: str = "H800"
    clock: str = "virtual"
    unit_ms: float = 40.0
    seed: int = 0


FULL = Settings()
QUICK = Settings(groups=8, swe_turns=(30, 50), swe_obs_tokens=1500, cot_tokens=(1024, 4096))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--groups", type=int, help=f"groups of 8 per step (default {FULL.groups})")
    p.add_argument("--prefill-device", help="device of the prefill GPUs (default H800)")
    p.add_argument("--decode-device", help="device of the decode GPUs, and of colocated ones (default H800)")
    add_clock_arguments(p, FULL.unit_ms)
    p.add_argument("--seed", type=int)


def slots(s: Settings, model_name: str, config: str, unit_s: float) -> list[Any]:
    """The proxy's generation slots of one configuration."""
    from engine.backends.modelled import ModelledBackend
    from engine.backends.pd import PDBackend, PrefillStage
    from engine.devices import get_device, get_model
    from engine.rollout.proxy import GenSlot

    model, decode = get_model(model_name), get_device(s.decode_device)
    prefill_gpus, decode_gpus = CONFIGS[config]
    kw = {"time_scale": unit_s, "output_tokens": output_tokens(_workloads(s)), "seed": s.seed,
          "min_sleep_s": min_sleep_s(unit_s)}  # fmt: skip
    if not prefill_gpus:
        engines = [ModelledBackend(model, decode, **kw) for _ in range(decode_gpus)]
    else:
        stage = PrefillStage(model, get_device(s.prefill_device), prefill_gpus, time_scale=unit_s)
        engines = [PDBackend(model, stage, decode, **kw) for _ in range(decode_gpus)]
    return [GenSlot(f"{config}-{i}", "gpu-compute", e, capacity=1 << 20) for i, e in enumerate(engines)]


def _workloads(s: Settings) -> list[Any]:
    return agentic_mix(s.swe_turns, s.swe_obs_tokens, s.cot_tokens)


async def _measure(s: Settings) -> list[dict[str, Any]]:
    unit_s = clock_unit_s(s.clock, s.unit_ms)
    rows = []
    for kind, model in MODELS.items():
        base = 0.0
        for config in CONFIGS:
            gen = slots(s, model, config, unit_s)
            step = await rollout_step(_workloads(s), gen, groups=s.groups, unit_s=unit_s, seed=s.seed)
            stats = gen[0].target.stats()
            base = base or step.modelled_s
            rows.append(
                {
                    "model": kind,
                    "config": config,
                    "rollout_s": step.modelled_s,
                    "speedup": base / step.modelled_s,
                    "paper": "1.00" if config == "colocated" else "{:.2f}–{:.2f}".format(*PAPER[kind]),
                    "decode_busy": busy_share(gen, step.modelled_s),
                    "prefill_busy": stats.get("prefill_busy_s", 0.0) / step.modelled_s,
                    "kv_transfer_s": stats.get("kv_transfer_s", 0.0),
                }
            )
    return rows


def _plot(rows: list[dict[str, Any]], json_path: str | None) -> str:
    fig, ax = new_figure()
    width = 0.25
    for i, config in enumerate(CONFIGS):
        got = [r["speedup"] for r in rows if r["config"] == config]
        ax.bar([k + (i - 1) * width for k in range(len(MODELS))], got, width, label=config)
    for k, kind in enumerate(MODELS):
        low, high = PAPER[kind]
        ax.plot([k - 0.4, k + 0.4], [high, high], "k--", lw=1, label="paper (best PD)" if k == 0 else None)
        ax.plot([k - 0.4, k + 0.4], [low, low], "k:", lw=1)
    ax.set_xticks(range(len(MODELS)), [f"{k} ({m})" for k, m in MODELS.items()])
    ax.set(ylabel="speedup over colocated", title="PD disaggregation on 4 GPUs")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend()
    return save_figure(fig, json_path, "pd.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    rows = run_loop(_measure(s), s.clock == "virtual")
    best = {
        k: max(r["speedup"] for r in rows if r["model"] == k and r["config"] != "colocated") for k in MODELS
    }
    note = (
        f"Paper: PD over colocated, dense {PAPER['dense'][0]}–{PAPER['dense'][1]}x, MoE {PAPER['moe'][0]}–"
        f"{PAPER['moe'][1]}x. Ours (best of 1P3D/2P2D): dense {best['dense']:.2f}x, MoE {best['moe']:.2f}x "
        "(why the MoE differs: module docstring of bench/pd.py).\n"
        f"4 GPUs (prefill {s.prefill_device}, decode {s.decode_device}); {s.groups} groups of 8; "
        f"{clock_note(s.clock, s.unit_ms)}"
    )
    print_table("PD disaggregation: rollout step time", rows, note)
    payload: dict[str, Any] = {
        "rows": rows,
        "config": asdict(s) | {"quick": bool(getattr(args, "quick", False)), "models": MODELS},
        "paper": PAPER,
        "note": note,
        "png": _plot(rows, getattr(args, "json", None)),
    }
    write_json(getattr(args, "json", None), payload)
    return payload
