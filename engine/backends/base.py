"""The generation backend interface: what a generation worker needs from an inference engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

from engine.types import GenOutput, GenRequest

if TYPE_CHECKING:  # a modelled backend's worker never imports torch (~1 s of its start-up)
    import torch


class GenerationBackend(ABC):
    """Serves many concurrent `generate` calls with continuous batching.

    Every output carries the policy version of the weights that produced it. `load_weights` swaps
    weights in place (between engine steps) and sets the new version.
    """

    version: int = 0

    @abstractmethod
    async def generate(self, request: GenRequest) -> GenOutput: ...

    @abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...

    async def abort(self, request_id: str) -> None:  # noqa: B027 - optional for backends
        """Stop a running request early; its `generate` returns finish_reason="abort"."""

    async def close(self) -> None:  # noqa: B027 - optional for backends
        """Release engine resources."""
