"""PD bench on a tiny step: the same episodes under colocated, 1P3D and 2P2D, dense and MoE."""

import argparse

from bench.pd import run


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
