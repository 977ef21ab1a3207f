"""Serverless functions on Ray Serve: an HTTP endpoint per function that scales to zero when idle.

This is the local stand-in for a Lambda-style reward endpoint (paper §6.2): a stateless scorer — a rule,
a code runner, an LLM judge — is deployed once and called over HTTP by `infra.serverless.ServerlessClient`
with the same protocol (POST `{"args": [...], "kwargs": {...}}` → `{"result": ...}`, bearer token).

- `factory()` runs once per replica, when the replica starts: an expensive scorer (an LLM judge) loads its
  model there, not per call. With `min_replicas=0` no replica exists until the first request (a cold start)
  and the last one stops after `idle_s` without traffic, so an idle endpoint holds no CPU or memory.
- Only the SHA-256 digest of the token is shipped to the cluster (deployment arguments are stored by the
  Serve controller); replicas compare digests in constant time and answer 401 to a wrong or missing token.
- Status codes follow the client's retry rule: a malformed request is 400 and a bad token 401 (the caller's
  mistake, not retried); a scorer exception is 500 with its message (retried with backoff).
- Serve runs one HTTP proxy per cluster, on the head node; the first deployment starts it on `host`/`port`
  (default 127.0.0.1, a free port). Later deployments share it and must ask for the same address. The
  replicas run wherever their `ray_actor_options` place them; the proxy forwards to them across nodes.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from ray import serve
from ray.serve._private.common import ReplicaState
from ray.serve.context import _get_global_client
from starlette.requests import Request
from starlette.responses import JSONResponse

from infra.ports import free_port


def new_token() -> str:
    """A fresh bearer token (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _error(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class _Endpoint:
    """One replica: checks the token, decodes the call, runs the function built by `factory`."""

    def __init__(self, factory: Callable[[], Callable[..., Any]], token_digest: bytes) -> None:
        self._fn = factory()
        self._token_digest = token_digest

    def _authorised(self, request: Request) -> bool:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(_digest(presented), self._token_digest)

    async def __call__(self, request: Request) -> JSONResponse:
        if not self._authorised(request):
            return _error(401, "missing or wrong bearer token")
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            return _error(400, f"body is not JSON: {e}")
        args = body.get("args", []) if isinstance(body, dict) else None
        kwargs = body.get("kwargs", {}) if isinstance(body, dict) else None
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return _error(400, 'body must be {"args": [...], "kwargs": {...}}')
        try:
            result = self._fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return JSONResponse({"result": result})
        except Exception as e:  # the scorer's failure goes back to the caller, who retries 5xx
            return _error(500, f"{type(e).__name__}: {e}")


# Load reports to the autoscaler: the proxy and replicas push every `metrics_interval_s` (10 s by default).
# In Ray 2.60 the "scaled to zero, request queued" fast path sends the last *sampled* queue length (0), not
# the live one, so a cold call waited for the next periodic push: 11-12 s cold calls at the default. The
# field is deprecated in favour of environment variables that 2.60 does not read yet.
_METRICS_INTERVAL_S = 0.5


def serve_running() -> bool:
    """Whether Serve (its controller) runs on the connected Ray cluster."""
    return _get_global_client(raise_if_no_controller_running=False) is not None


def _http_address(host: str, port: int | None) -> tuple[str, int]:
    """Start Serve's HTTP proxy on host:port, or check that the running one listens there.

    Serve has no public call for the running proxy's address; `_get_global_client().http_config` is it.
    """
    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        # One proxy, on the head node: `host` is an address of the driver's machine (the head, where
        # `rollart train` runs), which a proxy on another node, where Serve would start one beside each
        # replica by default, could not bind.
        serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port or free_port(host)})
        client = _get_global_client()
    # ray types _get_global_client() as Optional; it raises instead when no controller runs
    config = client.http_config  # type: ignore[union-attr]
    if config.host != host or (port is not None and config.port != port):
        raise ValueError(
            f"Serve's HTTP proxy already listens on {config.host}:{config.port}; asked for {host}:{port} "
            "(one proxy per Ray cluster: deploy with the same host/port, or serve.shutdown() first)"
        )
    return config.host, config.port


def deploy_function(
    name: str,
    factory: Callable[[], Callable[..., Any]],
    *,
    token: str,
    route_prefix: str,
    min_replicas: int = 0,
    max_replicas: int = 2,
    idle_s: float = 10.0,
    host: str = "127.0.0.1",
    port: int | None = None,
    ray_actor_options: Mapping[str, Any] | None = None,
) -> str:
    """Deploy `factory()` as the Serve application `name` at `route_prefix`; return its URL.

    Needs a running Ray (`ray.init` by the caller). `factory` must be picklable (a module-level function or
    a `functools.partial` of one); the callable it returns gets the request's args/kwargs and returns a
    JSON-serialisable result. `idle_s`: seconds without traffic before a replica is stopped (also from 1 to
    0). `ray_actor_options` per replica, e.g. `{"num_cpus": 1}` or `{"num_gpus": 1}` for a judge model.
    The callable may be async; a slow sync one holds its replica's event loop for the whole call.
    """
    if not token:
        raise ValueError(f"deploy_function({name!r}): an empty token would let anyone call the endpoint")
    if not route_prefix.startswith("/"):
        raise ValueError(f"deploy_function({name!r}): route_prefix must start with '/', got {route_prefix!r}")
    host, port = _http_address(host, port)
    # ray types serve.deployment(x) as a decorator; given a class, it returns the Deployment
    deployment = serve.deployment(_Endpoint).options(  # type: ignore[attr-defined]
        name=name,
        ray_actor_options=dict(ray_actor_options or {"num_cpus": 1}),
        autoscaling_config={
            "min_replicas": min_replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": 1,
            "upscale_delay_s": 0.0,  # a second replica as soon as one has more than one call in flight
            "downscale_delay_s": idle_s,
            "metrics_interval_s": _METRICS_INTERVAL_S,
            # Load is averaged over this window: a finished burst keeps replicas up for it, then `idle_s`.
            "look_back_period_s": max(idle_s / 2, 2 * _METRICS_INTERVAL_S),
        },
    )
    serve.run(deployment.bind(factory, _digest(token)), name=name, route_prefix=route_prefix)
    return f"http://{host}:{port}{route_prefix}"


def undeploy(name: str) -> None:
    """Delete the application `name` and stop its replicas (waits until they are gone)."""
    serve.delete(name)


def replica_count(name: str) -> int:
    """Replicas of `name` that are running (serving or ready to); 0 once it has scaled to zero."""
    app = serve.status().applications.get(name)
    if app is None:
        raise KeyError(f"no Serve application named {name!r}")
    return sum(d.replica_states.get(ReplicaState.RUNNING, 0) for d in app.deployments.values())
