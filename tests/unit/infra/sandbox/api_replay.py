"""A stand-in Kubernetes API server on 127.0.0.1 for the sandbox backend's tests: no cluster runs here.

It answers each call from a script of replies in the API server's format (the JSON files of
tests/data/k8s/sandbox, written by hand after the API's objects and checked against the official
schemas; none was captured from a live cluster) and records every request: method, path, query, body.
A sandbox pod's random name is written `{pod}` in paths, and the replies' pod name becomes the one asked.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
from kubernetes_validate.utils import all_versions, major_minor, schema_contents
from referencing import Registry, Resource

from engine.core.k8s_schema import K8S_VERSION, problems

DATA = Path(__file__).resolve().parents[3] / "data" / "k8s" / "sandbox"
RECORDED_POD = "rollart-sandbox-5f0c2a9e1b7d"  # the pod name in the reply files
_POD = re.compile(r"rollart-sandbox-[0-9a-f]{12}")
NS = "sandbox"
POLICY = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
PODS = f"/api/v1/namespaces/{NS}/pods"
POD = f"{PODS}/{{pod}}"
LOG = f"{POD}/log"


def status_problems(status: dict[str, Any]) -> list[str]:
    """A `Status` reply against the official schema: kubernetes-validate files it under meta/v1, not
    under the `v1` its apiVersion names, so `problems` cannot find it by kind."""
    version = next(v for v in reversed(all_versions()) if major_minor(v) == K8S_VERSION)
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    schema = schema_contents(f"{folder}/status-meta-v1.json", K8S_VERSION)
    registry = (
        Resource.from_contents(schema_contents(f"{folder}/_definitions.json", K8S_VERSION)) @ Registry()
    )
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [f"Status: {'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(status)]


def recorded(name: str) -> dict[str, Any]:
    """A reply file, after checking it is what the API server would send (schema-valid, strict)."""
    body: dict[str, Any] = json.loads((DATA / name).read_text())
    found = status_problems(body) if body["kind"] == "Status" else problems(body)
    assert found == [], found
    return body


@dataclass
class Call:
    method: str
    path: str  # the pod's name written {pod}
    query: dict[str, list[str]]
    body: Any  # parsed JSON, or None
    pod: str | None  # the pod name the path held


Reply = tuple[int, dict[str, Any] | str]  # HTTP status, and a JSON object or a text/plain body


class ApiReplay:
    """Replies per "METHOD path": the first of each list is used once and dropped, the last repeats."""

    def __init__(self) -> None:
        self.replies: dict[str, list[Reply]] = {}
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, replies: dict[str, list[Reply]]) -> None:
        with self._lock:
            self.replies = {k: list(v) for k, v in replies.items()}

    def sequence(self) -> list[str]:
        return [f"{c.method} {c.path}" for c in self.calls]

    def answer(self, method: str, target: str, raw: bytes) -> tuple[int, bytes, str]:
        parts = urlsplit(target)
        pod = _POD.search(parts.path)
        call = Call(
            method,
            _POD.sub("{pod}", parts.path),
            parse_qs(parts.query),
            json.loads(raw) if raw else None,
            pod.group() if pod else None,
        )
        with self._lock:
            self.calls.append(call)
            queue = self.replies.get(f"{method} {call.path}")
            status, body = (queue.pop(0) if len(queue) > 1 else queue[0]) if queue else _UNSCRIPTED
        name = call.pod or (call.body or {}).get("metadata", {}).get("name") or RECORDED_POD
        if isinstance(body, str):
            return status, body.encode(), "text/plain"
        return status, json.dumps(body).replace(RECORDED_POD, name).encode(), "application/json"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


_UNSCRIPTED: Reply = (
    501,
    {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "unscripted call"},
)


def _handler(replay: ApiReplay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects

        def _reply(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body, kind = replay.answer(self.command, self.path, raw)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _reply

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def kubeconfig(folder: Path, server: str, context: str = "replay") -> Path:
    """A kubeconfig whose one context points at `server` with a bearer token."""
    path = folder / "kubeconfig"
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "replay", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": "replay-token"}}],
        "contexts": [{"name": context, "context": {"cluster": "replay", "user": "tester"}}],
        "current-context": context,
    }
    path.write_text(json.dumps(cfg))
    return path
