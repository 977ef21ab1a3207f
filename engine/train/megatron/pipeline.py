"""Pipeline parallelism for `MegatronLM`: which stage holds which weights, and running micro-batches
through the stages.

With pipeline size `pp`, the `L` decoder layers are cut into `pp` equal stages (`pp` must divide `L`):
stage `s` holds layers `s·L/pp … (s+1)·L/pp − 1`, which Megatron builds and names `decoder.layers.0 …`
locally; the first stage also holds the word embeddings, the last the final norm and the output layer.
Ranks follow Megatron's default order (tensor-parallel rank fastest): global rank `s·tp + t` is stage `s`,
tensor-parallel rank `t`, and each of the `tp` pipeline groups links one tensor-parallel rank of every stage.

Tied embeddings (the tiny Qwen2 here, SmolLM2): the last stage holds a copy of the embedding as its output
layer. Megatron's own way of keeping that copy (`share_embeddings_and_output_weights` across stages) moves
it with `.cuda()` when the model is built and sums its gradient through the `main_grad` buffers of its DDP
wrapper, neither of which exists in this trainer. So with `pp > 1` every stage builds its GPTModel untied,
the copy is loaded with the embedding's values (`to_stage`), and `sync_tied_grads` sums the two gradients
over Megatron's embedding group (first and last stage) after the backward passes: both copies then take
the same AdamW step and stay equal. Whole weights and optimiser state hold the embedding once
(`from_stage` drops the copy), and the gradient norm counts it once.

`run` is megatron-core's schedule (`get_forward_backward_func`: 1F1B over the stages, or one micro-batch
after another with one stage) with a loss given as a function of the last stage's logits; what that
function returns for each micro-batch reaches every stage (`from_last_stage`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from engine.train.megatron import cpu_shims
from engine.train.megatron.convert import Arch

V = TypeVar("V")
# (micro-batch index, its logits (B, T, V)) → (the loss to backpropagate, or None; a small picklable result)
OnLogits = Callable[[int, Tensor], tuple[Tensor | None, Any]]
EMBEDDING, OUTPUT = "embedding.word_embeddings.weight", "output_layer.weight"
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


@dataclass(frozen=True)
class Stage:
    """Pipeline stage `index` of `count`, holding `layers` decoder layers from global layer `offset`."""

    index: int
    count: int
    layers: int
    tied: bool  # the HF model ties its output layer to the embedding

    @classmethod
    def of(cls, arch: Arch, pp: int, index: int) -> Stage:
        """Stage `index` of a `pp`-stage pipeline over `arch`; a `pp` not dividing the layers is refused."""
        if arch.layers % pp:
            raise ValueError(
                f"pipeline_parallel {pp} must divide the model's {arch.layers} decoder layers "
                f"(stages hold equal numbers of layers)"
            )
        return cls(index=index, count=pp, layers=arch.layers // pp, tied=arch.tied)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    @property
    def offset(self) -> int:
        return self.index * self.layers

    @property
    def head_copy(self) -> bool:
        """Whether this stage's output layer is a copy of the (tied) embedding held by the first stage."""
        return self.tied and self.count > 1 and self.last


def to_stage(full: Mapping[str, V], stage: Stage) -> dict[str, V]:
    """This stage's entries of `full` (GPTModel names of the whole model: weights, or anything per
    parameter), its layers renumbered from 0; a tied head copy takes the embedding's entry."""
    out = {}
    for name, value in full.items():
        layer = _LAYER.fullmatch(name)
        if layer is not None:
            i = int(layer[1]) - stage.offset
            if 0 <= i < stage.layers:
                out[f"decoder.layers.{i}.{layer[2]}"] = value
        elif stage.first if name.startswith("embedding.") else stage.last:
            out[name] = value
    if stage.head_copy and EMBEDDING in full:  # (an optimiser that has not stepped has no entries)
        out[OUTPUT] = full[EMBEDDING]
    return out


def from_stage(local: Mapping[str, V], stage: Stage) -> dict[str, V]:
    """`to_stage` undone: this stage's entries under the whole model's names, a tied head copy left out."""
    out = {}
    for name, value in local.items():
        layer = _LAYER.fullmatch(name)
        if layer is not None:
            out[f"decoder.layers.{int(layer[1]) + stage.offset}.{layer[2]}"] = value
        elif not (stage.head_copy and name == OUTPUT):
            out[name] = value
    return out


def gather_stages(local: Mapping[str, Tensor], group: dist.ProcessGroup) -> dict[str, Tensor]:
    """Every stage's named tensors on every rank of the pipeline `group`, stage by stage (a collective:
    names, shapes and dtypes first, then each tensor broadcast from the stage that holds it)."""
    if group.size() == 1:
        return dict(local)
    metas: list[Any] = [None] * group.size()
    dist.all_gather_object(metas, [(n, t.shape, t.dtype, t.device.type) for n, t in local.items()], group)
    wire = torch.device("cuda" if dist.get_backend(group) == "nccl" else "cpu")  # where NCCL/gloo send
    out = {}
    for index, meta in enumerate(metas):
        src = dist.get_global_rank(group, index)
        for name, shape, dtype, device in meta:
            if index == group.rank():
                dist.broadcast(local[name].detach().to(wire).contiguous(), src=src, group=group)
                out[name] = local[name]
            else:
                t = torch.empty(shape, dtype=dtype, device=wire)
                dist.broadcast(t, src=src, group=group)
                out[name] = t.to(device)
    return out


def gather_names(local: Sequence[str], group: dist.ProcessGroup) -> list[str]:
    """Every stage's names, stage by stage, on every rank of the pipeline `group` (a collective)."""
    if group.size() == 1:
        return list(local)
    every: list[Any] = [None] * group.size()
    dist.all_gather_object(every, list(local), group)
    return [name for names in every for name in names]


def from_last_stage(obj: V, group: dist.ProcessGroup) -> V:
    """The last stage's `obj` on every rank of the pipeline `group` (pickled: keep it small)."""
    if group.size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, group.size() - 1), group=group)
    return box[0]


def sync_tied_grads(gpt: torch.nn.Module, stage: Stage) -> None:
    """Sum the tied embedding's gradient and its head copy's over Megatron's embedding group (first and
    last stage), so both take the same step; nothing on other stages or without a copy."""
    from megatron.core import parallel_state

    if not stage.tied or stage.count == 1 or not (stage.first or stage.last):
        return
    weight = dict(gpt.named_parameters())[EMBEDDING if stage.first else OUTPUT]
    dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())


def causal_inputs(ids: Tensor) -> tuple[Tensor, Tensor]:
    """Positions 0..T-1 and the causal mask (True: masked) for a right-padded `(B, T)` batch: every real
    token gets exactly the attention and position it has in the HF model."""
    t = ids.shape[1]
    positions = torch.arange(t, device=ids.device).expand_as(ids)
    return positions, torch.ones(t, t, dtype=torch.bool, device=ids.device).triu(1)[None, None]


def run(
    gpt: torch.nn.Module,
    inputs: Sequence[Tensor],
    on_logits: OnLogits,
    backward: bool,
    context: Callable[[], AbstractContextManager[Any]],
) -> list[Any]:
    """Run micro-batches `inputs` (input ids `(B, T)`, right-padded) through this rank's stage with
    megatron-core's schedule; returns `on_logits`' results, on every stage.

    `on_logits` runs on the last stage with each micro-batch's logits; with `backward`, the loss it returns
    is backpropagated as it is (through every stage, the gradients accumulating), else it may be None.
    `context` wraps each forward (the trainer's autocast).
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def step(data: Iterator[tuple[int, Tensor]], model: torch.nn.Module) -> Any:
        k, ids = next(data)
        with context():
            out = model(ids, *causal_inputs(ids))
        return out, lambda logits: loss_of(k, logits)

    def loss_of(k: int, logits: Tensor) -> tuple[Tensor | None, Tensor, Any]:
        loss, result = on_logits(k, logits)
        # the loss as it is: `calculate_per_token_loss` keeps Megatron from dividing it by the micro-batch
        # count, and the token count it would use instead (no `finalize_model_grads_func`) is not read
        return loss, torch.ones((), dtype=torch.int), result

    with cpu_shims.schedule_context():
        results = get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=iter(enumerate(inputs)),
            model=[gpt],
            num_microbatches=len(inputs),
            seq_length=max(ids.shape[1] for ids in inputs),  # shapes travel per micro-batch
            micro_batch_size=max(ids.shape[0] for ids in inputs),
            forward_only=not backward,
        )
    return from_last_stage(results, parallel_state.get_pipeline_model_parallel_group())
