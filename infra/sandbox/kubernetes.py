"""`backends.sandbox: kubernetes`: untrusted Python in a short-lived pod, through the official client.

Each `run_python` creates one pod (`k8s_objects.pod`), polls it until it ends, reads its log and deletes
it (grace 0) on every path: a result, a timeout, an API error, an interrupt. The program gets
`start_timeout_s` to be scheduled and started (an image pull included), then `timeout_s` of running; the
pod's `activeDeadlineSeconds` is both together, so the kubelet stops it even if this process dies first.
CPU seconds, address space and file size are rlimits as under bubblewrap; the process count is the
cluster's pids limit, not `max_procs`. The kubelet keeps one log stream per container, so stderr is in
`stdout` and `stderr` is ""; output is cut at `max_output` when read, after the program ended (bubblewrap
stops it there), and reported as `killed_reason: "output"` all the same.

Warm-up ensures the deny-all NetworkPolicy and runs a probe pod to completion: the calls are allowed and
the image is pulled on that node (other nodes pull it on first use: no pre-pull DaemonSet here).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from infra.sandbox import k8s_objects as objects
from infra.sandbox.base import SandboxResult, SandboxUnavailable

_API_TIMEOUT_S = 30.0  # each API call, connecting included: an unreachable address fails, not hangs
_PROBE_TIMEOUT_S = 10.0
_PREFIX = "backends.sandbox: kubernetes:"
log = logging.getLogger(__name__)


class KubernetesSandbox:
    """Sandbox pods in `namespace` of the cluster `kubeconfig` (+ `context`) names; see the module doc.

    Raises SandboxUnavailable (one line naming the kubeconfig) when the file is missing or unusable; the
    cluster is first called by `warmup` or `run_python`, which raise the same way when it does not answer.
    """

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str = "rollart-sandbox",
        image: str = "python:3.12-slim",
        cpu: str = "1",
        memory: str = "512Mi",
        start_timeout_s: float = 60.0,
        poll_s: float = 0.2,
    ) -> None:
        self.kubeconfig = objects.kubeconfig_path(kubeconfig)
        self.context = context
        self.namespace, self.image, self.cpu, self.memory = namespace, image, cpu, memory
        self.start_timeout_s, self.poll_s = start_timeout_s, poll_s
        api = self._connect()
        self._client, self._core, self._net = api, client.CoreV1Api(api), client.NetworkingV1Api(api)
        self._policy_lock = threading.Lock()
        self._policy_ready = False

    def _unreachable(self, reason: str) -> SandboxUnavailable:
        where = f"context {self.context}" if self.context else "its current context"
        return SandboxUnavailable(
            f"{_PREFIX} no cluster reachable through kubeconfig {self.kubeconfig} ({where}): {_line(reason)}"
        )

    def _connect(self) -> client.ApiClient:
        if not any(os.path.isfile(p) for p in self.kubeconfig.split(os.pathsep)):
            raise self._unreachable("no such file")
        try:
            return config.new_client_from_config(
                config_file=self.kubeconfig, context=self.context, persist_config=False
            )
        except Exception as e:  # the loader raises what a bad file makes it hit: ConfigException, YAML, keys
            raise self._unreachable(f"{type(e).__name__}: {e}") from None

    @contextmanager
    def _call(self, what: str) -> Iterator[None]:
        """Turn the client's errors into one-line SandboxUnavailable: no answer, or the API's refusal."""
        try:
            yield
        except ApiException as e:
            raise SandboxUnavailable(
                f"{_PREFIX} {what} in namespace {self.namespace}: {e.status} {e.reason}: {_message(e)}"
            ) from None
        except urllib3.exceptions.HTTPError as e:
            raise self._unreachable(str(getattr(e, "reason", None) or e)) from None

    def _ensure_policy(self) -> str:
        """Create the deny-all NetworkPolicy if missing (once per object): "created" or "present"."""
        with self._policy_lock:
            if self._policy_ready:
                return "present"
            body = objects.network_policy(self.namespace)
            with self._call(f"reading NetworkPolicy {objects.POLICY_NAME}"):
                found = _unless_missing(
                    self._net.read_namespaced_network_policy,
                    objects.POLICY_NAME,
                    self.namespace,
                    _request_timeout=_API_TIMEOUT_S,
                )
            if found is None:
                with self._call(f"creating NetworkPolicy {objects.POLICY_NAME}"):
                    self._net.create_namespaced_network_policy(
                        self.namespace,
                        client.V1NetworkPolicy.model_validate(body),
                        _request_timeout=_API_TIMEOUT_S,
                    )
            elif self._client.sanitize_for_serialization(found.spec) != body["spec"]:
                raise SandboxUnavailable(
                    f"{_PREFIX} NetworkPolicy {self.namespace}/{objects.POLICY_NAME} exists but is not the "
                    f"deny-all policy of the sandbox pods ({json.dumps(body['spec'])}); delete it or fix it"
                )
            self._policy_ready = True
            return "created" if found is None else "present"

    def warmup(self) -> dict[str, Any]:
        """Ensure the NetworkPolicy and run a probe pod: a cluster that cannot run sandboxes fails here."""
        t0 = time.monotonic()
        policy = self._ensure_policy()
        probe = self.run_python("print('ok')", timeout_s=_PROBE_TIMEOUT_S)
        if probe.returncode != 0 or probe.stdout.strip() != "ok":
            raise SandboxUnavailable(
                f"{_PREFIX} the probe pod (image {self.image}) did not print ok: exit {probe.returncode}, "
                f"timed out {probe.timed_out}, output {_line(probe.stdout[-200:])!r}"
            )
        return {
            "backend": "kubernetes",
            "kubeconfig": self.kubeconfig,
            "namespace": self.namespace,
            "image": self.image,
            "network_policy": policy,
            "probe_s": round(time.monotonic() - t0, 2),
        }

    def run_python(
        self,
        code: str,
        stdin: str = "",
        *,
        timeout_s: float = 5.0,
        cpu_s: int = 5,
        memory_bytes: int = 256 << 20,
        max_output: int = 64 << 10,
        tmp_bytes: int = 16 << 20,
    ) -> SandboxResult:
        """Run `code` under `python -I -S` in a fresh pod, `stdin` on its standard input (see the module doc).

        Raises ValueError for code or stdin no exec argument can carry, SandboxUnavailable when the cluster
        does not answer, refuses a call, or the pod does not start in time; the pod is deleted either way.
        """
        program = objects.command(code, stdin, cpu_s=cpu_s, memory_bytes=memory_bytes, tmp_bytes=tmp_bytes)
        self._ensure_policy()
        name = f"{objects.POD_PREFIX}{uuid.uuid4().hex[:12]}"
        body = objects.pod(
            name,
            self.namespace,
            image=self.image,
            cpu=self.cpu,
            memory=self.memory,
            program=program,
            deadline_s=math.ceil(self.start_timeout_s + timeout_s),
            tmp_bytes=tmp_bytes,
        )
        start = time.monotonic()
        try:
            with self._call(f"creating pod {name}"):
                self._core.create_namespaced_pod(
                    self.namespace, client.V1Pod.model_validate(body), _request_timeout=_API_TIMEOUT_S
                )
            pod, timed_out = self._wait(name, timeout_s)
            out = self._log(name, max_output)
        except BaseException:
            self._delete(name, quiet=True)
            raise
        self._delete(name)
        over = len(out) > max_output
        return SandboxResult(
            returncode=None if timed_out or over else _exit_code(pod),
            stdout=out[:max_output].decode(errors="replace"),
            stderr="",
            timed_out=timed_out,
            killed_reason="timeout" if timed_out else "output" if over else None,
            wall_s=time.monotonic() - start,
        )

    def _wait(self, name: str, timeout_s: float) -> tuple[client.V1Pod, bool]:
        """Poll the pod until it ends: (the pod, whether it ran out of time). A pod whose container is not
        running within `start_timeout_s`, or that ended without it ever running, raises SandboxUnavailable."""
        start_by = time.monotonic() + self.start_timeout_s
        run_until: float | None = None
        while True:
            with self._call(f"reading pod {name}"):
                pod = self._core.read_namespaced_pod(name, self.namespace, _request_timeout=_API_TIMEOUT_S)
            started, now, status = _started(pod), time.monotonic(), _status(pod)
            if status.phase in ("Succeeded", "Failed"):
                if not started:
                    raise SandboxUnavailable(f"{_PREFIX} pod {name} ended before it ran: {_not_running(pod)}")
                return pod, status.reason == "DeadlineExceeded"
            if started and run_until is None:
                run_until = now + timeout_s
            if run_until is not None and now >= run_until:
                return pod, True
            if run_until is None and now >= start_by:
                raise SandboxUnavailable(
                    f"{_PREFIX} pod {name} not running after {self.start_timeout_s} s: {_not_running(pod)}"
                )
            time.sleep(self.poll_s)

    def _log(self, name: str, max_output: int) -> bytes:
        """The container's log (stdout and stderr merged), at most `max_output` + 1 bytes: one more tells
        a cut log from one exactly at the cap. Raw bytes: the program may print invalid UTF-8."""
        with self._call(f"reading the log of pod {name}"):
            response = self._core.read_namespaced_pod_log(
                name,
                self.namespace,
                container=objects.CONTAINER,
                limit_bytes=max_output + 1,
                _preload_content=False,
                _request_timeout=_API_TIMEOUT_S,
            )
        return bytes(cast(urllib3.HTTPResponse, response).data)  # not preloaded: the raw response

    def _delete(self, name: str, *, quiet: bool = False) -> None:
        """Delete the pod now (grace 0); one already gone is fine. `quiet`: another error is on its way out,
        so a failed delete is logged rather than raised over it (the pod stops at its deadline anyway)."""
        try:
            with self._call(f"deleting pod {name}"):
                _unless_missing(
                    self._core.delete_namespaced_pod,
                    name,
                    self.namespace,
                    grace_period_seconds=0,
                    _request_timeout=_API_TIMEOUT_S,
                )
        except SandboxUnavailable as e:
            if not quiet:
                raise
            log.warning("%s (remove leftovers: kubectl delete pod -l %s)", e, objects.SANDBOX_LABEL)


def _unless_missing(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)`, or None where the API answers 404 (no such object)."""
    try:
        return call(*args, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise
        return None


def _line(text: str) -> str:
    return " ".join(text.split())


def _message(e: ApiException) -> str:
    """The `message` of the API's Status reply, else its body, on one line."""
    try:
        return _line(str(json.loads(e.body or "")["message"]))
    except (ValueError, KeyError, TypeError):
        return _line(str(e.body or ""))[:300]


def _status(pod: client.V1Pod) -> client.V1PodStatus:
    return pod.status or client.V1PodStatus()


def _state(pod: client.V1Pod) -> client.V1ContainerState | None:
    statuses = _status(pod).container_statuses or []
    return statuses[0].state if statuses else None


def _started(pod: client.V1Pod) -> bool:
    state = _state(pod)
    return state is not None and (state.running is not None or state.terminated is not None)


def _exit_code(pod: client.V1Pod) -> int | None:
    state = _state(pod)
    return state.terminated.exit_code if state is not None and state.terminated is not None else None


def _not_running(pod: client.V1Pod) -> str:
    """Why the container is not running: its waiting reason, else an unmet pod condition, else the phase."""
    state = _state(pod)
    if state is not None and state.waiting is not None:
        return _line(f"{state.waiting.reason}: {state.waiting.message or ''}")
    status = _status(pod)
    unmet = [c for c in status.conditions or [] if c.status != "True" and c.reason]
    if unmet:
        return _line(f"{unmet[0].type} {unmet[0].reason}: {unmet[0].message or ''}")
    return f"phase {status.phase}, {status.reason or 'no reason given'}"
