from pathlib import Path

import pytest

from engine.config import load_config
from tasks.events import record_run_end

ROOT = Path(__file__).resolve().parents[3]


def test_failures_in_a_row_count_since_the_last_completed_run(tmp_path):
    cfg = load_config(ROOT / "configs" / "frozenlake.yaml", [f"run_root={tmp_path}", "name=ev"])
    cfg.run_dir.mkdir(parents=True)
    ends = [
        record_run_end(cfg, kind, f"{kind} run", flow_run_id=str(i))
        for i, kind in enumerate(["failed", "crashed", "completed", "failed"])
    ]
    assert [e.failures_in_a_row for e in ends] == [1, 2, 0, 1]
    assert {e.last_checkpoint for e in ends} == {None}  # nothing saved yet
    with pytest.raises(ValueError, match="a run ends completed, failed, crashed; got 'paused'"):
        record_run_end(cfg, "paused", "?", flow_run_id="9")
