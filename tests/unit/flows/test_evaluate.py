"""`rollart eval` of a checkpoint the experiment never saved: refused, naming the step, before anything
starts (no Ray, no actors)."""

import asyncio
from pathlib import Path

import pytest
import yaml

import flows.evaluate as evaluate

ROOT = Path(__file__).resolve().parents[3]


def test_a_checkpoint_never_saved_is_refused_before_any_start_up(tmp_path, monkeypatch):
    cfg = yaml.safe_load((ROOT / "configs" / "frozenlake.yaml").read_text())
    cfg.update(name="never-trained", run_root=str(tmp_path / "runs"))
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))

    def must_not_start(*_args, **_kwargs):
        raise AssertionError("the flow started provisioning for a checkpoint that does not exist")

    monkeypatch.setattr(evaluate, "provision_pools", must_not_start)
    with pytest.raises(FileNotFoundError, match="'never-trained' has no checkpoint at step 7"):
        asyncio.run(evaluate.evaluate_run.fn(str(path), checkpoint=7))
