"""Torch's intra-op thread count, set so that it holds in a process that built a vLLM engine.

Its own module (not `engine/backends/vllm.py`) so that a worker that only sets threads does not import
vLLM's backend and, through it, transformers.
"""

from __future__ import annotations

import torch


def set_threads(n: int) -> None:
    """Set torch's intra-op thread count, also in a process that built a vLLM engine: vLLM's CPU worker
    replaces `torch.set_num_threads` with a no-op that only warns, so this calls torch's own function."""
    torch._C.set_num_threads(n)
