"""R1 on tiny equal-cost fleets: fleets per price ratio, the paired gain and its verdict, the sweep's JSON."""

import argparse
import json
from dataclasses import fields

import pytest

from bench.affinity import FULL, QUICK, fleet, fleet_cost, gain_cell, mfu_mbu, run


def test_fleets_follow_the_price_ratio() -> None:
    assert fleet("h800", 4, 0.5) == {"H800": 4}
    assert fleet("h20", 4, 0.5) == {"H20": 8}
    assert fleet("mixed", 4, 0.5) == {"H800": 2, "H20": 4}
    assert fleet("h800", 4, 0.3) == {"H800": 4}  # the H800 fleet does not depend on the ratio
    assert fleet("h20", 4, 0.3) == {"H20": 13} and fleet("mixed", 4, 0.3) == {"H800": 2, "H20": 7}
    assert fleet_cost({"H800": 2, "H20": 7}, 0.3) == pytest.approx(4.1)
    assert fleet_cost(fleet("h20", 4, 0.7), 0.7) == pytest.approx(4.2)  # 6 H20s: whole GPUs miss the budget
    with pytest.raises(SystemExit, match="without an H20"):
        fleet("mixed", 2, 5.0)


def test_efficiency_derates_the_named_peaks() -> None:
    assert mfu_mbu(0.5, "both") == (0.5, 0.5)
    assert mfu_mbu(0.5, "mfu") == (0.5, 1.0)
    assert mfu_mbu(0.75, "mbu") == (1.0, 0.75)


def test_gain_is_paired_per_seed_and_can_lose() -> None:
    singles = {"h800": [10.0, 11.0, 12.0], "h20": [12.0, 12.0, 11.0]}
    wins = gain_cell(singles | {"mixed": [8.0, 8.0, 8.0]}, singles | {"mixed": [9.0, 9.0, 9.0]})
    assert wins["gain"] == pytest.approx(11 / 8) and wins["verdict"] == "wins"  # per seed 10/8, 11/8, 11/8
    assert wins["ci_low"] == pytest.approx(10 / 8) and wins["ci_high"] == pytest.approx(11 / 8)
    assert wins["vs_h800"] == pytest.approx(11 / 8) and wins["vs_h20"] == pytest.approx(12 / 8)
    assert wins["gain_raw"] == pytest.approx(11 / 9)
    loses = gain_cell(singles | {"mixed": [13.0, 12.0, 12.0]}, singles | {"mixed": [13.0, 12.0, 12.0]})
    assert loses["gain"] < 1 and loses["ci_high"] < 1 and loses["verdict"] == "loses"
    tie = gain_cell(singles | {"mixed": [9.0, 11.0, 12.0]}, singles | {"mixed": [9.0, 11.0, 12.0]})
    assert tie["ci_low"] < 1 < tie["ci_high"] and tie["verdict"] == "tie"


def test_quick_is_the_same_workload_on_a_smaller_grid() -> None:
    grid = {"ratios", "efficiencies", "seeds"}
    assert all(getattr(QUICK, f.name) == getattr(FULL, f.name) for f in fields(FULL) if f.name not in grid)
    assert set(QUICK.ratios) < set(FULL.ratios) and set(QUICK.efficiencies) <= set(FULL.efficiencies)
    assert (QUICK.seeds, FULL.seeds) == (3, 5)


def test_sweep_rows_cells_and_json(tmp_path) -> None:
    out = tmp_path / "aff.json"
    args = argparse.Namespace(
        quick=False, json=str(out), budget=2, groups=4, swe_turns=(6, 10), swe_obs_tokens=1000,
        cot_tokens=(512, 2048), ratios=(0.5,), efficiencies=(0.5, 1.0), derate="mfu", seeds=2,
    )  # fmt: skip
    payload = run(args)
    assert payload["clock"] == "virtual" and payload["seeds"] == [0, 1]
    rows = {(r["efficiency"], r["fleet"]): r for r in payload["rows"]}
    assert len(rows) == 6 and all(
        r["cost"] == 2.0 and r["scaled_step_s"] == r["step_s"] for r in rows.values()
    )
    assert all(r["ci_low"] <= r["step_s"] <= r["ci_high"] for r in rows.values())
    for name in ("h800", "h20", "mixed"):  # half the FLOP/s slows every fleet
        assert rows[(0.5, name)]["step_s"] > rows[(1.0, name)]["step_s"]
    # Mixed: every request found its preferred pool; single-type fleets serve the other profile as fallback.
    assert rows[(1.0, "mixed")]["fallbacks"] == 0 and rows[(1.0, "h800")]["fallbacks"] > 0
    assert rows[(1.0, "h20")]["fallbacks"] > 0
    assert len({r["requests"] for r in rows.values()}) == 1  # the same episodes on every fleet
    cells = {c["efficiency"]: c for c in payload["cells"]}
    assert cells[1.0]["verdict"] == "wins" and cells[1.0]["gain"] == cells[1.0]["gain_raw"]
    assert cells[1.0]["gain"] == pytest.approx(
        min(rows[(1.0, "h800")]["step_s"], rows[(1.0, "h20")]["step_s"]) / rows[(1.0, "mixed")]["step_s"],
        rel=0.1,
    )
    assert cells[0.5]["vs_h20"] > cells[1.0]["vs_h20"]  # the compute-poor H20 suffers most from a low MFU
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert (tmp_path / "aff.png").stat().st_size > 0
    assert "Paper (R1" in payload["note"] and "Mixed beats both" in payload["note"]


def test_budget_and_efficiency_are_checked() -> None:
    with pytest.raises(SystemExit, match="even number"):
        run(argparse.Namespace(quick=False, json=None, budget=3))
    with pytest.raises(SystemExit, match="fractions of peak"):
        run(argparse.Namespace(quick=False, json=None, efficiencies=(0.5, 1.5)))
