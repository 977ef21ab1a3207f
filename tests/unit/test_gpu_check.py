"""scripts/gpu-check: its prelude, runnable without a GPU (the GPU checks run on an accelerator machine)."""

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, nvidia_smi: str) -> subprocess.CompletedProcess:
    """The script with a stand-in `nvidia-smi` first on PATH (it shadows a real one)."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    return subprocess.run(
        [str(ROOT / "scripts" / "gpu-check")], env=env, capture_output=True, text=True, timeout=120
    )


def test_without_a_gpu_it_says_so_in_one_json_line_and_exits_0(tmp_path: Path) -> None:
    done = _run(tmp_path, "exit 9")
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert json.loads(line) == {
        "check": "gpu",
        "ok": False,
        "detail": "no GPU visible (nvidia-smi -L found none): nothing to check on this machine",
    }


def test_a_gpu_with_a_torch_that_cannot_see_it_fails_the_cuda_check_and_stops(tmp_path: Path) -> None:
    done = _run(tmp_path, "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'")  # this machine's torch has no CUDA
    assert done.returncode == 1
    gpu, cuda = (json.loads(line) for line in done.stdout.splitlines())
    assert gpu == {"check": "gpu", "ok": True, "detail": "GPU 0: NVIDIA H200 (UUID: GPU-0)"}
    assert cuda["check"] == "cuda" and cuda["ok"] is False and '"available": false' in cuda["detail"]
