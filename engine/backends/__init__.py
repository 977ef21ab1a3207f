"""Generation backends behind `base.GenerationBackend`: vLLM, Hugging Face, and a modelled roofline one."""

from __future__ import annotations

from typing import Any

from engine.backends.base import GenerationBackend

KINDS = ("vllm", "hf", "modelled")


def make_backend(kind: str, **kwargs: Any) -> GenerationBackend:
    """Build a backend by name; heavy engines are imported only when chosen."""
    if kind == "vllm":
        from engine.backends.vllm import VLLMBackend

        return VLLMBackend(kwargs.pop("model_dir"), **kwargs)
    if kind == "hf":
        from engine.backends.hf import HFBackend

        return HFBackend(kwargs.pop("model_dir"), **kwargs)
    if kind == "modelled":
        from engine.backends.modelled import ModelledBackend
        from engine.devices import get_device, get_model

        model, device = get_model(kwargs.pop("model")), get_device(kwargs.pop("device"))
        return ModelledBackend(model, device, **kwargs)
    raise ValueError(f"unknown generation backend {kind!r}; known: {', '.join(KINDS)}")
