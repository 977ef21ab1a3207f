"""Roofline times against hand-computed numbers.

The toy model has round numbers: 1e9 params (2e9 weight bytes), KV = 2 (K,V) * 10 layers * 2 heads *
100 dims * 2 bytes = 8000 bytes per token; attention = 4 * 10 layers * 4 query heads * 100 dims = 16_000
FLOPs per (query, key) pair; 1000 hidden.
"""

from __future__ import annotations

import pytest

from engine.devices import (
    DEVICES,
    DeviceProfile,
    ModelProfile,
    attention_pairs,
    decode_step_s,
    decode_steps_s,
    get_device,
    get_model,
    kv_capacity_tokens,
    kv_transfer_s,
    prefill_only_s,
    prefill_s,
)

TOY = ModelProfile(
    "toy-1b", params=1e9, active_params=1e9, layers=10, kv_heads=2, head_dim=100, heads=4, hidden=1000
)
H800, H20, H200 = get_device("H800"), get_device("H20"), get_device("H200")


def test_datasheet_figures() -> None:
    assert (H800.peak_flops, H800.hbm_bytes_per_s, H800.memory_bytes) == (989e12, 3.35e12, 80e9)
    assert (H20.peak_flops, H20.hbm_bytes_per_s, H20.memory_bytes) == (148e12, 4.0e12, 96e9)
    assert (H200.peak_flops, H200.hbm_bytes_per_s, H200.memory_bytes) == (989e12, 4.8e12, 141e9)
    assert set(DEVICES) == {"H800", "H20", "H200"}


def test_lookup_is_case_insensitive_and_names_the_known_ones() -> None:
    assert get_device("h20") is H20
    assert get_model("Qwen2.5-7B").layers == 28
    with pytest.raises(KeyError, match="unknown device profile 'B200'; known: H800, H20, H200"):
        get_device("B200")
    with pytest.raises(KeyError, match="unknown model profile"):
        get_model("gpt-5")


def test_kv_bytes_per_token() -> None:
    assert TOY.kv_bytes_per_token == 8000
    assert get_model("qwen2.5-7b").kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344
    assert get_model("qwen2.5-32b").kv_bytes_per_token == 262144
    assert get_model("qwen3-30b-a3b").kv_bytes_per_token == 98304


# Prefill of 10_000 tokens: 2 * 1e9 * 1e4 = 2e13 FLOPs. Decode with 100_000 tokens of context, one sequence:
# 2e9 weight bytes + 8e8 KV bytes = 2.8e9 bytes (its compute, 2e9 FLOPs, is far below the memory time).
@pytest.mark.parametrize(
    ("device", "prefill", "decode"),
    [
        (H800, 2e13 / 989e12, 2.8e9 / 3.35e12),  # 20.22 ms, 0.836 ms
        (H20, 2e13 / 148e12, 2.8e9 / 4.0e12),  # 135.1 ms, 0.700 ms
        (H200, 2e13 / 989e12, 2.8e9 / 4.8e12),  # 20.22 ms, 0.583 ms
    ],
)
def test_prefill_and_decode_times(device: DeviceProfile, prefill: float, decode: float) -> None:
    assert prefill_s(TOY, device, 10_000) == pytest.approx(prefill, rel=1e-12)
    assert decode_step_s(TOY, device, 100_000) == pytest.approx(decode, rel=1e-12)
    # tensor parallelism and efficiency factors divide the peak; over 2 devices, each sends 2 all-reduces
    # per layer of 1 token x 1000 hidden x 2 bytes, half of each (ring): 2 * 10 * 2000 * 2 * 1/2 bytes
    assert prefill_s(TOY, device, 10_000, tp=4, mfu=0.5) == pytest.approx(prefill / 2, rel=1e-12)
    exchange = 40_000 / (device.interconnect_bytes_per_s / 2)
    assert decode_step_s(TOY, device, 100_000, tp=2, mbu=0.5) == pytest.approx(decode + exchange, rel=1e-12)


def test_literal_values() -> None:
    assert prefill_s(TOY, H800, 10_000) == pytest.approx(0.020222, rel=1e-4)
    assert prefill_s(TOY, H20, 10_000) == pytest.approx(0.135135, rel=1e-4)
    assert decode_step_s(TOY, H800, 100_000) == pytest.approx(8.3582e-4, rel=1e-4)
    assert decode_step_s(TOY, H200, 100_000) == pytest.approx(5.8333e-4, rel=1e-4)


def test_compute_optimised_prefills_faster_bandwidth_optimised_decodes_faster() -> None:
    model = get_model("qwen2.5-7b")
    assert prefill_s(model, H20, 4096) / prefill_s(model, H800, 4096) == pytest.approx(989 / 148)
    assert decode_step_s(model, H800, 50_000) / decode_step_s(model, H20, 50_000) == pytest.approx(4.0 / 3.35)


def test_big_batch_decode_on_h20_hits_the_compute_roof() -> None:
    # 256 sequences, no context: compute 2e9 * 256 FLOPs; memory 2e9 bytes.
    assert decode_step_s(TOY, H20, 0, seqs=256) == pytest.approx(2e9 * 256 / 148e12)  # 3.46 ms > 0.5 ms
    assert decode_step_s(TOY, H800, 0, seqs=256) == pytest.approx(2e9 / 3.35e12)  # 0.597 ms > 0.518 ms


def test_moe_is_costed_by_its_active_params() -> None:
    moe = get_model("qwen3-30b-a3b")
    assert (moe.params, moe.active_params) == (30.5e9, 3.3e9)
    assert prefill_s(moe, H800, 1000) == pytest.approx(2 * 3.3e9 * 1000 / 989e12)  # 6.67 ms
    assert decode_step_s(moe, H800, 0) == pytest.approx(6.6e9 / 3.35e12)  # 1.97 ms: active weights only


def test_decode_attention_reads_kv_after_the_weight_gemms_not_under_them() -> None:
    # H20, 64 sequences, 1e6 tokens of context: GEMMs compute-bound, 2e9 * 64 / 148e12 = 0.865 ms (> 0.5 ms
    # of weights), then attention reads 8e9 bytes of KV: 2 ms. One roof over both would say 2.5 ms.
    assert decode_step_s(TOY, H20, 1_000_000, seqs=64) == pytest.approx(2e9 * 64 / 148e12 + 8e9 / 4e12)


def test_many_steps_in_closed_form_equal_the_sum_of_single_steps() -> None:
    # H20, 64 sequences: compute-bound GEMMs and a KV read that grows every step.
    ctx, seqs, steps = 1000, 64, 5000
    looped = sum(decode_step_s(TOY, H20, ctx + j * seqs, seqs=seqs) for j in range(steps))
    assert decode_steps_s(TOY, H20, ctx, steps, seqs=seqs) == pytest.approx(looped, rel=1e-9)
    for device in (H800, H200):  # memory-bound throughout
        looped = sum(decode_step_s(TOY, device, ctx + j * seqs, seqs=seqs) for j in range(300))
        assert decode_steps_s(TOY, device, ctx, 300, seqs=seqs) == pytest.approx(looped, rel=1e-9)


def test_kv_transfer() -> None:
    model = get_model("qwen2.5-7b")
    assert kv_transfer_s(model, 1000, 50e9) == pytest.approx(57344 * 1000 / 50e9)  # 1.15 ms
    assert kv_transfer_s(TOY, 1000, 8e9) == pytest.approx(1e-3)


def test_kv_capacity() -> None:
    assert kv_capacity_tokens(TOY, H800) == (80e9 - 2e9) // 8000 == 9_750_000
    big = ModelProfile("dense-70b", 70e9, 70e9, layers=80, kv_heads=8, head_dim=128, heads=64, hidden=8192)
    with pytest.raises(ValueError, match=r"140.0 GB of weights; 1 x H20 has 96 GB: raise tp"):
        kv_capacity_tokens(big, H20)
    assert kv_capacity_tokens(big, H20, tp=2) == (192e9 - 140e9) // big.kv_bytes_per_token


def test_moe_decode_reads_the_experts_its_batch_touches() -> None:
    moe = get_model("qwen3-30b-a3b")  # 128 experts, top-8: a token touches 1/16 of the expert weights
    experts = (30.5e9 - 3.3e9) / (1 - 8 / 128)  # 29.01e9 parameters in routed experts
    assert moe.expert_params == pytest.approx(experts)
    assert moe.step_weight_bytes(1) == pytest.approx(2 * 3.3e9)  # one sequence: the active params
    touched_64 = 1 - (15 / 16) ** 64  # 98.4% of the experts
    assert moe.step_weight_bytes(64) == pytest.approx(2 * (30.5e9 - experts * (1 - touched_64)))  # 60.1 GB
    assert decode_step_s(moe, H800, 0, seqs=64) == pytest.approx(
        moe.step_weight_bytes(64) / 3.35e12
    )  # 17.9 ms
    dense = get_model("qwen2.5-7b")
    assert dense.step_weight_bytes(1) == dense.step_weight_bytes(64) == 2 * 7.61e9


def test_prefill_on_its_own_device_reads_the_weights_at_least_once() -> None:
    moe, dense = get_model("qwen3-30b-a3b"), get_model("qwen2.5-7b")
    # 256 tokens of MoE: compute 2 * 3.3e9 * 256 / 989e12 = 1.71 ms < reading ~61 GB of experts: 18.2 ms
    assert prefill_only_s(moe, H800, 256) == pytest.approx(moe.step_weight_bytes(256) / 3.35e12)
    # 4096 tokens of the dense 7B: 63.0 ms of compute > 4.5 ms of weights
    assert prefill_only_s(dense, H800, 4096) == prefill_s(dense, H800, 4096) == pytest.approx(0.063, rel=0.01)


def test_prefill_attention_flops_grow_with_the_cached_context() -> None:
    assert attention_pairs(3) == 1 + 2 + 3 and attention_pairs(2, cached_tokens=10) == 2 * 10 + 3
    assert TOY.attention_flops(attention_pairs(100)) == 16_000 * 5050
    assert prefill_s(TOY, H800, 100, pairs=5050) == pytest.approx((2e9 * 100 + 16_000 * 5050) / 989e12)
    # Qwen2.5-7B, an agentic turn: 1500 new tokens on 40k cached ones. Attention: 4 * 28 layers * 28 heads *
    # 128 dims = 401_408 FLOPs a pair, 61.1M pairs = 2.45e13 FLOPs, more than the 2.28e13 of the weights.
    dense = get_model("qwen2.5-7b")
    pairs = attention_pairs(1500, 40_000)
    assert pairs == 1500 * 40_000 + 1500 * 1501 // 2 == 61_125_750
    attention, gemms = 401_408 * pairs / 989e12, 2 * 7.61e9 * 1500 / 989e12  # 24.8 ms, 23.1 ms
    assert prefill_only_s(dense, H800, 1500, pairs=pairs) == pytest.approx(gemms + attention)  # 47.9 ms


def test_moe_prefill_attention_waits_for_the_longest_request_under_expert_parallelism() -> None:
    moe, dense = get_model("qwen3-30b-a3b"), get_model("qwen2.5-7b")
    one = attention_pairs(1500, 40_000)
    # MoE over 4 devices, data-parallel attention: one request's 4 * 48 * 32 * 128 FLOPs a pair run on one
    # device (48.6 ms on an H800) while the other three wait
    alone = 786_432 * one / 989e12
    gemms = prefill_only_s(moe, H800, 1500, tp=4)
    assert prefill_only_s(moe, H800, 1500, tp=4, pairs=one, longest=one) == pytest.approx(gemms + alone)
    # four such requests, one per device, take no longer than one
    gemms = prefill_only_s(moe, H800, 6000, tp=4)
    assert prefill_only_s(moe, H800, 6000, tp=4, pairs=4 * one, longest=one) == pytest.approx(gemms + alone)
    # a dense model's attention is tensor parallel: a quarter of the heads each
    gemms = prefill_only_s(dense, H800, 1500, tp=4)
    split = 401_408 * one / (4 * 989e12)
    assert prefill_only_s(dense, H800, 1500, tp=4, pairs=one, longest=one) == pytest.approx(gemms + split)


def test_devices_of_one_engine_exchange_activations() -> None:
    assert TOY.exchange_bytes(100, 1) == 0
    # dense, tensor parallel: 2 all-reduces a layer of 100 x 1000 x 2 bytes, a ring sends 2 (tp - 1) / tp
    assert TOY.exchange_bytes(100, 2) == 2 * 10 * 200_000 * 1.0
    assert TOY.exchange_bytes(100, 4) == pytest.approx(2 * 10 * 200_000 * 1.5)
    # MoE, expert parallel: each device's 16 of 64 tokens go to 8 experts, 3/4 of them elsewhere, and back:
    # 2 * 48 layers * 16 tokens * 2048 hidden * 2 bytes * 8 * 3/4 = 37.7 MB, 0.19 ms over H800 NVLink
    moe = get_model("qwen3-30b-a3b")
    assert moe.exchange_bytes(64, 4) == pytest.approx(2 * 48 * 16 * 2048 * 2 * 8 * 0.75) == 37_748_736
    step = moe.step_weight_bytes(64) / (4 * 3.35e12) + 37_748_736 / 200e9  # 4.48 ms + 0.19 ms
    assert decode_step_s(moe, H800, 0, tp=4, seqs=64) == pytest.approx(step)


def test_bad_shapes_are_refused() -> None:
    shape = {"layers": 2, "kv_heads": 1, "head_dim": 64, "heads": 2, "hidden": 128}
    with pytest.raises(ValueError, match="must give experts and top-k"):
        ModelProfile("moe", 10e9, 1e9, **shape)
    with pytest.raises(ValueError, match="got top-9 of 8"):
        ModelProfile("moe", 10e9, 1e9, **shape, experts=8, experts_per_token=9)
    with pytest.raises(ValueError, match="active_params <= params"):
        ModelProfile("odd", 1e9, 2e9, **shape)
    with pytest.raises(ValueError, match="query heads a multiple of kv_heads, got 3"):
        ModelProfile("gqa", 1e9, 1e9, **(shape | {"kv_heads": 2, "heads": 3}))
