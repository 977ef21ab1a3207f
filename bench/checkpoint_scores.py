"""Held-out scores of saved checkpoints, for `bench time-to-score`: one vLLM engine loads each in turn."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.time_to_score import Settings

SCORE_BATCH = 128  # held-out questions answered at once (the quickstart holds out ~145)


async def held_out_scores(paths: list[str], s: Settings) -> dict[str, float]:
    """Held-out exact success of each weights directory, greedy, by one vLLM engine that loads each
    directory's weights in place as a generation worker takes a new version (fp32 greedy vLLM answers as
    HF does, token for token: tests/integration/engine/backends/test_vllm.py; ~2.5x faster here)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.actor_args import task_specs
    from engine.backends import make_backend
    from engine.config import load_config
    from engine.evaluate import evaluate
    from engine.rollout.chat import ChatFormat

    cfg = load_config(Path(s.config), [*s.overrides, f"tasks.0.eval_problems={s.eval_problems}"])
    [spec] = task_specs(cfg)
    torch.set_num_threads(os.cpu_count() or 1)  # before the engine: vLLM pins the count it finds
    engine = make_backend(
        "vllm", model_dir=paths[0], max_batch=SCORE_BATCH, max_model_len=cfg.model.max_context
    )
    chat = ChatFormat(AutoTokenizer.from_pretrained(paths[0]))
    out = {}
    try:
        for version, path in enumerate(paths, start=1):
            weights = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
            engine.load_weights(weights.items(), version)  # state_dict: a tied head is named too
            [res] = (await evaluate([spec], chat, engine, concurrency=SCORE_BATCH)).values()
            out[path] = float(res["success"])
            print(f"scored {Path(path).parent.name}/{Path(path).name}: {out[path]:.3f}", flush=True)
    finally:
        await engine.close()
    return out
