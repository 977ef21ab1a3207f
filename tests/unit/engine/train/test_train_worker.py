from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.models.tiny import init_model
from engine.train.train_worker import TrainWorker
from engine.types import Group
from engine.weights.transfer import WeightPrefetcher
from infra.weightstore import InMemoryStore

# token ids below the tiny model's vocabulary (1024); one two-token action per trajectory
TURN = ([10, 11, 12], [20, 21], [-3.0, -3.0], 0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(init_model("tiny", tmp_path_factory.mktemp("tw") / "tiny"))


def worker(
    model_dir: str,
    training: str = "torch",
    store: object = None,
    batches_dir: str | None = None,
    **trainer: object,
) -> TrainWorker:
    config = {"model_dir": model_dir, "run_id": "r", "trainer": trainer, "training": training, "store": store}
    return TrainWorker("train-0", 0, 1, "compute", "gpu-compute", {**config, "batches_dir": batches_dir})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_are_published_in_the_precision_every_process_computes_in(model_dir: str, dtype: str) -> None:
    """model.dtype bfloat16: the workers hold bfloat16 weights, so the trainer publishes them cast (half
    the bytes) and keeps its float32 master weights; otherwise float32 as trained."""
    import torch

    store = InMemoryStore()
    tw = worker(model_dir, store=store, dtype=dtype)
    pushed = tw.publish()
    pull = WeightPrefetcher(store, "r")
    pull.start(0)
    tensors, _ = pull.wait(0)
    pull.close()
    master = tw.state_dict()
    assert {t.dtype for t in master.values()} == {torch.float32}
    assert tensors.keys() == master.keys()
    want = getattr(torch, dtype)
    assert all(torch.equal(tensors[k], master[k].to(want)) for k in master)
    fp32_bytes = sum(t.numel() * 4 for t in master.values())
    assert pushed["bytes"] == pytest.approx(fp32_bytes * (0.5 if dtype == "bfloat16" else 1.0), rel=0.01)


def test_kl_beta_trains_against_the_frozen_starting_model(
    model_dir: str, make_group: Callable[..., Group]
) -> None:
    tw = worker(model_dir, lr=1e-2, kl_beta=0.1, clip_to="behaviour")  # small, steady steps away
    group = make_group([(1.0, [TURN]), (0.0, [([10, 11, 12], [30, 31], [-3.0, -3.0], 0)])])
    kls = [tw.train_step([group])["kl"] for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    assert 0 < kls[1] < kls[2]  # the policy moves away; the reference does not
    assert worker(model_dir).trainer.ref_model is None  # no reference model without the KL term


def test_groups_of_different_sizes_train_together(model_dir: str, make_group: Callable[..., Group]) -> None:
    tw = worker(model_dir, lr=1e-3)
    pair = make_group([(1.0, [TURN]), (0.0, [TURN])], group_id="pair")
    four = make_group([(1.0, [TURN]), (0.0, [TURN]), (0.0, [TURN]), (0.5, [TURN])], group_id="four")
    metrics = tw.train_step([pair, four])
    assert metrics["groups"] == 2 and metrics["trajectories"] == 6 and Path(model_dir).is_dir()


def test_the_megatron_backend_trains_saves_and_resumes_in_hf_names(
    model_dir: str, make_group: Callable[..., Group], tmp_path: Path
) -> None:
    """backends.training: megatron — same starting weights (hash over HF names) as the torch backend, a
    checkpoint that HF loads, and a resume that restores weights and optimiser exactly."""
    mega, plain = worker(model_dir, "megatron", lr=1e-3), worker(model_dir, lr=1e-3)
    assert type(mega.trainer.model).__name__ == "MegatronLM"
    assert mega.weights_sha256() == plain.weights_sha256()
    group = make_group([(1.0, [TURN]), (0.0, [([10, 11, 12], [30, 31], [-3.0, -3.0], 0)])])
    first = mega.train_step([group])
    assert first["version"] == 1 and first["grad_norm"] > 0
    path = mega.save(str(tmp_path / "ck"), {"step": 1})
    resumed = worker(model_dir, "megatron", lr=1e-3)
    assert resumed.load(path) == {"step": 1} and resumed.version() == 1
    assert resumed.weights_sha256() == mega.weights_sha256()
    assert resumed.train_step([group])["loss"] == pytest.approx(mega.train_step([group])["loss"], abs=1e-7)
    assert resumed.weights_sha256() == mega.weights_sha256()  # optimiser moments came back too
    with pytest.raises(ValueError, match="megatron parameter layout, this trainer's model has the hf one"):
        plain.load(path)


def test_an_unknown_training_backend_is_refused(model_dir: str) -> None:
    with pytest.raises(ValueError, match=r"(?s)training\n.*'torch' or 'megatron'.*input_value='jax'"):
        worker(model_dir, "jax")


def test_a_setting_the_worker_does_not_have_is_refused_by_name(model_dir: str) -> None:
    config = {"model_dir": model_dir, "run_id": "r", "bucket_bytes": 1 << 20}  # never read: refused
    with pytest.raises(ValueError, match=r"(?s)bucket_bytes\n.*Extra inputs are not permitted"):
        TrainWorker("train-0", 0, 1, "compute", "gpu-compute", config)


def _numbers(metrics: dict[str, float]) -> dict[str, float]:
    """A step's metrics without its timings (which no two processes share)."""
    return {k: v for k, v in metrics.items() if not k.endswith("_s") and "per_s" not in k}


def test_a_retired_worker_rebuilt_for_another_run_trains_as_a_new_one_would(
    model_dir: str, make_group: Callable[..., Group]
) -> None:
    """`retire` + `reinit` (engine/core/warm.py): the process of one run, after training with other
    settings, becomes the next run's trainer; its steps and weights are a new worker's, bit for bit."""
    other = ([10, 11, 12], [30, 31], [-3.0, -3.0], 0)
    group = make_group([(1.0, [TURN]), (0.0, [other])])
    run = {"model_dir": model_dir, "run_id": "b", "trainer": {"lr": 1e-2, "seed": 3}, "store": None}
    fresh = TrainWorker("train-0", 0, 1, "compute", "gpu-compute", run)
    want = [_numbers(fresh.train_step([group])) for _ in range(2)], fresh.weights_sha256()

    store = InMemoryStore()
    used = worker(model_dir, store=store, lr=1e-3, kl_beta=0.1)  # the last run: other settings, a store
    used.train_step([group])
    used.publish()
    assert used.retire() is True
    info = used.reinit("train-0", 0, 1, "compute", "gpu-compute", run)
    assert info["name"] == "train-0" and used.version() == 0 and used.publisher is None
    got = [_numbers(used.train_step([group])) for _ in range(2)], used.weights_sha256()
    assert got == want
    assert want[0][0]["loss"] != want[0][1]["loss"]  # the steps moved the weights: a real comparison


def test_saved_batches_train_again_as_they_trained(
    model_dir: str, make_group: Callable[..., Group], tmp_path: Path
) -> None:
    """train.save_batches: each step's batch and the trainer's config are saved; a fresh trainer built from
    them, on the same starting weights, scores the first batch exactly as the worker's first step did."""
    from engine.train.batch import build_train_batch
    from engine.train.batch_log import load_batch, load_trainer_config
    from engine.train.trainer import TorchTrainer

    saved = tmp_path / "batches"
    tw = worker(model_dir, batches_dir=str(saved), lr=1e-3)
    first = make_group([(1.0, [TURN]), (0.0, [([10, 11, 12], [30, 31], [-3.0, -3.0], 0)])])
    second = make_group([(0.0, [TURN]), (1.0, [([10, 11, 12], [40, 41], [-2.0, -2.0], 0)])], group_id="b")
    losses = [tw.train_step([g])["loss"] for g in (first, second)]
    assert sorted(p.name for p in saved.iterdir()) == ["trainer.json", "v00000.pt", "v00001.pt"]
    batch = load_batch(saved / "v00000.pt")
    built = build_train_batch([first], pad_token_id=tw.pad_id)
    assert batch.traj_ids == built.traj_ids and batch.versions == built.versions
    assert all(batch.advantages == built.advantages) and bool((batch.input_ids == built.input_ids).all())
    cfg = load_trainer_config(saved)
    assert cfg == tw.trainer.config and cfg.lr == 1e-3
    again = TorchTrainer(model_dir, cfg).train_step(batch)
    assert again["loss"] == pytest.approx(losses[0], abs=1e-6)
    assert load_batch(saved / "v00001.pt").rewards.tolist() == [0.0, 1.0]
