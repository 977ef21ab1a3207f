"""Worker / Cluster / decorators on a local Ray cluster with modelled pools (paper §5)."""

import asyncio
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import ray
from ray.exceptions import RayActorError

from engine.config import PoolConfig, RoleConfig
from engine.core.cluster import Cluster
from engine.core.decorators import hw_mapping, register, register_serverless
from engine.core.worker import Role, Worker
from infra.metadata import PoolsExhausted
from tests.integration.engine.core.pools import pools_on_ray
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[4]
POOLS = [
    PoolConfig(name="compute", kind="gpu-compute", capacity=2),
    PoolConfig(name="bandwidth", kind="gpu-bandwidth", capacity=1),
    PoolConfig(name="cpu", kind="cpu", capacity=2),
]


class GenWorker(Worker):
    role = Role.ACTOR_GEN

    @hw_mapping(tag_name="tag")
    def generate(self, x: int, tag: str, hold_s: float = 0.0) -> dict:
        time.sleep(hold_s)  # models a long generation that keeps this worker busy
        return {"x": x, "pool": self.pool, "kind": self.pool_kind, "rank": self.rank}

    @register
    def info(self) -> tuple[int, str]:
        return self.rank, self.pool

    @register_serverless(endpoint="judge")
    def judge(self, a: int, b: int) -> int:
        return a + b


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    with pools_on_ray(POOLS, tmp_path_factory.mktemp("meta") / "metadata.db", "cluster-test") as manager:
        yield manager


@pytest.fixture
def gen(rm):
    # 3 generation workers preferring the bandwidth pool (capacity 1): one lands there, two fall back.
    c = Cluster("gen", GenWorker, rm, RoleConfig(count=3, pool="bandwidth"), max_concurrency=1)
    yield c
    c.shutdown()


def test_bindings_fall_back_when_preferred_pool_is_full_and_rows_say_so(gen, rm):
    rows = {r.worker: r for r in rm.store.bindings(rm.run, state="active")}
    assert [(rows[f"gen-{i}"].pool, rows[f"gen-{i}"].fallback) for i in range(3)] == [
        ("bandwidth", False),
        ("compute", True),
        ("compute", True),
    ]
    assert all(r.preferred_pool == "bandwidth" and r.node for r in rows.values())
    assert rm.usage()["compute"] == (2, 2) and rm.usage()["bandwidth"] == (1, 1)
    # with every GPU pool full, a fourth worker is refused at once instead of stalling
    with pytest.raises(PoolsExhausted, match="free units: bandwidth 0, compute 0"):
        Cluster("more", GenWorker, rm, RoleConfig(count=1, pool="bandwidth"))


def test_hw_mapping_routes_by_tag(gen):
    decode = [gen.generate(i, tag="decode-heavy") for i in range(4)]
    prefill = [gen.generate(i, tag="prefill-heavy") for i in range(4)]
    assert {r["pool"] for r in decode} == {"bandwidth"}
    assert {r["pool"] for r in prefill} == {"compute"}
    assert {r["rank"] for r in prefill} == {1, 2}  # spread over both compute workers
    assert gen.generate(0, tag="gpu-bandwidth")["kind"] == "gpu-bandwidth"
    assert gen.routes == {"bandwidth": 5, "compute": 4} and gen.fallback_calls == 0
    with pytest.raises(TypeError, match="needs the keyword argument or request field 'tag'"):
        gen.generate(1)
    with pytest.raises(ValueError, match="unknown hardware tag 'tpu'"):
        gen.generate(1, tag="tpu")


async def test_hw_mapping_falls_back_to_compatible_worker_when_matching_one_is_busy(gen):
    busy = asyncio.ensure_future(gen.generate.aio(0, tag="decode-heavy", hold_s=1.5))
    await until(lambda: [w.kind for w in gen.workers if w.outstanding] == ["gpu-bandwidth"])  # it is busy
    second = await gen.generate.aio(1, tag="decode-heavy")
    assert second["kind"] == "gpu-compute" and gen.fallback_calls == 1
    assert (await busy)["pool"] == "bandwidth"


def test_register_gathers_from_all_workers(gen):
    assert gen.info() == [(0, "bandwidth"), (1, "compute"), (2, "compute")]


def test_ranks_take_every_register_call_in_lockstep_and_nothing_else(gen):
    """How a run calls its trainer: one handle; a `@register` method goes to every rank, rank 0 answers."""
    group = gen.ranks()
    assert ray.get(group.info.remote()) == (0, "bandwidth")
    with pytest.raises(AttributeError, match="generate is not a method every rank takes"):
        group.generate.remote(1, tag="decode-heavy")


def kill(actor) -> None:
    """ray.kill is asynchronous: return once the actor really is gone."""
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=5)
        except RayActorError:
            return
    raise AssertionError("actor still alive 30 s after ray.kill")


def test_dead_worker_is_rebound_and_calls_retry_on_the_replacement(gen, rm):
    kill(gen.workers[1].actor)  # the next prefill call goes to rank 1 (least used)
    assert gen.generate(7, tag="prefill-heavy") == {
        "x": 7,
        "pool": "compute",
        "kind": "gpu-compute",
        "rank": 1,
    }
    assert gen.restarts == 1 and gen.check() == 0  # the failed call already rebound it
    kill(gen.workers[0].actor)
    assert gen.check() == 1 and gen.restarts == 2  # found by the health check
    rows = rm.store.bindings(rm.run)
    for worker in ("gen-0", "gen-1"):
        dead = [r for r in rows if r.worker == worker and r.state == "dead"]
        new = [r for r in rows if r.worker == worker and r.state == "active"]
        assert len(dead) == 1 and len(new) == 1 and new[0].replaces == dead[0].id
        assert new[0].pool == dead[0].pool  # its units were freed, so it gets the same pool back
    assert gen.info() == [(0, "bandwidth"), (1, "compute"), (2, "compute")]


def test_shutdown_releases_every_binding(rm):
    c = Cluster("tmp", GenWorker, rm, RoleConfig(count=1, pool="cpu"))
    assert rm.usage()["cpu"] == (1, 2)
    c.shutdown()
    assert rm.usage()["cpu"] == (0, 2)
    assert {r.state for r in rm.store.bindings(rm.run) if r.worker == "tmp-0"} == {"released"}


def test_binding_rows_are_readable_live_from_another_process(gen, rm):
    code = (
        "import json,sys; from infra.metadata import MetadataStore; "
        "print(json.dumps([[r.worker, r.pool, r.state] for r in MetadataStore(sys.argv[1]).bindings("
        "sys.argv[2], state='active')]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, rm.store.url, rm.run],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert sorted(map(tuple, json.loads(out.stdout))) == [
        ("gen-0", "bandwidth", "active"),
        ("gen-1", "compute", "active"),
        ("gen-2", "compute", "active"),
    ]


class _Judge(BaseHTTPRequestHandler):
    calls: ClassVar[list[dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Judge.calls.append({"auth": self.headers.get("Authorization"), **body})
        out = json.dumps({"result": GenWorker.judge(None, *body["args"], **body["kwargs"])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


async def test_register_serverless_calls_a_real_http_endpoint(rm):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/judge"
    try:
        c = Cluster(
            "rew",
            GenWorker,
            rm,
            RoleConfig(count=1, pool="cpu"),
            serverless_urls={"judge": url},
            serverless_token="s3cret",
        )
        assert c.judge(2, 3) == 5
        assert await c.judge.aio(a=10, b=-4) == 6
        assert _Judge.calls == [
            {"auth": "Bearer s3cret", "args": [2, 3], "kwargs": {}},
            {"auth": "Bearer s3cret", "args": [], "kwargs": {"a": 10, "b": -4}},
        ]
        # the client a caller in another process holds: the same endpoint, the same token
        client = c.serverless_client("judge")
        assert client.url == url and client.headers == {"Authorization": "Bearer s3cret"}
        assert await client.acall(1, 1) == 2
        with pytest.raises(ValueError, match=r"rew: GenWorker\.generate is not a serverless method"):
            c.serverless_client("generate")
        c.shutdown()
    finally:
        server.shutdown()
