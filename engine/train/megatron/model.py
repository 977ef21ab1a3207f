"""`MegatronLM`: a Megatron-core `GPTModel` that speaks Hugging Face at its edges.

Inside, the model is Megatron's (local layer spec: Megatron's own parallel linear layers, attention and
RMSNorm; tensor and pipeline size 1 for now). At the edges it behaves as the HF causal LM it was loaded
from, so the GRPO loop (`engine.train.trainer.TorchTrainer`), checkpoints and weight publishing work
unchanged and generation workers keep loading HF names:
- it is built from an HF model directory (weights converted by `engine.train.megatron.convert`);
- `model(input_ids=..., attention_mask=...)` returns an output with `.logits` (batch, time, vocab);
- `state_dict()` / `load_state_dict()` use HF names and layout (what is published, hashed and saved);
  `load_state_dict` copies into the existing parameters, so an optimiser over them keeps working;
- `save_pretrained()` writes an HF model directory; `generate()` is greedy decoding (for checks).

Batches are right-padded (engine.train.batch): a causal mask and positions 0..T-1 give every real token
exactly the attention and position it has in the HF model.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import AutoModelForCausalLM
from transformers.modeling_outputs import CausalLMOutput

from engine.train.megatron import cpu_shims
from engine.train.megatron.convert import Arch, hf_keys, to_hf, to_megatron


def init_parallel() -> None:
    """A one-rank process group and Megatron's parallel state (tensor and pipeline size 1); idempotent."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        with socket.socket() as s:  # a rendezvous for one rank, on loopback only
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def transformer_config(a: Arch, dtype: torch.dtype) -> Any:
    """Megatron's `TransformerConfig` for the architecture: no dropout, no fused kernels (CPU-safe)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=a.layers,
        hidden_size=a.hidden,
        num_attention_heads=a.heads,
        num_query_groups=a.groups,
        kv_channels=a.head_dim,
        ffn_hidden_size=a.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=a.eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=a.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        use_cpu_initialization=True,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


class MegatronLM(torch.nn.Module):
    param_layout = "megatron"  # the optimiser's state follows these parameters (checkpoints record it)

    def __init__(self, model_dir: str | Path, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        cpu_shims.install()
        init_parallel()
        hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        self.config = hf.config
        self.generation_config = hf.generation_config
        self.arch = Arch.of(self.config)
        self.gpt = GPTModel(
            transformer_config(self.arch, dtype),
            get_gpt_layer_local_spec(),
            vocab_size=self.arch.vocab,
            max_sequence_length=self.arch.max_positions,
            position_embedding_type="rope",
            rotary_base=self.arch.rope_theta,
            share_embeddings_and_output_weights=self.arch.tied,
        )
        self.load_state_dict(hf.state_dict())

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> CausalLMOutput:
        """Logits `(B, T, V)` of right-padded `input_ids` (padding is only ever attended to by padding)."""
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device).expand_as(input_ids)
        masked = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).triu(1)[None, None]
        return CausalLMOutput(logits=self.gpt(input_ids, positions, attention_mask=masked))

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:  # type: ignore[override]
        """The weights in HF names and layout (the tensors share storage with the parameters where the
        layouts agree; fused ones are copies)."""
        if args or kwargs:
            raise TypeError("MegatronLM.state_dict() takes no arguments: it returns the HF state dict")
        own = {k: v for k, v in self.gpt.state_dict().items() if not k.endswith("_extra_state")}
        return to_hf(own, self.arch)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Copy an HF state dict (as `state_dict()` gives) into the parameters; exact keys required."""
        expected = hf_keys(self.arch)
        if set(state_dict) != expected:
            missing, extra = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
            raise KeyError(f"HF state dict does not fit: missing {missing[:5]}, unexpected {extra[:5]}")
        result = self.gpt.load_state_dict(to_megatron(state_dict, self.arch), strict=False)
        left = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if left or result.unexpected_keys:
            raise KeyError(f"Megatron keys not set: {left}, unexpected: {result.unexpected_keys}")
        return torch.nn.modules.module._IncompatibleKeys([], [])

    def save_pretrained(self, path: str | Path) -> None:
        """Write an HF model directory (config, safetensors) holding these weights."""
        dtype = next(self.gpt.parameters()).dtype
        hf = AutoModelForCausalLM.from_config(self.config, dtype=dtype)
        hf.load_state_dict(self.state_dict())
        hf.generation_config = self.generation_config
        hf.save_pretrained(path)

    def get_output_embeddings(self) -> None:
        """None: the trainer scores tokens from the full logits (`forward`), not from a separate head."""
        return None

    def get_decoder(self) -> None:
        return None

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_new_tokens: int = 16,
        do_sample: bool = False,
    ) -> Tensor:
        """Greedy decoding of one unpadded batch (a full forward per token: for checks, not for speed)."""
        if do_sample:
            raise ValueError("MegatronLM.generate is greedy only (do_sample=False)")
        ids = input_ids
        eos = self.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos]) - {None}
        for _ in range(max_new_tokens):
            nxt = self(ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if ids.shape[0] == 1 and int(nxt) in stops:
                break
        return ids
