"""R1 on a tiny equal-cost fleet: the mixed fleet beats both single-type fleets under the roofline model."""

import argparse
import json

import pytest

from bench.affinity import fleet, run


def test_fleets_cost_the_same() -> None:
    assert fleet("h800", 4) == {"H800": 4}
    assert fleet("h20", 4) == {"H20": 8}
    assert fleet("mixed", 4) == {"H800": 2, "H20": 4}


def test_mixed_fleet_is_fastest_and_routes_by_affinity(tmp_path) -> None:
    out = tmp_path / "aff.json"
    args = argparse.Namespace(
        quick=False, json=str(out), budget=2, groups=4, swe_turns=(6, 10), swe_obs_tokens=1000,
        cot_tokens=(512, 2048),
    )  # fmt: skip
    payload = run(args)
    rows = {r["fleet"]: r for r in payload["rows"]}
    assert set(rows) == {"h800", "h20", "mixed"} and all(r["cost"] == 2.0 for r in rows.values())
    assert rows["mixed"]["step_s"] < 0.95 * min(rows["h800"]["step_s"], rows["h20"]["step_s"])
    assert rows["mixed"]["speedup_of_mixed"] == 1.0
    assert rows["h20"]["speedup_of_mixed"] == pytest.approx(rows["h20"]["step_s"] / rows["mixed"]["step_s"])
    # Mixed: every request found its preferred pool; single-type fleets serve the other profile as fallback.
    assert rows["mixed"]["fallbacks"] == 0 and rows["h800"]["fallbacks"] > 0 and rows["h20"]["fallbacks"] > 0
    assert len({r["requests"] for r in rows.values()}) == 1  # the same episodes on every fleet
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert (tmp_path / "aff.png").stat().st_size > 0
    assert "Paper (R1)" in payload["note"]


def test_budget_must_split_in_two() -> None:
    with pytest.raises(SystemExit, match="even number"):
        run(argparse.Namespace(quick=False, json=None, budget=3))
