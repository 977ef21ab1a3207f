"""A generation worker with the modelled backend starts without torch: importing torch and transformers was
~5 s of every such worker's start-up here (the faults benchmark starts two per run; Ray restarts one after
each injected kill), for an engine that needs neither."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

BUILD = textwrap.dedent(
    """
    import asyncio, sys
    from engine.rollout.gen_worker import GenerationWorker
    from engine.types import GenRequest, SamplingParams

    backend = {"kind": "modelled", "model": "qwen2.5-7b", "device": "H20", "time_scale": 1e-4, "token_id": 10}
    config = {"backend": backend, "store": None, "run_id": "r", "threads": THREADS}
    worker = GenerationWorker("gen-0", 0, 1, "gen", "gpu-bandwidth", config)
    out = asyncio.run(worker.generate(GenRequest("q", [1, 2, 3], SamplingParams(max_tokens=4))))
    retired = asyncio.run(worker.retire())
    print(len(out.token_ids), retired, "torch" in sys.modules, "transformers" in sys.modules)
    """
)


def _run(threads: int | None) -> str:
    code = BUILD.replace("THREADS", repr(threads))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.split("\n")[-2]


def test_a_modelled_worker_generates_and_retires_without_importing_torch() -> None:
    assert _run(None) == "4 True False False"


def test_a_thread_count_imports_torch_to_set_it_but_not_transformers() -> None:
    assert _run(1) == "4 True True False"
