"""`rollart replay` end to end: a config's model trained again on saved batches, scored by vLLM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from engine.train.batch import build_train_batch
from engine.train.batch_log import save_batch
from engine.train.trainer import TrainerConfig
from engine.types import Group
from flows.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_replay_scores_each_schedule_beside_the_untrained_model_and_the_constant_answer(
    tmp_path: Path, make_group: Callable[..., Group]
) -> None:
    saved = tmp_path / "run-a"
    for version in range(3):
        group = make_group(
            [(0.0, [([10, 11], [20, 21], [-1.0, -1.0], 0)]), (1.0, [([10, 11], [30, 31], [-2.0, -2.0], 0)])]
        )
        save_batch(saved, version, build_train_batch([group]), TrainerConfig(lr=1e-3))
    out = tmp_path / "replay.json"
    argv = ["replay", str(ROOT / "configs" / "frozenlake.yaml"), "--set", "model.pretrain_steps=0"]
    argv += ["--batches", f"a={saved}", "--schedule", "a:1-3", "--schedule", "a:1,a:1-2"]
    assert main([*argv, "--score-every", "2", "--eval-problems", "4", "--json", str(out)]) == 0

    payload = json.loads(out.read_text())
    assert [(r["schedule"], r["batch"]) for r in payload["rows"]] == [
        ("a:1-3", "a:1"), ("a:1-3", "a:2"), ("a:1-3", "a:3"),
        ("a:1,a:1-2", "a:1"), ("a:1,a:1-2", "a:1"), ("a:1,a:1-2", "a:2"),
    ]  # fmt: skip
    first, again = payload["rows"][0], payload["rows"][3]
    assert first["loss"] == again["loss"]  # both from the config's untrained weights, a new optimiser
    assert payload["rows"][4]["loss"] != first["loss"]  # a:1 once more, on the weights it moved
    scored = [(r["step"], r["held_out"] is not None) for r in payload["rows"]]
    assert scored == [(1, False), (2, True), (3, True)] * 2
    assert [sorted(c["held_out"]) for c in payload["curves"]] == [["2", "3"], ["2", "3"]]
    scores = [
        payload["before"],
        payload["baseline"],
        *(r["held_out"] for r in payload["rows"] if r["held_out"] is not None),
    ]
    assert all(0.0 <= x <= 1.0 for x in scores)
    assert Path(payload["png"]).is_file() and payload["config"]["batches"] == {"a": str(saved)}
