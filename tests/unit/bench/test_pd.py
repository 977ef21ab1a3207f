"""PD bench on a tiny step: the same episodes under colocated, 1P3D and 2P2D, dense and MoE, over seeds."""

import argparse
from dataclasses import asdict

import pytest

from bench.clock import run as run_loop
from bench.pd import FULL, QUICK, Settings, measure, run, slots, summarize


def test_pd_configs_move_prefill_to_the_stage_and_ship_kv(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "pd.json"), groups=(2,), swe_turns=(6, 10), swe_obs_tokens=1000,
        cot_tokens=(512, 2048), seeds=(0, 1),
    )  # fmt: skip
    payload = run(args)
    assert payload["clock"] == "virtual" and payload["seeds"] == [0, 1]
    rows = {(r["model"], r["config"]): r for r in payload["rows"]}
    assert set(rows) == {(m, c) for m in ("dense", "moe") for c in ("colocated", "1P3D", "2P2D")}
    for model in ("dense", "moe"):
        colocated = rows[model, "colocated"]
        assert colocated["speedup"] == colocated["ci_low"] == colocated["ci_high"] == 1.0
        assert colocated["prefill_busy"] == colocated["kv_transfer_s"] == 0.0
        for config in ("1P3D", "2P2D"):
            r = rows[model, config]
            assert r["prefill_busy"] > 0 and r["kv_transfer_s"] > 0
            assert r["ci_low"] <= r["speedup"] <= r["ci_high"]
            assert r["rollout_ci_low"] <= r["rollout_s"] <= r["rollout_ci_high"]
            assert r["vs_paper"] in ("below", "overlaps", "above")
        # two prefill GPUs do the same prefill work in half the time: half the busy share, give or take
        assert rows[model, "2P2D"]["prefill_busy"] < 0.75 * rows[model, "1P3D"]["prefill_busy"]
    # the MoE's KV is 96 KiB a token against the dense model's 56 KiB: more to ship for the same prompts
    assert rows["moe", "1P3D"]["kv_transfer_s"] > 1.3 * rows["dense", "1P3D"]["kv_transfer_s"]
    assert (tmp_path / "pd.png").stat().st_size > 0 and "MoE 1.11–1.21x" in payload["note"]
    assert "best" not in payload["note"]  # every configuration is reported, none picked


def test_seeds_draw_other_episodes_and_a_seed_repeats_exactly() -> None:
    small = Settings(swe_turns=(6, 10), cot_tokens=(512, 2048))

    async def steps() -> list[float]:
        return [(await measure(small, "qwen2.5-7b", "1P3D", 2, seed))["rollout_s"] for seed in (0, 1, 0)]

    first, other, again = run_loop(steps())
    assert first == pytest.approx(again, rel=1e-9) and first != pytest.approx(other, rel=1e-3)


def test_speedup_is_the_median_of_per_seed_ratios() -> None:
    base = [
        {"rollout_s": x, "decode_busy": 0.5, "prefill_busy": 0.0, "kv_transfer_s": 0.0} for x in (10, 30, 20)
    ]
    runs = [
        {"rollout_s": x, "decode_busy": 0.6, "prefill_busy": 0.3, "kv_transfer_s": 1.0} for x in (5, 40, 30)
    ]
    row = summarize("dense", 8, "1P3D", runs, base)
    # per seed 2.0, 0.75, 0.667: median 0.75, not the ratio of medians 20 / 30
    assert row["speedup"] == pytest.approx(0.75) and row["rollout_s"] == 30
    assert row["ci_low"] == pytest.approx(2 / 3) and row["ci_high"] == pytest.approx(2.0)
    assert row["vs_paper"] == "overlaps" and row["paper"] == "1.03–1.05"
    assert summarize("moe", 8, "2P2D", runs[1:2], base[:1])["vs_paper"] == "below"  # 10 / 40 < 1.11
    assert summarize("moe", 8, "2P2D", runs[:1], base[1:2])["vs_paper"] == "above"  # 30 / 5 > 1.21


def test_quick_is_the_full_workload_scaled_down() -> None:
    full, quick = asdict(FULL), asdict(QUICK)
    assert {k for k in full if full[k] != quick[k]} <= {"groups", "seeds"}
    assert set(QUICK.groups) <= set(FULL.groups) and set(QUICK.seeds) <= set(FULL.seeds)
    assert len(FULL.seeds) >= 5 and len(QUICK.seeds) == 3


def test_moe_engines_span_their_gpus_dense_ones_do_not() -> None:
    moe = [slot.target for slot in slots(QUICK, "qwen3-30b-a3b", "1P3D", 1.0, 0)]
    assert [(e.tp, e.stage.tp) for e in moe] == [(3, 1)]  # one expert-parallel decode engine over 3 GPUs
    assert [e.tp for e in (slot.target for slot in slots(QUICK, "qwen3-30b-a3b", "colocated", 1.0, 0))] == [4]
    dense = [slot.target for slot in slots(QUICK, "qwen2.5-7b", "2P2D", 1.0, 0)]
    assert [(e.tp, e.stage.tp) for e in dense] == [(1, 2), (1, 2)]
