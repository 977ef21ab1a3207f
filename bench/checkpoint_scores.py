"""Held-out scores of saved checkpoints, for `bench time-to-score`: one vLLM engine loads each in turn."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.time_to_score import Settings

SCORE_BATCH = 128  # held-out questions answered at once (the quickstart holds out ~145)


class HeldOutScorer:
    """Held-out exact success of weights directories, greedy, by one vLLM engine that loads each
    directory's weights in place as a generation worker takes a new version (fp32 greedy vLLM answers as
    HF does, token for token: tests/integration/engine/backends/test_vllm.py; ~2.5x faster here).

    The engine is built by the first `scores` call and kept until `close`, so a benchmark that scores
    after every run starts it once (~10 s each time here). Every call must run on the same event loop (the
    engine's client lives on it): e.g. one `asyncio.Runner` for all of them."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self._engine: Any = None
        self._chat: Any = None
        self._spec: Any = None
        self.versions = 0  # weights loaded so far (each load is a new engine version)
        self.started = 0  # engines built so far

    def _start(self, model_dir: str) -> None:
        import torch
        from transformers import AutoTokenizer

        from engine.actor_args import task_specs
        from engine.backends import make_backend
        from engine.config import load_config
        from engine.rollout.chat import ChatFormat

        s = self.s
        cfg = load_config(Path(s.config), [*s.overrides, f"tasks.0.eval_problems={s.eval_problems}"])
        [self._spec] = task_specs(cfg)
        torch.set_num_threads(os.cpu_count() or 1)  # before the engine: vLLM pins the count it finds
        self._engine = make_backend(
            "vllm", model_dir=model_dir, max_batch=SCORE_BATCH, max_model_len=cfg.model.max_context
        )
        self._chat = ChatFormat(AutoTokenizer.from_pretrained(model_dir))
        self.started += 1

    async def scores(self, paths: list[str]) -> dict[str, float]:
        """Each directory's held-out success, in turn."""
        import torch
        from transformers import AutoModelForCausalLM

        from engine.evaluate import evaluate

        if self._engine is None:
            self._start(paths[0])
        out = {}
        for path in paths:
            weights = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
            self.versions += 1
            self._engine.load_weights(weights.items(), self.versions)  # state_dict: a tied head is named too
            [res] = (await evaluate([self._spec], self._chat, self._engine, concurrency=SCORE_BATCH)).values()
            out[path] = float(res["success"])
            print(f"scored {Path(path).parent.name}/{Path(path).name}: {out[path]:.3f}", flush=True)
        return out

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()
            self._engine = None
