"""`MegatronLM`: a Megatron-core `GPTModel` that speaks Hugging Face at its edges.

Inside, the model is Megatron's (local layer spec: Megatron's own parallel linear layers, attention and
RMSNorm). With `tp × pp > 1` it is one rank of a model-parallel group: every rank runs this class in its
own process on the same batch and holds its tensor-parallel slices (`sharding.py`) of its pipeline
stage's layers (`pipeline.py`). At the edges it behaves as the HF causal LM it was loaded from, so the GRPO
loop (`engine.train.trainer.TorchTrainer`), checkpoints and weight publishing work unchanged and
generation workers keep loading HF names:
- it is built from an HF model directory (weights converted by `engine.train.megatron.convert`);
- `run_micro_batches(inputs, on_logits, backward)` runs a step's micro-batches through megatron-core's
  schedule, the loss a function of the logits (`on_logits`, on the last stage; its results reach every
  rank): what the trainer trains with, at any pipeline size;
- `model(input_ids=..., attention_mask=...)` returns an output with `.logits` (batch, time, vocab), the
  whole vocabulary's (gathered); with `pp > 1` a forward-only pass whose logits come from the last stage;
- `state_dict()` / `load_state_dict()` use HF names and layout, whole (what is published, hashed and
  saved); `load_state_dict` copies into the existing parameters, so an optimiser over them keeps working;
- `clip_grad_norm_` clips by the whole model's gradient norm; `optimizer_state` / `load_optimizer_state`
  give and take AdamW's state whole, in the one-process parameter order, so a checkpoint depends on
  neither the tensor- nor the pipeline-parallel size;
- `to_hf_model()` / `save_pretrained()` give an HF model holding these weights; `generate()` is greedy
  decoding (for checks).
With more than one rank, everything above but the constructor's loading is a collective: every rank calls
it, in the same order.

Batches are right-padded (engine.train.batch): a causal mask and positions 0..T-1 give every real token
exactly the attention and position it has in the HF model.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import AutoModelForCausalLM
from transformers.modeling_outputs import CausalLMOutput

from engine.train.megatron import cpu_shims, pipeline, sharding
from engine.train.megatron.convert import Arch, hf_keys, to_hf, to_megatron
from engine.train.megatron.pipeline import OnLogits, Stage

GROUP_TIMEOUT = timedelta(minutes=5)  # a rank that died leaves the others' collectives waiting this long


def init_parallel(tp: int = 1, pp: int = 1, rank: int = 0, address: str | None = None) -> None:
    """This process as rank `rank` of a `tp × pp`-rank process group (rendezvous at `address`,
    tcp://host:port; one rank needs none: it binds a loopback port) and Megatron's parallel state (tensor
    size `tp`, pipeline size `pp`, tensor-parallel rank fastest); idempotent. NCCL where CUDA is available,
    gloo on a CPU."""
    from megatron.core import parallel_state

    world = tp * pp
    if not dist.is_initialized():
        if address is None:
            if world > 1:
                raise ValueError(
                    f"tensor_parallel {tp} × pipeline_parallel {pp}: the ranks need a rendezvous address"
                )
            with socket.socket() as s:  # a rendezvous for one rank, on loopback only
                s.bind(("127.0.0.1", 0))
                address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(
            backend, init_method=address, rank=rank, world_size=world, timeout=GROUP_TIMEOUT
        )
    if dist.get_world_size() != world:
        raise RuntimeError(
            f"a process group of {dist.get_world_size()} ranks exists; tensor_parallel {tp} × "
            f"pipeline_parallel {pp} needs {world}"
        )
    if not parallel_state.model_parallel_is_initialized():
        # the order `pipeline.Stage` relies on: global rank = stage · tp + tensor-parallel rank
        parallel_state.initialize_model_parallel(tp, pp, order="tp-cp-ep-dp-pp")


def transformer_config(a: Arch, dtype: torch.dtype, pp: int = 1) -> Any:
    """Megatron's `TransformerConfig` for the architecture: no dropout, no fused kernels (CPU-safe), `pp`
    pipeline stages exchanging activations of each micro-batch's own shape."""
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
        pipeline_model_parallel_size=pp,
        pipeline_dtype=dtype,
        variable_seq_lengths=True,  # micro-batches are cut to their longest row (engine.train.trainer)
        moe_token_dispatcher_type="alltoall",  # the default one refuses variable_seq_lengths, even dense
        calculate_per_token_loss=True,  # the loss is backpropagated as `on_logits` gives it (pipeline.run)
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
        pp: int = 1,
    ) -> None:
        super().__init__()
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        cpu_shims.install()
        hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        self.config = hf.config
        self.generation_config = hf.generation_config
        self.arch = Arch.of(self.config)
        if self.arch.heads % tp or self.arch.groups % tp:
            raise ValueError(
                f"tensor_parallel {tp} must divide the attention heads ({self.arch.heads}) and the "
                f"key/value heads ({self.arch.groups})"
            )
        self.stage = Stage.of(self.arch, pp, rank // tp)  # refused before any rank waits for the others
        init_parallel(tp, pp, rank, address)
        self.tp, self.pp, self.rank, self.tp_rank = tp, pp, rank, rank % tp
        self.gpt = GPTModel(
            transformer_config(self.arch, dtype, pp),
            get_gpt_layer_local_spec(),
            vocab_size=self.arch.vocab,
            max_sequence_length=self.arch.max_positions,
            position_embedding_type="rope",
            rotary_base=self.arch.rope_theta,
            pre_process=self.stage.first,
            post_process=self.stage.last,
            share_embeddings_and_output_weights=self.arch.tied and pp == 1,  # across stages: pipeline.py
            parallel_output=False,  # every rank gets the whole vocabulary's logits (gathered)
        )
        self.load_state_dict(hf.state_dict())

    @property
    def _tp_group(self) -> dist.ProcessGroup:
        from megatron.core import parallel_state

        return parallel_state.get_tensor_model_parallel_group()

    @property
    def _pp_group(self) -> dist.ProcessGroup:
        from megatron.core import parallel_state

        return parallel_state.get_pipeline_model_parallel_group()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> CausalLMOutput:
        """Logits `(B, T, V)` of right-padded `input_ids` (padding is only ever attended to by padding).
        With `pp > 1`: no gradient, and the logits travel from the last stage to every rank (for checks)."""
        if self.pp == 1:
            return CausalLMOutput(logits=self.gpt(input_ids, *pipeline.causal_inputs(input_ids)))
        [logits] = self.run_micro_batches([input_ids], lambda k, logits: (None, logits.detach().cpu()))
        return CausalLMOutput(logits=logits.to(input_ids.device))

    def run_micro_batches(
        self,
        inputs: Sequence[Tensor],
        on_logits: OnLogits,
        backward: bool = False,
        context: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> list[Any]:
        """`on_logits`' result for each micro-batch of `inputs`, on every rank (`pipeline.run`); with
        `backward`, the gradients of the losses it returns accumulated into the parameters, the tied
        embedding's summed with its head copy's."""
        results = pipeline.run(self.gpt, inputs, on_logits, backward, context)
        if backward:
            pipeline.sync_tied_grads(self.gpt, self.stage)
        return results

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:  # type: ignore[override]
        """The weights in HF names and layout (the tensors share storage with this rank's parameters where
        the layouts agree; fused, gathered and other stages' ones are copies)."""
        if args or kwargs:
            raise TypeError("MegatronLM.state_dict() takes no arguments: it returns the HF state dict")
        own = {k: v for k, v in self.gpt.state_dict().items() if not k.endswith("_extra_state")}
        stage = pipeline.from_stage(sharding.gather(own, self.tp, self._tp_group), self.stage)
        return to_hf(pipeline.gather_stages(stage, self._pp_group), self.arch)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Copy an HF state dict (as `state_dict()` gives) into the parameters; exact keys required."""
        expected = hf_keys(self.arch)
        if set(state_dict) != expected:
            missing, extra = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
            raise KeyError(f"HF state dict does not fit: missing {missing[:5]}, unexpected {extra[:5]}")
        stage = pipeline.to_stage(to_megatron(state_dict, self.arch), self.stage)
        result = self.gpt.load_state_dict(sharding.shard(stage, self.tp_rank, self.tp), strict=False)
        left = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if left or result.unexpected_keys:
            raise KeyError(f"Megatron keys not set: {left}, unexpected: {result.unexpected_keys}")
        return torch.nn.modules.module._IncompatibleKeys([], [])

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Scale the gradients so their whole-model norm is at most `max_norm` (as
        `torch.nn.utils.clip_grad_norm_`, whose coefficient this uses); returns the norm before."""
        named = pipeline.from_stage(dict(self.gpt.named_parameters()), self.stage)  # a head copy once
        norm = sharding.grad_norm(named.items(), self.tp, self._tp_group, stages=self._pp_group)
        coefficient = min(1.0, max_norm / (norm + 1e-6))
        if coefficient < 1.0:
            for p in self.gpt.parameters():
                if p.grad is not None:
                    p.grad.mul_(coefficient)
        return torch.tensor(norm)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """`optimizer.state_dict()` whole: every per-parameter tensor gathered over the tensor-parallel
        ranks, every stage's parameters indexed in the one-process model's order (so it loads at any
        tensor- and pipeline-parallel size). The trainer's AdamW has one parameter group."""
        state = optimizer.state_dict()
        [group] = state["param_groups"]
        whole = self._per_param(state["state"], lambda named: sharding.gather(named, self.tp, self._tp_group))
        local = [name for name, _ in self.gpt.named_parameters()]
        named = pipeline.from_stage({local[i]: s for i, s in whole.items()}, self.stage)
        flat = {f"{name}:{kind}": t for name, s in named.items() for kind, t in s.items()}
        index = {name: i for i, name in enumerate(self._whole_order())}
        out: dict[int, dict[str, Any]] = {}
        for key, t in pipeline.gather_stages(flat, self._pp_group).items():
            name, kind = key.rsplit(":", 1)
            out.setdefault(index[name], {})[kind] = t
        return {"state": out, "param_groups": [{**group, "params": list(range(len(index)))}]}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a state `optimizer_state` gave (at any parallel sizes): this rank takes its stage's
        parameters' entries, and of those its slices."""
        [group] = state["param_groups"]
        order = self._whole_order()
        named = pipeline.to_stage({order[i]: s for i, s in state["state"].items()}, self.stage)
        position = {name: i for i, (name, _) in enumerate(self.gpt.named_parameters())}
        own = self._per_param(
            {position[name]: s for name, s in named.items()},
            lambda named: sharding.shard(named, self.tp_rank, self.tp),
        )
        optimizer.load_state_dict(
            {"state": own, "param_groups": [{**group, "params": list(position.values())}]}
        )

    def _whole_order(self) -> list[str]:
        """The one-process model's parameter names in its `parameters()` order: every stage's, in stage
        order (a collective)."""
        local = dict.fromkeys(name for name, _ in self.gpt.named_parameters())
        return pipeline.gather_names(list(pipeline.from_stage(local, self.stage)), self._pp_group)

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

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        max_new_tokens: int = 16,
        do_sample: bool = False,
    ) -> Tensor:
        """Greedy decoding of one unpadded batch (a full forward per token: for checks, not for speed);
        the last stage picks each token and every rank gets it."""
        if do_sample:
            raise ValueError("MegatronLM.generate is greedy only (do_sample=False)")
        ids = input_ids
        eos = self.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos]) - {None}
        for _ in range(max_new_tokens):
            [nxt] = self.run_micro_batches([ids], lambda k, logits: (None, logits[:, -1:].argmax(-1).cpu()))
            ids = torch.cat([ids, nxt.to(ids.device)], dim=1)
            if ids.shape[0] == 1 and int(nxt) in stops:
                break
        return ids
