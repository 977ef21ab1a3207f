"""Device and model profiles, and the roofline times a modelled generation backend charges (DESIGN §5).

With no GPUs, paper-scale benchmarks model the *devices* while the control plane stays real. A device is
its datasheet peaks; a model is the handful of shape numbers that decide FLOPs and bytes moved. The times
are rooflines: prefill is compute-bound (2 FLOPs per active parameter per token), decode is bound by the
bytes every step reads from HBM (weights + the KV cache of every running sequence), with the compute roof
as a floor. `mfu`/`mbu` (achieved fraction of peak FLOP/s / bandwidth) default to 1.0 so the numbers are
the pure datasheet bound and hand checks are exact; pass e.g. 0.5/0.7 for realistic efficiency.

Simplifications, on purpose: attention FLOPs are ignored (small next to the weights' FLOPs below a few
thousand tokens of context); tensor parallelism over `tp` devices scales peaks linearly (no all-reduce
cost). An MoE decode step reads the dense part of the weights plus every routed expert that at least one of
the batch's tokens picked: with top-k of E experts and tokens routed independently and uniformly, a batch of
b sequences touches a fraction 1 - (1 - k/E)^b of them (k/E for one sequence, i.e. the active parameters;
nearly all of them from a few dozen sequences on). Compute is always 2 FLOPs per *active* parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    bytes_per_param: int = 2  # bf16 weights
    bytes_per_kv_elem: int = 2  # bf16 KV cache
    experts: int = 0  # routed experts per MoE layer; 0 for a dense model
    experts_per_token: int = 0  # experts each token is routed to (top-k)

    def __post_init__(self) -> None:
        if not 0 < self.active_params <= self.params:
            raise ValueError(f"{self.name}: need 0 < active_params <= params")
        if self.experts and not 0 < self.experts_per_token < self.experts:
            got = f"top-{self.experts_per_token} of {self.experts}"
            raise ValueError(f"{self.name}: need 0 < experts_per_token < experts, got {got}")
        if (self.active_params < self.params) != bool(self.experts):
            raise ValueError(f"{self.name}: an MoE (active_params < params) must give experts and top-k")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token adds to the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_kv_elem

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


# Presets from the Qwen model cards / config.json (parameter counts as published, incl. embeddings).
MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("qwen2.5-7b", 7.61e9, 7.61e9, layers=28, kv_heads=4, head_dim=128),
        ModelProfile("qwen3-8b", 8.19e9, 8.19e9, layers=36, kv_heads=8, head_dim=128),
        ModelProfile("qwen2.5-32b", 32.5e9, 32.5e9, layers=64, kv_heads=8, head_dim=128),
        ModelProfile(
            "qwen3-30b-a3b",
            30.5e9,
            3.3e9,
            layers=48,
            kv_heads=4,
            head_dim=128,
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


def prefill_s(
    model: ModelProfile, device: DeviceProfile, tokens: int, tp: int = 1, *, mfu: float = 1.0
) -> float:
    """Seconds to prefill `tokens` prompt tokens: 2 FLOPs per active parameter per token, compute-bound.

    No weight-read floor: in an engine iteration the decode step that follows reads the weights anyway
    (`prefill_only_s` is the time on a device that does nothing else).
    """
    return 2 * model.active_params * tokens / (device.peak_flops * tp * mfu)


def prefill_only_s(
    model: ModelProfile,
    device: DeviceProfile,
    tokens: int,
    tp: int = 1,
    *,
    mfu: float = 1.0,
    mbu: float = 1.0,
) -> float:
    """Seconds of a prefill batch on a dedicated prefill device (PD): the compute roof, but no less than one
    read of the weights the batch touches (for an MoE, the experts its `tokens` are routed to)."""
    memory = model.step_weight_bytes(tokens) / (device.hbm_bytes_per_s * tp * mbu)
    return max(prefill_s(model, device, tokens, tp, mfu=mfu), memory)


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

    Memory roof: the step reads the weights once (for an MoE, the experts the batch touches; see the
    module doc) plus the KV cache of every running sequence's context (`batch_context_tokens` summed over
    the batch). Compute roof: 2 FLOPs per active parameter per sequence; it wins only for big batches on
    compute-poor devices (e.g. H20).
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

    Step j reads `batch_context_tokens + j * seqs` tokens of KV (every sequence grew by one token per
    step), so its memory time is linear in j and the sum is exact without looping — what lets the
    modelled backend advance many steps at once.
    """
    bandwidth = device.hbm_bytes_per_s * tp * mbu
    first = (model.step_weight_bytes(seqs) + model.kv_bytes_per_token * batch_context_tokens) / bandwidth
    growth = model.kv_bytes_per_token * seqs / bandwidth
    compute = 2 * model.active_params * seqs / (device.peak_flops * tp * mfu)
    # Steps j < (compute - first) / growth are compute-bound; the rest are memory-bound.
    if first >= compute:
        bound = 0
    elif growth == 0:
        bound = steps
    else:
        bound = min(steps, math.ceil((compute - first) / growth))
    memory_steps = steps - bound
    return bound * compute + memory_steps * first + growth * memory_steps * (bound + steps - 1) / 2


def kv_transfer_s(model: ModelProfile, tokens: int, link_bytes_per_s: float) -> float:
    """Seconds to ship the KV cache of `tokens` tokens over a link (PD disaggregation)."""
    return model.kv_bytes_per_token * tokens / link_bytes_per_s
