"""Device and model profiles, and the roofline times a modelled generation backend charges.

With no GPUs, paper-scale benchmarks model the *devices* while the control plane stays real. A device is
its datasheet peaks; a model is the handful of shape numbers that decide FLOPs and bytes moved. Times are
rooflines *per kind of kernel*, summed, because a forward pass runs its kernels one after the other: the
weight GEMMs take max(2 FLOPs per active parameter per token / peak FLOP/s, weight bytes read / bandwidth);
decode attention reads the KV cache of every running sequence (memory-bound: with GQA it does only
~2 x heads/kv_heads FLOPs per KV byte, far below any ridge point); prefill attention is compute-bound,
4 x layers x heads x head_dim FLOPs per (query, key) pair (QK^T and PV, 2 FLOPs per multiply-add each),
which is what makes a long agentic context expensive to extend: 1,500 new tokens on top of 40,000 cached
ones cost Qwen2.5-7B as many attention FLOPs as weight FLOPs. `mfu`/`mbu` (achieved fraction of peak FLOP/s
/ bandwidth) default to 1.0 so the numbers are the pure datasheet bound and hand checks are exact.

An engine over `tp` devices has `tp` times the peaks and memory, and its devices exchange activations over
NVLink each layer (`ModelProfile.exchange_bytes`: tensor-parallel all-reduces for a dense model,
expert-parallel all-to-all for an MoE). Simplifications, on purpose: no per-message latency, no overlap
of that exchange with compute; an MoE's attention weights, replicated on every device under expert
parallelism (~1.5B of Qwen3-30B-A3B's 30.5B parameters), count as split; a prefill forward never overlaps
a decode step (see `engine.backends.modelled`). An MoE step
reads the dense part of the weights plus every routed expert that at least one of its tokens picked: with
top-k of E experts and tokens routed independently and uniformly, n tokens touch a fraction
1 - (1 - k/E)^n of them (k/E for one token, i.e. the active parameters; nearly all of them from a few dozen
tokens on). Compute is always 2 FLOPs per *active* parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial

TERA = 1e12
GB = 1e9


@dataclass(frozen=True)
class DeviceProfile:
    """Datasheet peaks of one accelerator (see `DEVICES` for the sources of each number)."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s (no 2:4 sparsity)
    hbm_bytes_per_s: float  # HBM bandwidth
    memory_bytes: float  # HBM capacity
    cost_per_hour: float  # relative hourly price, H800 = 1.0 (an estimate, not a datasheet figure)
    interconnect_bytes_per_s: float  # NVLink, total bidirectional per GPU


# Sources. NVIDIA publishes bf16 Tensor Core peaks "with sparsity"; the dense figure is half of it.
# - H800 SXM (compute-optimised, China export variant of H100 SXM; NVIDIA H800 datasheet): bf16 1,979
#   TFLOP/s with sparsity -> 989 dense; 80 GB HBM3 at 3.35 TB/s; NVLink cut to 400 GB/s.
# - H20 (bandwidth-optimised, China export Hopper; NVIDIA H20 product brief as reported by the trade press,
#   no public datasheet): bf16 148 TFLOP/s dense; 96 GB HBM3 at 4.0 TB/s; NVLink 900 GB/s.
# - H200 SXM (NVIDIA H200 datasheet): bf16 1,979 TFLOP/s with sparsity -> 989 dense; 141 GB HBM3e at
#   4.8 TB/s; NVLink 900 GB/s.
# cost_per_hour is an estimate of relative rental prices (H20 about half an H800, H200 about a third
# more); it only weighs cost-normalised comparisons — build your own DeviceProfile for real prices.
DEVICES: dict[str, DeviceProfile] = {
    d.name: d
    for d in (
        DeviceProfile("H800", 989 * TERA, 3.35 * TERA, 80 * GB, 1.0, 400 * GB),
        DeviceProfile("H20", 148 * TERA, 4.0 * TERA, 96 * GB, 0.5, 900 * GB),
        DeviceProfile("H200", 989 * TERA, 4.8 * TERA, 141 * GB, 1.3, 900 * GB),
    )
}


def get_device(name: str) -> DeviceProfile:
    """The profile called `name` (case-insensitive), e.g. a pool's `device:` in the config."""
    for key, device in DEVICES.items():
        if key.lower() == name.lower():
            return device
    raise KeyError(f"unknown device profile {name!r}; known: {', '.join(DEVICES)}")


@dataclass(frozen=True)
class ModelProfile:
    """The shape numbers of a transformer that decide FLOPs and bytes (from the model's config.json)."""

    name: str
    params: float  # all parameters (what must fit in memory)
    active_params: float  # parameters used per token: = params for dense models, routed subset for MoE
    layers: int
    kv_heads: int  # key/value heads (GQA)
    head_dim: int
    heads: int  # query heads (a multiple of kv_heads): they set the attention FLOPs
    hidden: int  # hidden size: the activations devices of one engine exchange per token and layer
    bytes_per_param: int = 2  # bf16 weights
    bytes_per_kv_elem: int = 2  # bf16 KV cache
    experts: int = 0  # routed experts per MoE layer; 0 for a dense model
    experts_per_token: int = 0  # experts each token is routed to (top-k)

    def __post_init__(self) -> None:
        if not 0 < self.active_params <= self.params:
            raise ValueError(f"{self.name}: need 0 < active_params <= params")
        if self.heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: need query heads a multiple of kv_heads, got {self.heads}")
        if self.experts and not 0 < self.experts_per_token < self.experts:
            got = f"top-{self.experts_per_token} of {self.experts}"
            raise ValueError(f"{self.name}: need 0 < experts_per_token < experts, got {got}")
        if (self.active_params < self.params) != bool(self.experts):
            raise ValueError(f"{self.name}: an MoE (active_params < params) must give experts and top-k")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token adds to the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_kv_elem

    def attention_flops(self, pairs: float) -> float:
        """FLOPs of prefill attention over `pairs` (query, key) pairs (`attention_pairs`)."""
        return 4 * self.layers * self.heads * self.head_dim * pairs

    def exchange_bytes(self, tokens: int, tp: int) -> float:
        """Bytes each of `tp` devices of one engine sends in a forward pass over `tokens` tokens
        (activations in the weights' dtype).

        Dense, tensor parallel: two all-reduces of `tokens x hidden` per layer (after attention, after the
        MLP); a ring all-reduce sends 2 (tp - 1) / tp of the buffer per device. MoE, expert parallel with
        data-parallel attention (how SGLang and vLLM spread an MoE over GPUs): each device's tokens/tp
        tokens go to their top-k experts, (tp - 1) / tp of them on other devices, and come back: an
        all-to-all dispatch and combine per layer.
        """
        if tp == 1:
            return 0.0
        act = tokens * self.hidden * self.bytes_per_param
        if self.experts:
            return 2 * self.layers * act / tp * self.experts_per_token * (tp - 1) / tp
        return 2 * self.layers * act * 2 * (tp - 1) / tp

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def active_weight_bytes(self) -> float:
        return self.active_params * self.bytes_per_param

    @property
    def expert_params(self) -> float:
        """Parameters in routed experts (all of them): the active ones are a k/E share of these."""
        if not self.experts:
            return 0.0
        return (self.params - self.active_params) / (1 - self.experts_per_token / self.experts)

    def step_weight_bytes(self, seqs: int) -> float:
        """Weight bytes one forward step over `seqs` tokens reads: the dense part and every expert touched."""
        if not self.experts:
            return self.weight_bytes
        touched = 1 - (1 - self.experts_per_token / self.experts) ** max(seqs, 1)
        return (self.params - self.expert_params * (1 - touched)) * self.bytes_per_param


# Presets from the Qwen model cards / config.json (parameter counts as published, incl. embeddings; the
# fourth number is the layer count).
MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("qwen2.5-7b", 7.61e9, 7.61e9, 28, kv_heads=4, head_dim=128, heads=28, hidden=3584),
        ModelProfile("qwen3-8b", 8.19e9, 8.19e9, 36, kv_heads=8, head_dim=128, heads=32, hidden=4096),
        ModelProfile("qwen2.5-32b", 32.5e9, 32.5e9, 64, kv_heads=8, head_dim=128, heads=40, hidden=5120),
        ModelProfile(
            "qwen3-30b-a3b",
            30.5e9,
            3.3e9,
            layers=48,
            kv_heads=4,
            head_dim=128,
            heads=32,
            hidden=2048,
            experts=128,
            experts_per_token=8,
        ),
    )
}


def get_model(name: str) -> ModelProfile:
    """The preset called `name` (case-insensitive)."""
    for key, model in MODELS.items():
        if key.lower() == name.lower():
            return model
    raise KeyError(f"unknown model profile {name!r}; known: {', '.join(MODELS)}")


def kv_capacity_tokens(model: ModelProfile, device: DeviceProfile, tp: int = 1) -> int:
    """Tokens of KV cache that fit in the memory of `tp` devices once the weights are loaded."""
    free = device.memory_bytes * tp - model.weight_bytes
    if free <= 0:
        raise ValueError(
            f"{model.name} needs {model.weight_bytes / GB:.1f} GB of weights; {tp} x {device.name} has "
            f"{device.memory_bytes * tp / GB:.0f} GB: raise tp"
        )
    return int(free // model.kv_bytes_per_token)


def attention_pairs(new_tokens: int, cached_tokens: int = 0) -> int:
    """(query, key) pairs of causal attention when `new_tokens` extend a context of `cached_tokens`."""
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2


def prefill_s(
    model: ModelProfile, device: DeviceProfile, tokens: int, tp: int = 1, *, pairs: int = 0, mfu: float = 1.0
) -> float:
    """Seconds of compute to prefill `tokens` tokens: 2 FLOPs per active parameter per token, plus the
    attention FLOPs of `pairs` (query, key) pairs (`attention_pairs`). The compute roof alone."""
    return (2 * model.active_params * tokens + model.attention_flops(pairs)) / (device.peak_flops * tp * mfu)


def _gemm_s(
    model: ModelProfile, device: DeviceProfile, tokens: int, tp: int, mfu: float, mbu: float
) -> float:
    """The weight GEMMs of one forward pass over `tokens` tokens: compute roof or one read of the weights
    those tokens touch (for an MoE, the experts they are routed to), whichever is longer; then, over `tp`
    devices, their exchange of activations (`ModelProfile.exchange_bytes`) at the NVLink bandwidth one
    way (half the datasheet's bidirectional figure), not overlapped with compute."""
    memory = model.step_weight_bytes(tokens) / (device.hbm_bytes_per_s * tp * mbu)
    exchange = model.exchange_bytes(tokens, tp) / (device.interconnect_bytes_per_s / 2)
    return max(prefill_s(model, device, tokens, tp, mfu=mfu), memory) + exchange


def prefill_only_s(
    model: ModelProfile,
    device: DeviceProfile,
    tokens: int,
    tp: int = 1,
    *,
    pairs: int = 0,
    longest: int = 0,
    mfu: float = 1.0,
    mbu: float = 1.0,
) -> float:
    """Seconds of one prefill forward pass that does nothing else (a colocated engine's prefill iteration,
    or a PD prefill device): its weight GEMMs (`_gemm_s`: at least one read of the weights the batch
    touches) plus the attention FLOPs of `pairs` (query, key) pairs, `longest` of them one request's.

    Over `tp` devices a dense model's attention is tensor parallel (heads split: pairs / tp each). An MoE's
    is data parallel under expert parallelism: a request's attention runs on the one device holding its
    KV while the others wait for it at the layer's all-to-all, so the pass lasts at least the longest
    request's attention on one device — the "DP attention imbalance" SGLang gives as a reason for PD.
    """
    work = max(pairs / tp, longest) if model.experts and tp > 1 else pairs / tp
    attention = model.attention_flops(work) / (device.peak_flops * mfu)
    return _gemm_s(model, device, tokens, tp, mfu, mbu) + attention


def decode_step_s(
    model: ModelProfile,
    device: DeviceProfile,
    batch_context_tokens: int,
    tp: int = 1,
    *,
    seqs: int = 1,
    mbu: float = 1.0,
    mfu: float = 1.0,
) -> float:
    """Seconds of one decode step giving each of `seqs` running sequences one token.

    The weight GEMMs over `seqs` tokens (`_gemm_s`: memory-bound unless the batch is big on a compute-poor
    device, e.g. H20 past ~37 sequences) then attention reading the KV cache of every running sequence's
    context (`batch_context_tokens` summed over the batch).
    """
    return decode_steps_s(model, device, batch_context_tokens, 1, tp, seqs=seqs, mbu=mbu, mfu=mfu)


def decode_steps_s(
    model: ModelProfile,
    device: DeviceProfile,
    batch_context_tokens: int,
    steps: int,
    tp: int = 1,
    *,
    seqs: int = 1,
    mbu: float = 1.0,
    mfu: float = 1.0,
) -> float:
    """Seconds of `steps` consecutive decode steps of a fixed batch, in closed form.

    The GEMMs cost the same every step; step j reads `batch_context_tokens + j * seqs` tokens of KV (every
    sequence grew by one token per step), so the sum is exact without looping — what lets the modelled
    backend advance many steps at once.
    """
    return DecodeCost(model, device, tp, mfu=mfu, mbu=mbu)(batch_context_tokens, steps, seqs)


class DecodeCost:
    """`decode_steps_s` of one engine (`model` on `tp` x `device` at `mfu`/`mbu`), the same numbers, for a
    caller that asks at every iteration (the modelled backend): the KV read's rate is computed once, and the
    weight GEMMs' time of each batch size is remembered (`GEMM_SIZES` sizes at most, least recent dropped).
    """

    GEMM_SIZES = 1024

    def __init__(
        self, model: ModelProfile, device: DeviceProfile, tp: int = 1, *, mfu: float = 1.0, mbu: float = 1.0
    ) -> None:
        self.kv_s = model.kv_bytes_per_token / (device.hbm_bytes_per_s * tp * mbu)  # s per KV token read
        self.gemm_s = lru_cache(self.GEMM_SIZES)(partial(_gemm_s, model, device, tp=tp, mfu=mfu, mbu=mbu))

    def __call__(self, batch_context_tokens: int, steps: int, seqs: int) -> float:
        """Seconds of `steps` decode steps of `seqs` sequences holding `batch_context_tokens` of KV."""
        read = steps * batch_context_tokens + seqs * steps * (steps - 1) / 2
        return steps * self.gemm_s(seqs) + self.kv_s * read


def kv_transfer_s(model: ModelProfile, tokens: int, link_bytes_per_s: float) -> float:
    """Seconds to ship the KV cache of `tokens` tokens over a link (PD disaggregation)."""
    return model.kv_bytes_per_token * tokens / link_bytes_per_s
