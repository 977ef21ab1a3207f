"""CUDA-only calls in megatron-core 0.16, replaced so a `GPTModel` runs and trains on a CPU (tests, laptops).

Installed only where CUDA is absent, by `install()`; on a GPU nothing here is touched.

1. `torch.cuda.current_device()` is where megatron-core puts tensors it creates during a forward pass (the
   rotary embedding moves its inverse frequencies there on the first call; the global memory buffer
   allocates there; the pipeline's receive buffers are made there). Without CUDA it raises; here it answers
   "cpu", which every such `.to(device=...)` / `torch.empty(device=...)` call accepts.
2. The RNG tracker's `fork()` switches to a CUDA generator registered by `model_parallel_cuda_manual_seed`
   (so tensor-parallel ranks draw dropout masks from agreed streams); that seed call needs CUDA. There is
   no dropout here (engine.train.megatron.model.transformer_config) and so nothing to agree on: `fork()`
   keeps torch's default generator.
3. `torch.cuda.synchronize()` is called by the pipeline's point-to-point exchange after its sends and
   receives (the shape exchange of variable-length micro-batches, batched sends), to wait for CUDA
   streams. A gloo send or receive is complete once its request is waited on, which megatron-core does
   first: there is nothing left to wait for, and the shim returns.
4. The pipeline schedules (`megatron.core.pipeline_parallel.schedules`) create their token counter with a
   literal `device="cuda"`, not through `current_device()`. `schedule_context()` is entered around a
   schedule call: a torch function mode that turns a factory call's `device="cuda"` into the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import megatron.core.tensor_parallel.random as mp_random
import torch
from torch.overrides import TorchFunctionMode


class CpuRngTracker(mp_random.CudaRNGStatesTracker):
    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        yield


class CudaFactoriesOnCpu(TorchFunctionMode):
    """Shim 4: a torch call asked for `device="cuda"` runs on the CPU instead."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _cpu_device() -> str:
    return "cpu"


def _no_streams(device: Any = None) -> None:
    return None


def install() -> bool:
    """Install shims 1-3 unless CUDA is available; True if installed (idempotent)."""
    if torch.cuda.is_available():
        return False
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]  # shim 1
    if not isinstance(mp_random._CUDA_RNG_STATE_TRACKER, CpuRngTracker):  # shim 2
        mp_random._CUDA_RNG_STATE_TRACKER = CpuRngTracker()
        mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.cuda.synchronize = _no_streams  # shim 3
    return True


def schedule_context() -> contextlib.AbstractContextManager[Any]:
    """What a megatron-core schedule call runs inside: shim 4 without CUDA, nothing with it."""
    return contextlib.nullcontext() if torch.cuda.is_available() else CudaFactoriesOnCpu()
