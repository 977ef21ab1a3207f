"""`MegatronLM`: a Megatron-core `GPTModel` that speaks Hugging Face at its edges.

Inside, the model is Megatron's (local layer spec: Megatron's own parallel linear layers, attention and
RMSNorm; pipeline size 1). With `tp > 1` it is one rank of a tensor-parallel group: every rank runs this
class in its own process on the same batch, holds its slices of the weights (`sharding.py`) and gets the
full logits (gathered). At the edges it behaves as the HF causal LM it was loaded from, so the GRPO loop
(`engine.train.trainer.TorchTrainer`), checkpoints and weight publishing work unchanged and generation
workers keep loading HF names:
- it is built from an HF model directory (weights converted by `engine.train.megatron.convert`);
- `model(input_ids=..., attention_mask=...)` returns an output with `.logits` (batch, time, vocab);
- `state_dict()` / `load_state_dict()` use HF names and layout, whole (what is published, hashed and
  saved); `load_state_dict` copies into the existing parameters, so an optimiser over them keeps working;
- `clip_grad_norm_` clips by the whole model's gradient norm; `optimizer_state` / `load_optimizer_state`
  give and take AdamW's state whole, so a checkpoint does not depend on the tensor-parallel size;
- `to_hf_model()` / `save_pretrained()` give an HF model holding these weights; `generate()` is greedy
  decoding (for checks).
With `tp > 1`, `state_dict`, `clip_grad_norm_`, `optimizer_state` and `to_hf_model` are collectives: every
rank calls them, in the same order.

Batches are right-padded (engine.train.batch): a causal mask and positions 0..T-1 give every real token
exactly the attention and position it has in the HF model.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import AutoModelForCausalLM
from transformers.modeling_outputs import CausalLMOutput

from engine.train.megatron import cpu_shims, sharding
from engine.train.megatron.convert import Arch, hf_keys, to_hf, to_megatron

GROUP_TIMEOUT = timedelta(minutes=5)  # a rank that died leaves the others' collectives waiting this long


def init_parallel(tp: int = 1, rank: int = 0, address: str | None = None) -> None:
    """This process as rank `rank` of a `tp`-rank process group (rendezvous at `address`, tcp://host:port;
    one rank needs none: it binds a loopback port) and Megatron's parallel state (tensor size `tp`,
    pipeline size 1); idempotent. NCCL where CUDA is available, gloo on a CPU."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        if address is None:
            if tp > 1:
                raise ValueError(f"tensor_parallel {tp}: the ranks need a rendezvous address")
            with socket.socket() as s:  # a rendezvous for one rank, on loopback only
                s.bind(("127.0.0.1", 0))
                address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=tp, timeout=GROUP_TIMEOUT)
    if dist.get_world_size() != tp:
        raise RuntimeError(
            f"a process group of {dist.get_world_size()} ranks exists; tensor_parallel is {tp}"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tp, 1)


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

    def __init__(
        self,
        model_dir: str | Path,
        dtype: torch.dtype = torch.float32,
        tp: int = 1,
        rank: int = 0,
        address: str | None = None,
    ) -> None:
        super().__init__()
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        cpu_shims.install()
        init_parallel(tp, rank, address)
        self.tp, self.rank = tp, rank
        hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        self.config = hf.config
        self.generation_config = hf.generation_config
        self.arch = Arch.of(self.config)
        if self.arch.heads % tp or self.arch.groups % tp:
            raise ValueError(
                f"tensor_parallel {tp} must divide the attention heads ({self.arch.heads}) and the "
                f"key/value heads ({self.arch.groups})"
            )
        self.gpt = GPTModel(
            transformer_config(self.arch, dtype),
            get_gpt_layer_local_spec(),
            vocab_size=self.arch.vocab,
            max_sequence_length=self.arch.max_positions,
            position_embedding_type="rope",
            rotary_base=self.arch.rope_theta,
            share_embeddings_and_output_weights=self.arch.tied,
            parallel_output=False,  # every rank gets the whole vocabulary's logits (gathered)
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
        return to_hf(sharding.gather(own, self.tp), self.arch)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Copy an HF state dict (as `state_dict()` gives) into the parameters; exact keys required."""
        expected = hf_keys(self.arch)
        if set(state_dict) != expected:
            missing, extra = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
            raise KeyError(f"HF state dict does not fit: missing {missing[:5]}, unexpected {extra[:5]}")
        own = sharding.shard(to_megatron(state_dict, self.arch), self.rank, self.tp)
        result = self.gpt.load_state_dict(own, strict=False)
        left = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if left or result.unexpected_keys:
            raise KeyError(f"Megatron keys not set: {left}, unexpected: {result.unexpected_keys}")
        return torch.nn.modules.module._IncompatibleKeys([], [])

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Scale the gradients so their whole-model norm is at most `max_norm` (as
        `torch.nn.utils.clip_grad_norm_`, whose coefficient this uses); returns the norm before."""
        norm = sharding.grad_norm(self.gpt.named_parameters(), self.tp)
        coefficient = min(1.0, max_norm / (norm + 1e-6))
        if coefficient < 1.0:
            for p in self.gpt.parameters():
                if p.grad is not None:
                    p.grad.mul_(coefficient)
        return torch.tensor(norm)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """`optimizer.state_dict()` with every per-parameter tensor whole (the tensor-parallel slices
        gathered), so it loads at any tensor-parallel size."""
        state = optimizer.state_dict()
        return {
            **state,
            "state": self._per_param(state["state"], lambda named: sharding.gather(named, self.tp)),
        }

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a state `optimizer_state` gave (at any tensor-parallel size): this rank takes its slices."""
        own = self._per_param(state["state"], lambda named: sharding.shard(named, self.rank, self.tp))
        optimizer.load_state_dict({**state, "state": own})

    def _per_param(self, state: dict[int, dict[str, Any]], fn: Any) -> dict[int, dict[str, Any]]:
        """Apply `fn` (named tensors → named tensors) to each kind of per-parameter tensor of an optimiser
        state keyed by parameter index (the order of `parameters()`); scalars such as `step` pass as they
        are. Every rank visits the parameters in the same order."""
        names = [name for name, _ in self.gpt.named_parameters()]
        kinds = sorted({k for s in state.values() for k, v in s.items() if torch.is_tensor(v) and v.dim()})
        out = {i: dict(s) for i, s in state.items()}
        for kind in kinds:
            done = fn({names[i]: s[kind] for i, s in state.items() if kind in s})
            for i in out:
                if kind in out[i]:
                    out[i][kind] = done[names[i]]
        return out

    def to_hf_model(self) -> Any:
        """An HF causal LM (a copy) holding these weights, whole."""
        dtype = next(self.gpt.parameters()).dtype
        hf = AutoModelForCausalLM.from_config(self.config, dtype=dtype)
        hf.load_state_dict(self.state_dict())
        hf.generation_config = self.generation_config
        return hf

    def save_pretrained(self, path: str | Path) -> None:
        """Write an HF model directory (config, safetensors) holding these weights."""
        self.to_hf_model().save_pretrained(path)

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
