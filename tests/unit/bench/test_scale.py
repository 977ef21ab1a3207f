"""The control-plane scale benchmark on a tiny grid (wall clock: assertions that load cannot break)."""

import argparse

import pytest

from bench.scale import add_arguments, run


def test_overhead_and_efficiency_are_measured_per_concurrency(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "scale.json"), concurrency=(16, 64), turns=2, env_s=1.0, unit_ms=20.0
    )
    payload = run(args)
    small, big = payload["rows"]
    assert (small["concurrency"], big["concurrency"]) == (16, 64)
    assert (small["requests"], big["requests"]) == (32, 128)
    for r in (small, big):
        assert r["overhead_ms_per_request"] > 0  # CPU time of the control plane, per request
        assert 0 < r["efficiency"] <= 1.02  # nothing beats sleeping exactly the modelled times
        assert r["ideal_s"] >= 3 * 1.0 * 0.02  # 3 env sleeps of 1 modelled s = 20 ms
        assert r["step_wall_s"] >= r["ideal_s"] * 0.98
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_concurrency_must_fill_whole_groups(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--concurrency", "128,100"])
    assert "multiple of 8" in capsys.readouterr().err
