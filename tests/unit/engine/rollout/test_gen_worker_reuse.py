"""A generation worker's process rebuilt for another run (`retire` + `reinit`, engine/core/warm.py)
serves that run's initial weights at version 0, as a new process would."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from engine.models.tiny import init_model
from engine.rollout.gen_worker import GenerationWorker
from engine.types import GenRequest, SamplingParams


def _greedy(worker: GenerationWorker) -> list[int]:
    request = GenRequest("r0", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=12))
    return asyncio.run(worker.generate(request)).token_ids


def test_a_retired_worker_rebuilt_serves_the_new_runs_initial_weights(tmp_path: Path) -> None:
    model_dir = str(init_model("tiny", tmp_path / "tiny"))
    config = {"backend": {"kind": "hf", "model_dir": model_dir}, "run_id": "b"}
    want = _greedy(GenerationWorker("gen-0", 0, 1, "gen", "gpu-bandwidth", config))

    used = GenerationWorker("gen-0", 0, 1, "gen", "gpu-bandwidth", {**config, "run_id": "a"})
    params = dict(used.backend.model.named_parameters())
    torch.manual_seed(1)
    used.load_weights({k: torch.randn_like(p) for k, p in params.items()}, 3)  # the last run's version 3
    assert used.version() == 3 and _greedy(used) != want

    assert asyncio.run(used.retire()) is True
    used.reinit("gen-0", 0, 1, "gen", "gpu-bandwidth", config)
    assert used.version() == 0 and _greedy(used) == want


def test_a_worker_on_an_engine_with_processes_of_its_own_is_not_reused(tmp_path: Path) -> None:
    """vLLM's engine owns processes and memory: such a worker declines to retire (the Cluster kills it),
    before touching its engine."""
    model_dir = str(init_model("tiny", tmp_path / "tiny"))
    worker = GenerationWorker(
        "gen-0",
        0,
        1,
        "gen",
        "gpu-bandwidth",
        {"backend": {"kind": "hf", "model_dir": model_dir}, "run_id": "a"},
    )
    worker.config = {**worker.config, "backend": {"kind": "vllm", "model_dir": model_dir}}
    assert asyncio.run(worker.retire()) is False
    assert worker.backend is not None  # left as it was
