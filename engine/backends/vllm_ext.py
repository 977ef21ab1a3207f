"""vLLM worker extension: in-place weight updates for the `VLLMBackend`.

vLLM mixes this class into its worker (`worker_extension_cls=`), so its methods run inside the worker with
the model at hand and are reached through `collective_rpc`. Tensors use Hugging Face parameter names, as
the trainer has them; vLLM's own `load_weights` maps them onto its fused layers.
"""

from __future__ import annotations

import torch

EXTENSION = f"{__name__}.WeightUpdateExtension"


class WeightUpdateExtension:
    """Methods added to the vLLM worker (`self` is the worker: it has `model_runner`, `reload_weights`)."""

    def rollart_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Load `named_tensors` in place; return how many tensors were applied.

        With tied embeddings the trainer sends `model.embed_tokens.weight` only, but vLLM's layer-wise
        reload expects the tied `lm_head.weight` as well, so it is added from the embedding.
        """
        config = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
        tensors = dict(named_tensors)
        if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in tensors:
            tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"])
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        return len(tensors)
