"""The paper's programming model in a training run: every role is a `Worker` the `Cluster` built where the
`ResourceManager` bound it, and generation is routed as `GenerationWorker.generate` declares
(`@hw_mapping(tag_name="profile")`): each task's requests go to the pool of its workload's kind.

Pools: `compute` (2 units: the trainer and one generation worker, which fell back there when `bandwidth`
was full), `bandwidth` (1 unit: the other generation worker), `cpu` pinned to core 0 (the environment
role: env loops, scheduler and sample buffer). Two tasks, one prefill-heavy and one decode-heavy.
"""

import os

import pytest
import ray

from engine.config import load_config
from engine.experiment import Experiment
from engine.rollout.ledger import unended
from tests.integration.runs import G, ray_for, start, steps, tiny_config


def config(tmp_path) -> dict:
    cfg = tiny_config(tmp_path, "roles", train={"steps": 2, "mode": "sync+"})
    cfg["tasks"] = [
        {**cfg["tasks"][0], "name": "p", "profile": "prefill-heavy"},
        {**cfg["tasks"][0], "name": "d", "profile": "decode-heavy"},
    ]
    cfg["resources"]["pools"] = [
        {"name": "compute", "kind": "gpu-compute", "capacity": 2},
        {"name": "bandwidth", "kind": "gpu-bandwidth", "capacity": 1},
        {"name": "cpu", "kind": "cpu", "capacity": 2, "cores": [0]},
    ]
    return cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = config(tmp_path_factory.mktemp("roles"))
    with ray_for(cfg):
        exp = Experiment(load_config(data=cfg))
        try:
            start(exp)
            placed = {
                "bindings": [(b.worker, b.role, b.pool, b.fallback) for b in exp.store.bindings(exp.run_id)],
                "rollout_cores": ray.get(
                    exp.rollout.__ray_call__.remote(lambda _: sorted(os.sched_getaffinity(0)))
                ),
                "gen_pools": [w.binding.pool for w in exp.clusters["gen"].workers],
            }
            metrics = steps(exp, 2)
            yield {
                **placed,
                "metrics": metrics,
                "proxy": ray.get(exp.proxy.summary.remote()),
                "stats": ray.get(exp.rollout.stats.remote()),
            }
        finally:
            exp.teardown()
            exp.store.close()


def test_every_role_is_a_cluster_worker_bound_to_its_pool(run):
    assert sorted(run["bindings"]) == [
        ("gen-0", "actor_gen", "bandwidth", False),
        ("gen-1", "actor_gen", "compute", True),
        ("rollout-0", "environment", "cpu", False),
        ("train-0", "actor_train", "compute", False),
    ]
    assert run["rollout_cores"] == [0]  # the environment pool's cores: the env loops run there only


def test_generation_goes_to_the_pool_its_task_profile_maps_to(run):
    proxy, by_pool = run["proxy"], dict(zip(run["gen_pools"], ("gen-0", "gen-1"), strict=True))
    routes = {(tag, pool): n for tag, pool, n in proxy["routes"]}
    # prefill-heavy -> gpu-compute, decode-heavy -> gpu-bandwidth; no worker was ever full (capacity 8 each,
    # 8 trajectories at most in flight), so nothing fell back
    assert set(routes) == {("prefill-heavy", "compute"), ("decode-heavy", "bandwidth")}
    assert all(n >= G for n in routes.values()) and proxy["fallbacks"] == 0
    # each trajectory's first request is routed, its later turns stick to the same worker; `requests`
    # counts answered ones: a trajectory the stop aborted had at most one request in flight
    sent, aborted = (
        sum(routes.values()) + proxy["sticky_hits"],
        run["stats"]["counts"].get("trajectories_aborted", 0),
    )
    assert proxy["requests"] <= sent <= proxy["requests"] + aborted
    assert proxy["per_worker"][by_pool["compute"]] > 0 and proxy["per_worker"][by_pool["bandwidth"]] > 0
    last = run["metrics"][-1]
    assert [m["version"] for m in run["metrics"]] == [1, 2] and last["groups"] == 2
    assert unended(run["stats"]["counts"]) == 0
