"""End to end on local Ray: vLLM worker actor, torch trainer actor, Mooncake weight store, rollart mode;
and what such a run listens on beyond loopback."""

import asyncio
import os
import re
from pathlib import Path

import pytest
import ray

from engine.config import load_config
from engine.experiment import Experiment
from engine.weights.transfer import WeightPrefetcher
from tests.integration.listeners import Listener, sampled_listeners

ROOT = Path(__file__).resolve().parents[3]
# Mooncake 0.3.13's transfer engine listens on all interfaces whatever MC_TCP_BIND_ADDRESS says, on a port
# drawn from this range; pinned here so its listeners can be told from Ray's (the README says the same).
# Below Linux's ephemeral ports (32768-60999), where Ray's servers land.
MOONCAKE_PORTS = range(23000, 23200)
STEPS = 5


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Five rollart iterations of the frozenlake config (vLLM, Mooncake), the run's listeners sampled."""
    cfg = load_config(
        ROOT / "configs" / "frozenlake.yaml",
        [
            f"run_root={tmp_path_factory.mktemp('runs')}",
            f"train.steps={STEPS}",
            "model.pretrain_steps=0",
            "train.alpha=1",
            "train.mode=rollart",
            "train.batch_groups=2",
            "rollout.concurrency=16",
            "rollout.redundancy=1",
            "tasks.0.group_size=4",
            "tasks.0.max_turns=4",
            "backends.generation=vllm",
            "backends.weight_store=mooncake",
            "train.save_batches=true",
        ],
    )
    exp = Experiment(cfg)
    with pytest.MonkeyPatch.context() as env:
        # inherited by the raylet, so by every worker it starts
        env.setenv("MC_MIN_RPC_PORT", str(MOONCAKE_PORTS.start))
        env.setenv("MC_MAX_RPC_PORT", str(MOONCAKE_PORTS.stop - 1))
        yield from _sampled_run(exp)


def _sampled_run(exp: Experiment):
    try:
        with sampled_listeners(os.getpid()) as seen:
            exp.provision()
            exp.prepare_model()
            exp.start_weight_store()
            exp.start_actors()
            proto = exp.protocol()

            async def steps() -> list[dict]:
                await proto.start()
                return [await proto.step() for _ in range(STEPS)]

            metrics = asyncio.run(steps())
        gen = exp.clusters["gen"].workers[0].actor
        yield {
            "metrics": metrics,
            "trainer_version": ray.get(exp.trainer.version.remote()),
            "gen_version": ray.get(gen.version.remote()),
            "listeners": seen,
            "gcs": ray.get_runtime_context().gcs_address,
            "batches": exp.run_dir / "batches",
        }
    finally:
        exp.teardown()
        ray.shutdown()


def test_five_async_iterations_advance_versions_within_the_bound(run):
    metrics = run["metrics"]
    assert [m["version"] for m in metrics] == [1, 2, 3, 4, 5]
    assert all(m["trained_at_version"] - m["min_start_version"] <= 1 for m in metrics)  # the bound held
    assert run["trainer_version"] == 5
    assert run["gen_version"] == 4  # serving what the last batch was trained from
    synced = [m for m in metrics if "pull_s" in m]  # steps 2..5 pulled a new version from Mooncake
    assert len(synced) == 4 and all(m["weight_bytes"] > 1_000_000 for m in metrics)
    # the workers' update waited at most for what was left of the version's push (in the background since
    # the trainer's publish returned; reported by the same step's publish) and of its pull, and a last poll
    poll = WeightPrefetcher.POLL_S[1] + 1e-3
    assert all(m["exposed_pull_s"] <= m["push_s"] + m["pull_s"] + poll for m in synced)


def test_the_run_saves_what_each_step_trained_on(run):
    """train.save_batches in the product path: the train actor wrote every step's batch under the run
    directory, and the saved batches show the bound as the metrics do (each sample started at v ≥ n − 1)."""
    from engine.train.batch_log import load_batch, load_trainer_config

    saved = run["batches"]
    assert sorted(p.name for p in saved.glob("v*.pt")) == [f"v{v:05d}.pt" for v in range(STEPS)]
    for version, metrics in enumerate(run["metrics"]):
        batch = load_batch(saved / f"v{version:05d}.pt")
        assert len(batch) == 2 * 4  # batch_groups × group_size
        assert min(batch.start_version) == metrics["min_start_version"] >= version - 1
    assert load_trainer_config(saved).seed == 0


def _role(s: Listener) -> str:
    match = re.match(r"ray::(\w+)", s.process)
    return match.group(1) if match else s.process


def test_beyond_loopback_only_the_mooncake_transfer_engines_listen(run):
    """The run's process tree while it trains: Ray (GCS, raylet, workers, agents, metrics), the Mooncake
    master and its metadata server listen on loopback only. Mooncake's transfer engine in the generation
    and train workers cannot (no authentication either: the README says how to guard it); nothing else."""
    assert any(s.loopback and Path(s.process.split(" ")[0]).name == "gcs_server" for s in run["listeners"])
    open_ = [s for s in run["listeners"] if not s.loopback]
    unnamed = [str(s) for s in open_ if s.port not in MOONCAKE_PORTS]
    assert not unnamed, unnamed
    assert {_role(s) for s in open_} == {"GenerationWorker", "TrainWorker"}, [str(s) for s in open_]
    assert run["gcs"].startswith("127.0.0.1:")
