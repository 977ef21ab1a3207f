"""Two CUDA-only calls in megatron-core 0.16, replaced so a `GPTModel` runs on a CPU (tests, laptops).

Installed only where CUDA is absent, by `install()`; on a GPU nothing here is touched.

1. `torch.cuda.current_device()` is where megatron-core puts tensors it creates during a forward pass (the
   rotary embedding moves its inverse frequencies there on the first call; the global memory buffer
   allocates there). Without CUDA it raises; here it answers "cpu", which every such `.to(device=...)` /
   `torch.empty(device=...)` call accepts.
2. The RNG tracker's `fork()` switches to a CUDA generator registered by `model_parallel_cuda_manual_seed`
   (so tensor-parallel ranks draw dropout masks from agreed streams); that seed call needs CUDA. With one
   rank on a CPU there is nothing to agree on: `fork()` keeps torch's default generator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import megatron.core.tensor_parallel.random as mp_random
import torch


class CpuRngTracker(mp_random.CudaRNGStatesTracker):
    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        yield


def _cpu_device() -> str:
    return "cpu"


def install() -> bool:
    """Install both shims unless CUDA is available; True if installed (idempotent)."""
    if torch.cuda.is_available():
        return False
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]  # shim 1
    if not isinstance(mp_random._CUDA_RNG_STATE_TRACKER, CpuRngTracker):  # shim 2
        mp_random._CUDA_RNG_STATE_TRACKER = CpuRngTracker()
        mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    return True
