"""Trajectory-level rollout on local Ray: vLLM worker actor, LLMProxy actor, rollout service actor."""

from pathlib import Path

import pytest
import ray

from engine.config import PoolConfig, RoleConfig
from engine.core.cluster import Cluster
from engine.core.resources import ResourceManager
from engine.models.tiny import init_model
from engine.rollout.env_manager import TurnLimits
from engine.rollout.gen_worker import GenerationWorker
from engine.rollout.proxy import GenSlot, LLMProxy
from engine.rollout.scheduler import TaskSpec
from engine.rollout.service import RolloutService
from infra.local_ray import init_local_ray
from infra.metadata import MetadataStore

ROOT = Path(__file__).resolve().parents[4]
TASKS = [
    TaskSpec("frozenlake", "frozenlake", {}, 1.0, 4, TurnLimits(6, 4, 512), "prefill-heavy"),
    TaskSpec(
        "arith",
        "reasoning_gym",
        {"dataset": "basic_arithmetic", "size": 100},
        1.0,
        4,
        TurnLimits(1, 8, 512),
        "decode-heavy",
    ),
]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollout")
    model = str(init_model("tiny", tmp / "model"))
    rm = ResourceManager(
        [PoolConfig(name="bw", kind="gpu-bandwidth", capacity=1)],
        MetadataStore(f"sqlite:///{tmp}/meta.db"),
        run="rollout-test",
    )
    init_local_ray(
        num_cpus=2,
        resources=rm.ray_resources,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    gen = Cluster(
        "gen",
        GenerationWorker,
        rm,
        RoleConfig(count=1, pool="bw"),
        max_concurrency=512,
        worker_config={
            "backend": {"kind": "vllm", "model_dir": model, "max_model_len": 512, "max_batch": 32},
            "run_id": "t",
        },
    )
    proxy = (
        ray.remote(LLMProxy)
        .options(max_concurrency=10_000)
        .remote([GenSlot(w.binding.worker, w.kind, w.actor, capacity=32) for w in gen.workers])
    )
    rollout = (
        ray.remote(RolloutService)
        .options(max_concurrency=10_000)
        # no trainer advances the version here: batch_groups=16 lets (0 + α + 1) · 16 groups start
        .remote(TASKS, model, proxy, "rollart", 1, 16, 2, 16, seed=0)
    )
    yield rollout, proxy
    ray.get(rollout.stop.remote())
    gen.shutdown()
    ray.shutdown()


def test_trajectories_stream_into_the_buffer_over_two_tasks(services):
    rollout, proxy = services
    ray.get(rollout.start.remote())
    groups = ray.get(rollout.get_batch.remote(1, 0, 300))  # the first complete group, whatever the task
    stats = ray.get(rollout.stats.remote())
    c = stats["counts"]
    in_flight = c["trajectories_started"] - sum(
        v for k, v in c.items() if k.startswith("trajectories_") and k != "trajectories_started"
    )
    assert len(groups) == 1 and groups[0].complete
    assert in_flight > 0  # a batch was served while other trajectories were still running
    finished = {t: s["finished"] for t, s in stats["tasks"].items()}
    while sum(finished.values()) < 64:
        ray.get(rollout.get_batch.remote(1, 0, 300))
        for t, s in ray.get(rollout.stats.remote())["tasks"].items():
            finished[t] = finished.get(t, 0) + s["finished"]
    assert sum(finished.values()) >= 64 and set(finished) == {"frozenlake", "arith"}
    summary = ray.get(proxy.summary.remote())
    assert summary["requests"] >= 64 and summary["sticky_hits"] > 0  # multi-turn requests stuck to a worker
    c = ray.get(rollout.stats.remote())["counts"]
    assert c.get("trajectories_aborted", 0) > 0  # redundant members were cancelled (r = 2)
