"""A generation worker's process rebuilt for another run (`retire` + `reinit`, engine/core/warm.py)
serves that run's initial weights at version 0, as a new process would."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.models.tiny import init_model
from engine.rollout.gen_worker import GenerationWorker
from engine.types import GenRequest, SamplingParams


def _greedy(worker: GenerationWorker) -> list[int]:
    request = GenRequest("r0", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=12))
    return asyncio.run(worker.generate(request)).token_ids


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_a_retired_worker_rebuilt_serves_the_new_runs_initial_weights(tmp_path: Path, kind: str) -> None:
    """On a CPU, vLLM's engine as well: it runs in the worker's process, closed and built again."""
    model_dir = str(init_model("tiny", tmp_path / "tiny"))
    config = {"backend": {"kind": kind, "model_dir": model_dir}, "run_id": "b"}
    fresh = GenerationWorker("gen-0", 0, 1, "gen", "gpu-bandwidth", config)
    want = _greedy(fresh)
    asyncio.run(fresh.backend.close())

    used = GenerationWorker("gen-0", 0, 1, "gen", "gpu-bandwidth", {**config, "run_id": "a"})
    params = AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()
    torch.manual_seed(1)
    used.load_weights({k: torch.randn_like(p) for k, p in params}, 3)  # the last run's version 3
    assert used.version() == 3 and _greedy(used) != want

    assert asyncio.run(used.retire()) is True
    threads = torch.get_num_threads()
    try:  # the new run's thread count holds (vLLM's CPU worker makes torch.set_num_threads a no-op)
        used.reinit("gen-0", 0, 1, "gen", "gpu-bandwidth", {**config, "threads": threads + 1})
        assert torch.get_num_threads() == threads + 1
    finally:
        torch._C.set_num_threads(threads)
    assert used.version() == 0 and _greedy(used) == want


def test_a_vllm_worker_on_a_gpu_is_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether closing vLLM's engine gives a GPU's memory back is untested: on a GPU such a worker declines
    to retire (the Cluster kills it), before touching its engine; on a CPU the same worker retires."""
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
    with monkeypatch.context() as gpu:
        gpu.setattr(torch.cuda, "is_available", lambda: True)
        assert asyncio.run(worker.retire()) is False
    assert worker.backend is not None  # left as it was
    assert asyncio.run(worker.retire()) is True
