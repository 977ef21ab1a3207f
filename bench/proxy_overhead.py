"""`rollart bench proxy-overhead`: what the LLMProxy + Ray worker path costs in generation throughput.

The same requests (greedy, fixed length: eos off, so both paths generate exactly the same tokens) go
(a) straight to an in-process vLLM engine and (b) through the LLMProxy actor to a GenerationWorker actor
running the same engine. Reported: generated tokens/s of each and the ratio proxy/direct (target ≥ 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import print_table, write_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=256, help="concurrent requests per measurement")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument(
        "--size",
        choices=["tiny", "small"],
        default="small",
        help="small: compute dominates, as with real models",
    )
    p.add_argument("--repeats", type=int, default=5, help="interleaved measurements per path (median kept)")


def _requests(n: int, prompt_tokens: int, max_tokens: int, tag: str) -> list[Any]:
    from engine.types import GenRequest, SamplingParams

    return [
        GenRequest(
            f"{tag}-{i}",
            [(7 * i + k) % 900 + 3 for k in range(prompt_tokens)],
            SamplingParams(temperature=0.0, max_tokens=max_tokens),
            trajectory_id=f"{tag}-{i}",
        )
        for i in range(n)
    ]


async def _measure(send: Any, n: int, prompt_tokens: int, max_tokens: int, tag: str) -> dict[str, float]:
    reqs = _requests(n, prompt_tokens, max_tokens, tag)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(send(r) for r in reqs))
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return sorted(rows, key=lambda r: r["tokens_per_s"])[len(rows) // 2]


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        args.requests, args.max_tokens, args.repeats = min(args.requests, 128), min(args.max_tokens, 32), 3
    import ray
    import torch

    from engine.backends.vllm import VLLMBackend
    from engine.models.tiny import init_model
    from engine.rollout.gen_worker import GenerationWorker
    from engine.rollout.proxy import GenSlot, LLMProxy
    from infra.local_ray import init_local_ray

    model = str(init_model(args.size, Path(tempfile.mkdtemp(prefix="rollart-bench-")) / "model"))
    engine_kw = {
        "max_batch": args.requests,
        "max_model_len": args.prompt_tokens + args.max_tokens + 32,
        "eos_token_ids": [],
    }
    shape = (args.requests, args.prompt_tokens, args.max_tokens)

    init_local_ray(num_cpus=2, include_dashboard=False)
    try:
        worker = (
            ray.remote(GenerationWorker)
            .options(max_concurrency=4096)
            .remote(
                "gen-0",
                0,
                1,
                "bandwidth",
                "gpu-bandwidth",
                {"backend": {"kind": "vllm", "model_dir": model, **engine_kw}, "run_id": "bench"},
            )
        )
        proxy = (
            ray.remote(LLMProxy)
            .options(max_concurrency=100_000)
            .remote([GenSlot("gen-0", "gpu-bandwidth", worker, capacity=args.requests)])
        )

        async def both() -> tuple[list[dict[str, float]], list[dict[str, float]]]:
            torch.set_num_threads(
                1
            )  # as in the worker actor (Ray sets OMP_NUM_THREADS=1 there): like for like
            engine = VLLMBackend(model, **engine_kw)

            async def via_proxy(r: Any) -> Any:
                return await proxy.generate.remote(r)

            await _measure(engine.generate, *shape, "warm-d")
            await _measure(via_proxy, *shape, "warm-p")
            d, p = [], []
            for i in range(args.repeats):  # interleaved, so load from elsewhere hits both paths alike
                d.append(await _measure(engine.generate, *shape, f"d{i}"))
                p.append(await _measure(via_proxy, *shape, f"p{i}"))
            await engine.close()
            return d, p

        direct_rows, proxy_rows = asyncio.run(both())
    finally:
        ray.shutdown()
    best_d = _median(direct_rows)
    best_p = _median(proxy_rows)
    rows = [{"path": "direct engine", **best_d}, {"path": "LLMProxy + worker actor", **best_p}]
    ratio = best_p["tokens_per_s"] / best_d["tokens_per_s"]
    print_table(
        "generation through the LLMProxy vs straight to the engine",
        rows,
        note=f"ratio proxy/direct = {ratio:.3f} (target >= 0.9); {args.requests} requests x "
        f"{args.max_tokens} tokens, model {args.size}, median of {args.repeats} interleaved runs",
    )
    payload = {
        "rows": rows,
        "ratio": ratio,
        "all": {"direct": direct_rows, "proxy": proxy_rows},
        "config": {
            k: getattr(args, k) for k in ("requests", "max_tokens", "prompt_tokens", "size", "repeats")
        },
    }
    write_json(args.json, payload)
    return payload
