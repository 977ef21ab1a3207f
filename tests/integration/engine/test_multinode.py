"""A run that joins a multi-node Ray cluster through `RAY_ADDRESS`, as on machines that ran
`rollart node start`: here three raylets on this machine (`ray.cluster_utils`, every server on loopback),
each offering the pools `rollart node start --pool ...` declares (`engine/core/nodes.py`).

Asserted: a pool no node offers is refused before anything starts, naming it; each role's workers run
on the node offering its pool (the env loops too: the environment role) and the LLMProxy beside the
driver; the weights reach the generation nodes through Mooncake; a generation node lost mid-run is
survived: its worker is left out and counted, its requests are served by the other node, every step
trains whole groups.
"""

import asyncio
import contextlib
import os
import signal

import httpx
import pytest
import ray
from ray import serve
from ray._private import ray_constants
from ray.cluster_utils import Cluster

from engine.config import load_config
from engine.core.nodes import parse_pools
from engine.core.resources import ray_resource
from engine.experiment import Experiment
from engine.rollout.ledger import unended
from infra.serve import deploy_function, new_token
from tests.integration.runs import G, start, steps, tiny_config

POOLS = {"head": ["compute:1", "cpu:2"], "gen-a": ["bandwidth:1"], "gen-b": ["bandwidth:1"]}


@pytest.fixture(scope="module")
def cluster():
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # the nodes' servers on 127.0.0.1, not the machine's address
    c = Cluster()
    nodes = {}
    try:
        for name, pools in POOLS.items():
            nodes[name] = c.add_node(num_cpus=1, resources=parse_pools(pools), include_dashboard=False)
        c.wait_for_nodes()
        yield c, {name: n.node_id for name, n in nodes.items()}, nodes
    finally:
        ray.shutdown()
        c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = saved


def joined(c: Cluster, monkeypatch, tmp_path, name: str, **sections) -> Experiment:
    """A run of the test config (weights through Mooncake) that joins the cluster through RAY_ADDRESS."""
    monkeypatch.setenv("RAY_ADDRESS", c.address)
    cfg = tiny_config(tmp_path, name, **sections)
    cfg["backends"]["weight_store"] = "mooncake"
    return Experiment(load_config(data=cfg))


def test_a_pool_no_node_offers_is_refused_naming_it(cluster, tmp_path, monkeypatch):
    c, _, _ = cluster
    monkeypatch.setenv("RAY_ADDRESS", c.address)
    cfg = tiny_config(tmp_path, "lacking")
    cfg["resources"]["pools"][1]["capacity"] = 3  # bandwidth: the nodes offer 2
    exp = Experiment(load_config(data=cfg))
    try:
        with pytest.raises(ValueError, match=r"pool bandwidth: the cluster offers 2 of 3 units \(add a node"):
            exp.provision()
    finally:
        exp.release_ray()
        exp.store.close()


def test_roles_run_on_their_pools_nodes_and_weights_reach_them_through_mooncake(
    cluster, tmp_path, monkeypatch
):
    c, ids, _ = cluster
    exp = joined(c, monkeypatch, tmp_path, "multinode", train={"steps": 2})
    try:
        start(exp)
        where = {
            name: sorted(ray.get(w.actor.ping.remote())["node_id"] for w in cl.workers)
            for name, cl in exp.clusters.items()
        }
        # the environment role (env loops, scheduler) on the node of its pool, cpu, which the head offers
        gen = sorted([ids["gen-a"], ids["gen-b"]])
        assert where == {"train": [ids["head"]], "gen": gen, "rollout": [ids["head"]]}
        driver = ray.get_runtime_context().get_node_id()  # the LLMProxy runs beside the driver
        node_of = ray.get(exp.proxy.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))
        assert node_of == driver == ids["head"]
        metrics = steps(exp, 2)
        stats = ray.get(exp.rollout.stats.remote())
        assert [m["version"] for m in metrics] == [1, 2]
        assert all(m["groups"] == 2 and m["trajectories"] == 2 * G for m in metrics)  # whole groups only
        assert all(m["push_s"] > 0 and m["weight_bytes"] > 0 for m in metrics)  # published to Mooncake ...
        assert metrics[-1]["pull_s"] > 0  # ... and pulled on the generation nodes, which now serve v1
        assert [ray.get(w.actor.version.remote()) for w in exp.clusters["gen"].workers] == [1, 1]
        assert all(m["gen_workers_unavailable"] == 0 for m in metrics)
        assert unended(stats["counts"]) == 0 and stats["counts"]["trajectories_started"] > 0  # nothing lost
    finally:
        exp.teardown()


def test_a_generation_node_lost_mid_run_is_left_out_counted_and_nothing_is_lost(
    cluster, tmp_path, monkeypatch
):
    """gen-b's raylet dies (not gracefully) after step 1 while rollout goes on (rollart mode): its worker
    cannot be placed again (no other node offers its pool), so after `worker_restart_wait_s` the weight
    updates leave it out; its in-flight requests are retried on gen-a, and steps 2 and 3 train on v1 and
    v2 pulled through Mooncake by gen-a alone. The node is added back for the tests after this one."""
    c, ids, nodes = cluster
    exp = joined(c, monkeypatch, tmp_path, "nodekill", rollout={"worker_restart_wait_s": 5.0})
    try:
        start(exp)
        pings = {w.actor: ray.get(w.actor.ping.remote()) for w in exp.clusters["gen"].workers}
        survivor = next(a for a, p in pings.items() if p["node_id"] == ids["gen-a"])
        (lost_pid,) = (p["pid"] for p in pings.values() if p["node_id"] == ids["gen-b"])
        proto = exp.protocol()

        async def run() -> list[dict]:
            await proto.start()
            first = await proto.step()
            # the machine dies: its raylet and, with it, the worker process (which would otherwise go on
            # answering direct actor calls until it notices its raylet is gone)
            c.remove_node(nodes["gen-b"], allow_graceful=False)
            with contextlib.suppress(ProcessLookupError):
                os.kill(lost_pid, signal.SIGKILL)
            return [first] + [await proto.step() for _ in range(2)]

        metrics = asyncio.run(run())
        ray.get(exp.rollout.stop.remote())
        stats = ray.get(exp.rollout.stats.remote())
        proxy = ray.get(exp.proxy.summary.remote())
        survivor_version = ray.get(survivor.version.remote())
    finally:
        exp.teardown()
        nodes["gen-b"] = c.add_node(
            num_cpus=1, resources=parse_pools(POOLS["gen-b"]), include_dashboard=False
        )
        c.wait_for_nodes()
    assert [m["version"] for m in metrics] == [1, 2, 3]
    assert all(m["groups"] == 2 and m["trajectories"] == 2 * G for m in metrics)  # whole groups only
    assert all(m["staleness_max"] <= 1 for m in metrics)  # rollart's bound (alpha 1) through the loss
    assert [m["gen_workers_unavailable"] for m in metrics] == [0, 1, 1]  # counted from the step it was lost
    assert survivor_version == 2 and metrics[-1]["pull_s"] > 0  # pulled through Mooncake
    assert len(proxy["worker_failures"]) == 1  # the lost worker's requests failed over to the survivor
    assert unended(stats["counts"]) == 0 and stats["counts"]["trajectories_started"] > 0  # nothing lost


def _replica_node(*_args: object) -> str:
    return ray.get_runtime_context().get_node_id()


def _where():  # the endpoint's factory: its function answers with the node its replica runs on
    return _replica_node


def test_an_endpoint_on_another_node_is_served_through_the_heads_proxy_and_only_with_its_token(cluster):
    """A judge's replicas run on the reward role's pool, wherever its nodes are; Serve's one HTTP proxy
    runs on the head node at `network.host` (here 127.0.0.2), which other nodes' proxies could not bind."""
    c, ids, _ = cluster
    ray.shutdown()  # a driver an earlier run left connected: connect afresh, as a new driver does
    ray.init(address=c.address)
    try:
        token = new_token()
        url = deploy_function(
            "where",
            _where,
            token=token,
            route_prefix="/where",
            min_replicas=1,
            host="127.0.0.2",
            ray_actor_options={"num_cpus": 0, "resources": {ray_resource("bandwidth"): 1}},
        )
        answered = httpx.post(
            url, json={"args": [], "kwargs": {}}, headers={"Authorization": f"Bearer {token}"}
        )
        refused = [
            httpx.post(url, json={"args": [], "kwargs": {}}, headers=h).status_code
            for h in ({}, {"Authorization": "Bearer wrong"})
        ]
        proxies = dict(serve.status().proxies)  # node id -> the proxy's state
        pool = ray_resource("bandwidth")
        gen_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and pool in n["Resources"]}
    finally:
        serve.shutdown()
        ray.shutdown()
    # a generation node (gen-b was added back, under a new id, after the node-kill test), not the head
    assert answered.status_code == 200 and answered.json()["result"] in gen_nodes - {ids["head"]}
    assert refused == [401, 401]
    assert {node: str(state) for node, state in proxies.items()} == {ids["head"]: "ProxyStatus.HEALTHY"}
