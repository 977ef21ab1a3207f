"""The driver (`rollart train`, a notebook) names the actor classes but runs no model: importing the flow
must not import torch, the model code or the environments' heavy dependencies. Each of those costs a
`rollart train` seconds before its first step (torch and transformers' model classes about 6 s on 2 cores);
the actors import them in their own processes. The Kubernetes client is imported only where
`backends.sandbox: kubernetes` builds its sandbox."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "vllm", "megatron", "reasoning_gym", "matplotlib", "transformers.models.auto", "kubernetes")


def test_importing_the_train_flow_imports_no_torch_and_no_model_code() -> None:
    code = f"import sys, flows.train; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
