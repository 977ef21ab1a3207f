"""Serverless functions on a local Ray Serve: protocol, token, errors, loopback binding, scale to zero."""

import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil
import pytest
import ray
from ray import serve

from infra.local_ray import init_local_ray
from infra.serve import deploy_function, new_token, replica_count, undeploy
from infra.serverless import ServerlessClient, ServerlessError
from tests.services import COLD_CALL_S

ROOT = Path(__file__).resolve().parents[4]
# infra.serve sets the deprecated (but, in Ray 2.60, only working) metrics_interval_s; see its comment.
pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")
SMALL = {"num_cpus": 0.25}  # three endpoints side by side on a 2-CPU Ray
_factory_calls = 0  # per replica process: how often the factory ran there


def make_counter() -> Callable[..., dict]:
    """A scorer that reports which replica ran it, how often its factory ran there, and its call index."""
    global _factory_calls
    _factory_calls += 1
    calls = itertools.count(1)

    def counter(a: int, b: int = 0) -> dict:
        return {"sum": a + b, "pid": os.getpid(), "factory_calls": _factory_calls, "call": next(calls)}

    return counter


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def make_failing() -> Callable[..., float]:
    def fail(*args: object) -> float:
        raise RuntimeError("scorer exploded")

    return fail


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `predicate` until true; return the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"{what} not reached within {timeout_s}s")
        time.sleep(0.1)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def cluster():
    init_local_ray(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def counter(cluster):
    token = new_token()
    url = deploy_function(
        "counter", make_counter, token=token, route_prefix="/counter", idle_s=60, ray_actor_options=SMALL
    )
    yield url, token
    undeploy("counter")


def test_no_replica_before_the_first_call_then_one_that_built_the_scorer_once(counter):
    url, token = counter
    assert urlparse(url).hostname == "127.0.0.1" and urlparse(url).path == "/counter"
    assert replica_count("counter") == 0
    client = ServerlessClient(url, token)
    results = [client.call(i, b=10) for i in range(3)]
    assert [r["sum"] for r in results] == [10, 11, 12]
    assert [(r["factory_calls"], r["call"]) for r in results] == [(1, 1), (1, 2), (1, 3)]
    assert len({r["pid"] for r in results}) == 1 and replica_count("counter") == 1
    assert client.attempts == 3


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", "Basic {token}", "Bearer"])
def test_wrong_or_missing_token_is_401(counter, header):
    url, token = counter
    headers = {"Authorization": header.format(token=token)} if header else {}
    resp = httpx.post(url, json={"args": [1], "kwargs": {}}, headers=headers, timeout=COLD_CALL_S)
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
    assert resp.json() == {"error": "missing or wrong bearer token"}


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_client_with_a_bad_token_raises_without_retrying(counter, token):
    url, _ = counter
    client = ServerlessClient(url, token, retries=3)
    with pytest.raises(ServerlessError, match="HTTP 401"):
        client.call(1)
    assert client.attempts == 1


@pytest.mark.parametrize(
    ("body", "error"),
    [(b"{not json", "body is not JSON"), (b'{"args": 1}', "body must be"), (b"[1, 2]", "body must be")],
)
def test_malformed_call_is_400(counter, body, error):
    url, token = counter
    resp = httpx.post(url, content=body, headers={"Authorization": f"Bearer {token}"}, timeout=COLD_CALL_S)
    assert resp.status_code == 400 and resp.json()["error"].startswith(error)


def test_http_proxy_listens_on_loopback_only(counter):
    port = urlparse(counter[0]).port
    listening = [
        c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port
    ]
    assert listening == ["127.0.0.1"]


@pytest.mark.parametrize("address", [{"host": "0.0.0.0"}, {"port": 1}])
def test_a_deployment_cannot_move_the_shared_proxy(counter, address):
    with pytest.raises(ValueError, match=r"already listens on 127\.0\.0\.1"):
        deploy_function("elsewhere", make_counter, token=new_token(), route_prefix="/elsewhere", **address)


@pytest.mark.parametrize(
    ("token", "prefix", "error"), [("", "/x", "empty token"), ("t", "x", "must start with '/'")]
)
def test_bad_deployment_arguments_are_refused(token, prefix, error):
    with pytest.raises(ValueError, match=error):
        deploy_function("bad", make_counter, token=token, route_prefix=prefix)


def test_scorer_exception_is_500_retried_by_the_client_then_raised(cluster):
    token = new_token()
    url = deploy_function(
        "failing", make_failing, token=token, route_prefix="/failing", idle_s=60, ray_actor_options=SMALL
    )
    auth = {"Authorization": f"Bearer {token}"}
    resp = httpx.post(url, json={"args": [], "kwargs": {}}, headers=auth, timeout=COLD_CALL_S)
    assert resp.status_code == 500 and resp.json() == {"error": "RuntimeError: scorer exploded"}
    client = ServerlessClient(url, token, retries=2, backoff_s=0.01)
    with pytest.raises(ServerlessError, match=r"failed after 3 attempts.*500"):
        client.call(1)
    assert client.attempts == 3
    undeploy("failing")
    with pytest.raises(KeyError, match="no Serve application named 'failing'"):
        replica_count("failing")
    assert httpx.post(url, json={"args": []}, headers=auth, timeout=COLD_CALL_S).status_code == 404


def test_scales_to_zero_when_idle_and_cold_starts_on_the_next_call(cluster):
    token = new_token()
    url = deploy_function(
        "idle", make_counter, token=token, route_prefix="/idle", idle_s=1, ray_actor_options=SMALL
    )
    client = ServerlessClient(url, token)
    assert replica_count("idle") == 0
    first = client.call(1)
    assert first["sum"] == 1 and replica_count("idle") == 1
    wait_until(lambda: replica_count("idle") == 0, timeout_s=20, what="scale to zero")
    # a replica counted out is still stopping and may answer one more call: wait for its process to end
    wait_until(lambda: _gone(first["pid"]), timeout_s=30, what="the idle replica's process ended")
    second = client.call(2)  # cold start: a new replica builds the scorer afresh
    # (under load the client may retry a first attempt that met the replica starting: `call` may be 2)
    assert second["sum"] == 2 and second["factory_calls"] == 1 and second["call"] >= 1
    assert second["pid"] != first["pid"] and replica_count("idle") == 1
    undeploy("idle")
