"""PD bench on a tiny step: the same episodes under colocated, 1P3D and 2P2D, dense and MoE."""

import argparse

from bench.pd import QUICK, run, slots


def test_pd_configs_move_prefill_to_the_stage_and_ship_kv(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "pd.json"), groups=2, swe_turns=(6, 10), swe_obs_tokens=1000,
        cot_tokens=(512, 2048),
    )  # fmt: skip
    payload = run(args)
    rows = {(r["model"], r["config"]): r for r in payload["rows"]}
    assert set(rows) == {(m, c) for m in ("dense", "moe") for c in ("colocated", "1P3D", "2P2D")}
    for model in ("dense", "moe"):
        colocated = rows[model, "colocated"]
        assert colocated["speedup"] == 1.0 and colocated["prefill_busy"] == colocated["kv_transfer_s"] == 0.0
        for config in ("1P3D", "2P2D"):
            r = rows[model, config]
            assert r["prefill_busy"] > 0 and r["kv_transfer_s"] > 0
            assert r["speedup"] == colocated["rollout_s"] / r["rollout_s"]
        # two prefill GPUs do the same prefill work in half the time: half the busy share, give or take
        assert rows[model, "2P2D"]["prefill_busy"] < 0.75 * rows[model, "1P3D"]["prefill_busy"]
    # the MoE's KV is 96 KiB a token against the dense model's 56 KiB: more to ship for the same prompts
    assert rows["moe", "1P3D"]["kv_transfer_s"] > 1.3 * rows["dense", "1P3D"]["kv_transfer_s"]
    assert (tmp_path / "pd.png").stat().st_size > 0 and "MoE 1.11–1.21x" in payload["note"]


def test_moe_engines_span_their_gpus_dense_ones_do_not() -> None:
    moe = [slot.target for slot in slots(QUICK, "qwen3-30b-a3b", "1P3D", 1.0)]
    assert [(e.tp, e.stage.tp) for e in moe] == [(3, 1)]  # one expert-parallel decode engine over 3 GPUs
    assert [e.tp for e in (slot.target for slot in slots(QUICK, "qwen3-30b-a3b", "colocated", 1.0))] == [4]
    dense = [slot.target for slot in slots(QUICK, "qwen2.5-7b", "2P2D", 1.0)]
    assert [(e.tp, e.stage.tp) for e in dense] == [(1, 2), (1, 2)]
