"""`rollart replay`'s library: schedules of saved batches, refused by item, trained on a fresh model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench.replay import replay, schedule, sources, trainer_config
from engine.models.tiny import init_model
from engine.train.batch import build_train_batch
from engine.train.batch_log import save_batch
from engine.train.trainer import TorchTrainer, TrainerConfig
from engine.types import Group

TURN = ([10, 11, 12], [20, 21], [-1.0, -1.5], 0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(init_model("tiny", tmp_path_factory.mktemp("replay") / "tiny"))


def saved_run(directory: Path, make_group: Callable[..., Group], tokens: list[int], lr: float = 1e-3) -> Path:
    """Three batches, as `train.save_batches` writes them, each rewarding the second reply."""
    for version in range(3):
        reply = [t + version for t in tokens]
        group = make_group([(0.0, [TURN]), (1.0, [([10, 11, 12], reply, [-2.0] * len(reply), version)])])
        save_batch(directory, version, build_train_batch([group]), TrainerConfig(lr=lr))
    return directory


@pytest.fixture
def runs(tmp_path: Path, make_group: Callable[..., Group]) -> dict[str, Path]:
    a = saved_run(tmp_path / "a", make_group, [30, 31])
    b = saved_run(tmp_path / "b", make_group, [40, 41, 42])
    return sources([f"a={a}", f"b={b}"])


def test_a_schedule_trains_the_named_batches_in_its_order(
    model_dir: str, runs: dict[str, Path], tmp_path: Path
):
    """A run's own batches in order train as the run's trainer did (the same losses, step for step); a
    mixed schedule takes each batch where it says; the weights are saved at every scored step."""
    from engine.train.batch_log import load_batch

    direct = TorchTrainer(model_dir, trainer_config([("a", 1)], runs))
    want = [direct.train_step(load_batch(runs["a"] / f"v{v:05d}.pt"))["loss"] for v in range(3)]
    log, saved = replay(model_dir, schedule("a:1-3", runs), runs, 2, tmp_path / "own")
    assert [r["batch"] for r in log] == ["a:1", "a:2", "a:3"]
    assert [r["loss"] for r in log] == pytest.approx(want, abs=1e-6)
    assert sorted(saved) == [2, 3] and all((Path(p) / "config.json").is_file() for p in saved.values())

    order = schedule("a:1, b:2-3,a:1", runs)
    assert order == [("a", 1), ("b", 2), ("b", 3), ("a", 1)]
    mixed, _ = replay(model_dir, order, runs, 10, tmp_path / "mixed")
    assert mixed[0]["loss"] == pytest.approx(want[0], abs=1e-6)  # the same first batch, the same weights
    assert mixed[1]["loss"] != pytest.approx(log[1]["loss"], abs=1e-4)  # b's second batch, not a's


def test_bad_sources_and_schedules_are_refused_naming_the_item(
    runs: dict[str, Path], tmp_path: Path, make_group: Callable[..., Group]
):
    refused = {
        "a:0": "1 <= K <= L",
        "a:3-1": "1 <= K <= L",
        "a:x": "1 <= K <= L",
        "a:4": "saved no batch for step 4",
        "c:1": "names no --batches run",
    }
    for text, message in refused.items():
        with pytest.raises(ValueError, match=message):
            schedule(text, runs)
    with pytest.raises(ValueError, match="NAME=DIR"):
        sources([str(runs["a"])])
    with pytest.raises(ValueError, match="named twice"):
        sources([f"a={runs['a']}", f"a={runs['b']}"])
    with pytest.raises(ValueError, match=r"no trainer\.json"):
        sources([f"a={tmp_path}"])
    other = sources([f"fast={saved_run(tmp_path / 'fast', make_group, [30, 31], lr=2e-3)}"])
    with pytest.raises(ValueError, match=r"run 'fast' differs in \['lr'\]"):
        trainer_config([("a", 1), ("fast", 1)], runs | other)
