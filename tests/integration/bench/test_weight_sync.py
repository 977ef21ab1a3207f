"""`weight-sync` end to end: real buckets through a local Mooncake master and the Ray object store."""

import argparse
import json
import math

import pytest

from bench import weight_sync
from bench.weight_sync import layer_shapes


def test_weight_sync_pulls_every_version_through_both_stores(tmp_path):
    out = tmp_path / "ws.json"
    args = argparse.Namespace(
        quick=False,
        json=str(out),
        stores=("mooncake", "ray"),
        model_mb=(4,),
        bucket_mb=(1, 8),
        steps=2,
        window_s=0.3,
        seed=0,
    )
    payload = weight_sync.run(args)

    rows = payload["rows"]
    assert [(r["store"], r["bucket_mb"]) for r in rows] == [
        ("mooncake", 1),
        ("mooncake", 8),
        ("ray", 1),
        ("ray", 8),
    ]
    fp32_bytes = 4 * sum(math.prod(shape) for shape in layer_shapes(4 << 20))  # no padding: 64-byte multiples
    assert {r["bytes"] for r in rows} == {fp32_bytes}
    one_mib = [r["buckets"] for r in rows if r["bucket_mb"] == 1]
    assert one_mib[0] == one_mib[1] >= 3 and [r["buckets"] for r in rows if r["bucket_mb"] == 8] == [1, 1]
    for r in rows:
        assert r["push_s"] > 0 and r["pull_s"] > 0 and 0 <= r["exposed_pull_s"] <= r["pull_s"]
        assert r["hidden_fraction"] == pytest.approx(1 - r["exposed_pull_s"] / (r["push_s"] + r["pull_s"]))
        # 4 MiB move in milliseconds: a 0.3 s window hides nearly all of the pull
        assert r["hidden_fraction"] > 0.5
    assert all(len(steps) == 2 for steps in payload["steps"])
    assert "Ours: " in payload["note"] and "target >= 0.9" in payload["note"]
    assert json.loads(out.read_text()) == payload
    assert (tmp_path / "ws.png").stat().st_size > 0
