"""End to end on local Ray: vLLM worker actor, torch trainer actor, Mooncake weight store, rollart mode."""

import asyncio
from pathlib import Path

import ray

from engine.config import load_config
from engine.experiment import Experiment

ROOT = Path(__file__).resolve().parents[3]


def test_five_async_iterations_advance_versions_within_the_bound(tmp_path):
    cfg = load_config(
        ROOT / "configs" / "frozenlake.yaml",
        [
            f"run_root={tmp_path}",
            "train.steps=5",
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
        ],
    )
    exp = Experiment(cfg)
    try:
        exp.provision()
        exp.prepare_model()
        exp.start_weight_store()
        exp.start_actors()
        proto = exp.protocol()

        async def run() -> list[dict]:
            await proto.start()
            return [await proto.step() for _ in range(5)]

        metrics = asyncio.run(run())
        assert [m["version"] for m in metrics] == [1, 2, 3, 4, 5]
        assert all(m["trained_at_version"] - m["min_start_version"] <= 1 for m in metrics)  # the bound held
        assert ray.get(exp.trainer.version.remote()) == 5
        gen = exp.clusters["gen"].workers[0].actor
        assert ray.get(gen.version.remote()) == 4  # serving what the last batch was trained from
        synced = [m for m in metrics if "pull_s" in m]  # steps 2..5 pulled a new version from Mooncake
        assert len(synced) == 4 and all(m["weight_bytes"] > 1_000_000 for m in metrics)
        assert all(m["exposed_pull_s"] <= m["pull_s"] + 1e-6 for m in synced)
    finally:
        exp.teardown()
        ray.shutdown()
