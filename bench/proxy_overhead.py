"""`rollart bench proxy-overhead`: what the LLMProxy + Ray worker path costs in generation throughput.

The same requests (greedy, fixed length: eos off, so both paths generate exactly the same tokens) go
(a) straight to an in-process vLLM engine and (b) through the LLMProxy actor to a GenerationWorker actor
running the same engine, on this machine's CPUs (wall clock; nothing is modelled). Reported: generated
tokens/s of each and the ratio proxy/direct, against a target of ≥ 0.9.

Statistics: one model (built from `--seed`) and one request set, so the measurements differ only by the
machine's noise; a row is one path measured `--repeats` times (5 in the full run, 3 with `--quick`, which
also halves the concurrent requests and keeps their length). The paths take turns, the one that goes
first alternating each repeat (`bench.async_runs.run_order`), after one unmeasured warm-up of each. Per
path: the median tokens/s over its repeats with a percentile-bootstrap 95% interval (`ci_low`/`ci_high`);
the ratio is paired by repeat (the median of per-repeat ratios, with its interval). The target is met when
the whole interval is at or above 0.9, missed when it is below, undecided when it straddles 0.9.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.async_runs import run_order
from bench.report import at_least, ci_text, headline_row, median_ci, pick_settings, publish

TARGET = 0.9  # proxy/direct throughput the LLMProxy path must keep
PATHS = ("direct engine", "LLMProxy + worker actor")
Send = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class Settings:
    requests: int = 256  # concurrent requests per measurement
    max_tokens: int = 64  # tokens generated per request
    prompt_tokens: int = 64
    size: str = "small"  # small: compute dominates, as with real models
    repeats: int = 5  # measurements per path
    seed: int = 0  # the model's weights


FULL = Settings()
QUICK = replace(FULL, requests=128, repeats=3)  # fewer requests and repeats; each request the same


def add_arguments(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add(
        "--requests",
        type=at_least(int, 1),
        help=f"concurrent requests ({FULL.requests}; quick {QUICK.requests})",
    )
    add("--max-tokens", type=at_least(int, 1), help=f"tokens generated per request ({FULL.max_tokens})")
    add("--prompt-tokens", type=at_least(int, 1), help=f"prompt tokens per request ({FULL.prompt_tokens})")
    add(
        "--size",
        choices=["tiny", "small"],
        help=f"model ({FULL.size}: compute dominates, as with real models)",
    )
    add(
        "--repeats",
        type=at_least(int, 1),
        help=f"measurements per path ({FULL.repeats}; quick {QUICK.repeats})",
    )
    add("--seed", type=at_least(int, 0), help=f"seed of the model's weights ({FULL.seed})")


def _requests(s: Settings, tag: str) -> list[Any]:
    from engine.types import GenRequest, SamplingParams

    return [
        GenRequest(
            f"{tag}-{i}",
            [(7 * i + k) % 900 + 3 for k in range(s.prompt_tokens)],
            SamplingParams(temperature=0.0, max_tokens=s.max_tokens),
            trajectory_id=f"{tag}-{i}",
        )
        for i in range(s.requests)
    ]


async def _measure(send: Send, s: Settings, tag: str) -> dict[str, float]:
    reqs = _requests(s, tag)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(send(r) for r in reqs))
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


async def take_turns(sends: tuple[Send, Send], s: Settings) -> tuple[list[dict[str, float]], ...]:
    """One warm-up of each path, then `s.repeats` measurements of each, the first path alternating.

    Returns each path's measurements in repeat order (so the k-th of both are a pair)."""
    for j, send in enumerate(sends):
        await _measure(send, s, f"warm-{j}")
    out: tuple[list[dict[str, float]], ...] = ([], [])
    for k, j in run_order(len(sends), s.repeats):
        out[j].append(await _measure(sends[j], s, f"{j}-{k}"))
    return out


def _measure_paths(s: Settings) -> tuple[list[dict[str, float]], ...]:
    """Both paths on one model: an in-process vLLM engine, and the same engine in a worker actor behind
    the LLMProxy actor, in a local Ray of 2 CPUs."""
    import ray
    import torch

    from engine.backends.vllm import VLLMBackend
    from engine.models.tiny import init_model
    from engine.rollout.gen_worker import GenerationWorker
    from engine.rollout.proxy import GenSlot, LLMProxy
    from infra.local_ray import init_local_ray

    root = Path(tempfile.mkdtemp(prefix="rollart-bench-"))
    model = str(init_model(s.size, root / "model", seed=s.seed))  # type: ignore[arg-type]
    engine_kw = {
        "max_batch": s.requests,
        "max_model_len": s.prompt_tokens + s.max_tokens + 32,
        "eos_token_ids": [],
    }
    init_local_ray(num_cpus=2, include_dashboard=False)
    try:
        config = {"backend": {"kind": "vllm", "model_dir": model, **engine_kw}, "run_id": "bench"}
        worker = (
            ray.remote(GenerationWorker)
            .options(max_concurrency=4096)
            .remote("gen-0", 0, 1, "bandwidth", "gpu-bandwidth", config)
        )
        proxy = (
            ray.remote(LLMProxy)
            .options(max_concurrency=100_000)
            .remote([GenSlot("gen-0", "gpu-bandwidth", worker, capacity=s.requests)])
        )

        async def both() -> tuple[list[dict[str, float]], ...]:
            torch.set_num_threads(
                1
            )  # as in the worker actor (Ray sets OMP_NUM_THREADS=1 there): like for like
            engine = VLLMBackend(model, **engine_kw)

            async def via_proxy(r: Any) -> Any:
                return await proxy.generate.remote(r)

            try:
                return await take_turns((engine.generate, via_proxy), s)
            finally:
                await engine.close()

        return asyncio.run(both())
    finally:
        ray.shutdown()


def summarize(
    direct: list[dict[str, float]], proxy: list[dict[str, float]], seed: int = 0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A row per path (the median over its repeats, with its bootstrap 95% interval) and the ratio
    proxy/direct paired by repeat, with its interval and the verdict against `TARGET`."""
    rows = []
    for path, ms in zip(PATHS, (direct, proxy), strict=True):
        tps, low, high = median_ci([m["tokens_per_s"] for m in ms], seed)
        seconds = statistics.median(m["seconds"] for m in ms)
        rows.append({"path": path, "runs": len(ms), "tokens": ms[0]["tokens"], "seconds": seconds,
                     "tokens_per_s": tps, "ci_low": low, "ci_high": high})  # fmt: skip
    pairs = zip(direct, proxy, strict=True)
    ratio, low, high = median_ci([p["tokens_per_s"] / d["tokens_per_s"] for d, p in pairs], seed)
    verdict = "met" if low >= TARGET else "not met" if high < TARGET else "undecided"
    return rows, {
        "ratio": ratio,
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "target": TARGET,
        "verdict": verdict,
    }


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """proxy/direct tokens/s, paired by repeat; the paper gives no figure, a free proxy would keep 1.0."""
    metric = f"tokens/s through LLMProxy / direct (target >= {payload['target']:g})"
    return [
        headline_row(metric, payload["ratio"], payload["ratio_ci_low"], payload["ratio_ci_high"], ideal=1.0)
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    direct, proxy = _measure_paths(s)
    rows, ratio = summarize(direct, proxy, s.seed)
    note = (
        "ratio proxy/direct = "
        f"{ci_text(ratio['ratio'], ratio['ratio_ci_low'], ratio['ratio_ci_high'], '.3f')} "
        f"(median of per-repeat ratios, in brackets its bootstrap 95% interval); target >= {TARGET}: "
        f"{ratio['verdict']}. {s.requests} requests x {s.max_tokens} tokens ({s.prompt_tokens}-token "
        f"prompts), model {s.size} (seed {s.seed}), {s.repeats} measurements per path, the first path "
        "alternating; tokens/s: the median over them and its bootstrap 95% interval."
    )
    table = [
        {
            "path": r["path"],
            "runs": str(r["runs"]),
            "tokens": str(r["tokens"]),
            "seconds": f"{r['seconds']:.2f}",
            "tokens/s": ci_text(r["tokens_per_s"], r["ci_low"], r["ci_high"], ".0f"),
        }
        for r in rows
    ]
    return publish(
        args,
        "generation through the LLMProxy vs straight to the engine",
        s,
        rows,
        note,
        table=table,
        clock="wall",
        seeds=[s.seed],
        **ratio,
        all={"direct": direct, "proxy": proxy},
    )
