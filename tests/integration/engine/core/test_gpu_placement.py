"""GPU pools on a Ray cluster that has GPUs: each worker gets one GPU per unit, its own, and Ray's
CUDA_VISIBLE_DEVICES names them; a CPU-pool worker gets none and sees none. Ray accepts GPUs declared on a
machine that has none (`ray.init(num_gpus=N)`), so placement is checked here; torch then still finds no
CUDA device, and every worker runs on the CPU (the fallback)."""

import time

import pytest
import ray

from engine.config import PoolConfig, RoleConfig
from engine.core.cluster import Cluster, gpus_for
from engine.core.worker import Role, Worker
from tests.integration.engine.core.pools import pools_on_ray

POOLS = [
    PoolConfig(name="compute", kind="gpu-compute", capacity=2),
    PoolConfig(name="bandwidth", kind="gpu-bandwidth", capacity=1),
    PoolConfig(name="cpu", kind="cpu", capacity=2),
    PoolConfig(name="huge", kind="gpu-compute", capacity=4),  # more GPU units than the cluster's GPUs
    PoolConfig(name="shared", kind="gpu-compute", capacity=2),  # two roles colocated on one GPU
]


class Probe(Worker):
    role = Role.ACTOR_GEN


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    db = tmp_path_factory.mktemp("meta") / "metadata.db"
    with pools_on_ray(POOLS, db, "gpu-placement", num_gpus=3) as manager:  # 3: one per GPU-pool unit
        yield manager


def test_gpu_pool_workers_get_their_own_gpus_and_cpu_workers_none(rm):
    train = Cluster("train", Probe, rm, RoleConfig(count=1, pool="compute", units=2))
    gen = Cluster("gen", Probe, rm, RoleConfig(count=1, pool="bandwidth"))
    reward = Cluster("reward", Probe, rm, RoleConfig(count=1, pool="cpu"))
    try:
        (t,), (g,), (r,) = ([ray.get(w.actor.ping.remote()) for w in c.workers] for c in (train, gen, reward))
        assert len(t["gpus"]) == 2 and len(g["gpus"]) == 1 and r["gpus"] == []
        assert set(t["gpus"]).isdisjoint(g["gpus"])  # no GPU shared between the pools' workers
        assert sorted(t["cuda_visible_devices"].split(",")) == sorted(t["gpus"])
        assert g["cuda_visible_devices"] == g["gpus"][0]
        assert r["cuda_visible_devices"] == ""  # a worker given no GPU sees none (Worker hides them)
        assert {t["device"], g["device"], r["device"]} == {"cpu"}  # declared GPUs, no CUDA: the CPU
        assert (gpus_for("gpu-compute", 2, 3), gpus_for("gpu-bandwidth", 1, 3), gpus_for("cpu", 2, 3)) == (
            2,
            1,
            0,
        )
        assert gpus_for("gpu-compute", 2, 0) == 0  # no GPUs in the cluster: GPU pools are labels
        assert (
            gpus_for("gpu-compute", 1, 3, share=0.5) == 0.5 and gpus_for("gpu-compute", 1, 0, share=0.5) == 0
        )
    finally:
        for c in (train, gen, reward):
            c.shutdown()


def test_a_worker_needing_more_gpus_than_the_cluster_has_is_refused_naming_the_pool(rm):
    with pytest.raises(RuntimeError, match="pool huge: a worker needs 4 GPUs, the Ray cluster has 3"):
        Cluster("train", Probe, rm, RoleConfig(count=1, pool="huge", units=4))
    assert all(b.state == "released" for b in rm.store.bindings(rm.run) if b.pool == "huge")


def test_fractional_gpus_colocate_two_roles_on_one_gpu(rm):
    """`roles.*.gpus: 0.5` for the trainer and the generation workers: Ray packs both onto one GPU."""
    train = Cluster("train", Probe, rm, RoleConfig(count=1, pool="shared", gpus=0.5))
    gen = Cluster("gen", Probe, rm, RoleConfig(count=1, pool="shared", gpus=0.5))
    try:
        (t,), (g,) = ([ray.get(w.actor.ping.remote()) for w in c.workers] for c in (train, gen))
        assert len(t["gpus"]) == 1 and t["gpus"] == g["gpus"]  # the same GPU
        assert t["cuda_visible_devices"] == g["cuda_visible_devices"] == t["gpus"][0]
        # one of the three GPUs taken, by both (Ray's resource view is refreshed by the raylet's reports)
        deadline = time.monotonic() + 30
        while ray.available_resources().get("GPU", 0) != 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("GPU", 0) == 2
    finally:
        for c in (train, gen):
            c.shutdown()
