"""`backends.sandbox: kubernetes` at the HTTP boundary: the official client's calls against a replaying
API server on loopback (tests/unit/infra/sandbox/api_replay.py). No Kubernetes cluster is used."""

from __future__ import annotations

import math
import socket
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.k8s_schema import problems
from infra.sandbox import SandboxUnavailable
from infra.sandbox import kubernetes as k8s
from infra.sandbox.k8s_objects import BOOT
from tests.unit.infra.sandbox.api_replay import (
    LOG,
    NS,
    POD,
    PODS,
    POLICY,
    ApiReplay,
    Reply,
    kubeconfig,
    recorded,
)

CREATE_POLICY: dict[str, list[Reply]] = {
    f"GET {POLICY}/rollart-sandbox-deny-all": [(404, recorded("networkpolicy-not-found.json"))]
}
CREATE_POLICY[f"POST {POLICY}"] = [(201, recorded("networkpolicy-created.json"))]
SETUP = [f"GET {POLICY}/rollart-sandbox-deny-all", f"POST {POLICY}", f"POST {PODS}"]


@pytest.fixture
def api() -> Iterator[ApiReplay]:
    server = ApiReplay()
    yield server
    server.close()


def sandbox(api: ApiReplay, folder: Path, start_timeout_s: float = 30.0) -> k8s.KubernetesSandbox:
    """A sandbox on the replaying server, polling every millisecond (the tests count calls, not time)."""
    path = str(kubeconfig(folder, api.url))
    return k8s.KubernetesSandbox(kubeconfig=path, namespace=NS, start_timeout_s=start_timeout_s, poll_s=0.001)


def script(api: ApiReplay, phases: list[str], log: str = "", **more: list) -> None:
    """The policy created, the pod created, then read through `phases` (reply files), its log, deleted."""
    api.script(
        {
            **CREATE_POLICY,
            f"POST {PODS}": [(201, recorded("pod-created.json"))],
            f"GET {POD}": [(200, recorded(f"pod-{p}.json")) for p in phases],
            f"GET {LOG}": [(200, log)],
            f"DELETE {POD}": [(200, recorded("pod-deleted.json"))],
            **more,
        }
    )


def test_a_run_creates_the_policy_then_a_pod_polls_it_reads_its_log_and_deletes_it(api, tmp_path):
    script(api, ["created", "running", "succeeded"], log="cba\n")
    box = sandbox(api, tmp_path)
    r = box.run_python("import sys\nprint(sys.stdin.read()[::-1])", "abc", timeout_s=20)
    assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.killed_reason) == (0, "cba\n", "", False, None)
    polls = [f"GET {POD}"] * 3
    assert api.sequence() == [*SETUP, *polls, f"GET {LOG}", f"DELETE {POD}"]
    pods = {c.pod for c in api.calls if c.pod}
    assert len(pods) == 1 and pods == {api.calls[2].body["metadata"]["name"]}
    log, delete = api.calls[-2], api.calls[-1]
    assert log.query == {"container": ["sandbox"], "limitBytes": [str((64 << 10) + 1)]}
    assert delete.query == {"gracePeriodSeconds": ["0"]}
    assert api.calls[0].body is None and problems(api.calls[1].body) == []
    api.calls.clear()
    box.run_python("print(1)")  # the policy is checked once per sandbox object
    assert api.sequence()[0] == f"POST {PODS}" and api.sequence()[-1] == f"DELETE {POD}"


def test_the_pod_is_locked_down_sized_and_deadlined_and_valid_against_the_pod_schema(api, tmp_path):
    script(api, ["succeeded"])
    box = sandbox(api, tmp_path, start_timeout_s=12.5)
    box.run_python("print(2)", "in", timeout_s=3.2, cpu_s=2, memory_bytes=128 << 20, tmp_bytes=8 << 20)
    body = api.calls[2].body
    assert problems(body) == []
    assert body["metadata"]["labels"] == {"rollart.io/sandbox": "true"}
    spec = body["spec"]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == math.ceil(12.5 + 3.2)
    assert (spec["automountServiceAccountToken"], spec["enableServiceLinks"]) == (False, False)
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    sized = {"cpu": "1", "memory": "512Mi"}
    assert container["resources"] == {"requests": sized, "limits": sized}
    limits = [str(2), str(128 << 20), str(8 << 20)]  # CPU seconds, address space, file size
    assert container["command"] == ["python3", "-I", "-S", "-c", BOOT, "print(2)", "in", *limits]
    assert "args" not in container and "env" not in container  # no shell, no variables
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": str(8 << 20)}}]
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    policy = api.calls[1].body
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"rollart.io/sandbox": "true"}},
        "policyTypes": ["Ingress", "Egress"],  # no rule of either kind: nothing in, nothing out
    }


def test_the_exit_code_comes_from_the_container_and_output_is_cut_at_max_output(api, tmp_path):
    script(api, ["failed-exit-3"], log="Traceback ...\nSystemExit: 3\n")
    box = sandbox(api, tmp_path)
    r = box.run_python("raise SystemExit(3)")
    assert (r.returncode, r.stdout, r.killed_reason) == (3, "Traceback ...\nSystemExit: 3\n", None)
    script(api, ["succeeded"], log="x" * 11)
    r = box.run_python("print('x' * 10)", max_output=10)
    assert (r.returncode, r.stdout, r.timed_out, r.killed_reason) == (None, "x" * 10, False, "output")
    assert api.calls[-2].query["limitBytes"] == ["11"]  # one byte past the cap tells a cut log


def test_a_pod_that_never_finishes_times_out_and_is_still_deleted(api, tmp_path):
    script(api, ["created", "running"], log="partial\n")
    r = sandbox(api, tmp_path).run_python("while True: pass", timeout_s=0.05)
    assert (r.returncode, r.stdout, r.timed_out, r.killed_reason) == (None, "partial\n", True, "timeout")
    seq = api.sequence()
    assert (
        seq[:3] == SETUP and set(seq[3:-2]) == {f"GET {POD}"} and seq[-2:] == [f"GET {LOG}", f"DELETE {POD}"]
    )


def test_a_pod_the_kubelet_stopped_at_its_deadline_counts_as_timed_out(api, tmp_path):
    script(api, ["running", "deadline-exceeded"])
    r = sandbox(api, tmp_path).run_python("while True: pass")
    assert (r.returncode, r.timed_out, r.killed_reason) == (None, True, "timeout")
    assert api.sequence()[-1] == f"DELETE {POD}"


def test_an_api_error_while_polling_still_deletes_the_pod_and_says_what_failed(api, tmp_path):
    script(api, ["created"])
    api.replies[f"GET {POD}"].append((500, recorded("pod-read-internal-error.json")))
    with pytest.raises(SandboxUnavailable) as e:
        sandbox(api, tmp_path).run_python("print(1)")
    pod = api.calls[2].body["metadata"]["name"]
    assert str(e.value) == (
        f"backends.sandbox: kubernetes: reading pod {pod} in namespace {NS}: 500 Internal Server Error: "
        "Internal error occurred: etcdserver: request timed out"
    )
    assert api.sequence() == [*SETUP, f"GET {POD}", f"GET {POD}", f"DELETE {POD}"]


def test_an_interrupt_while_polling_still_deletes_the_pod(api, tmp_path, monkeypatch):
    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    script(api, ["running"])
    box = sandbox(api, tmp_path)
    monkeypatch.setattr(k8s, "time", types.SimpleNamespace(monotonic=k8s.time.monotonic, sleep=interrupt))
    with pytest.raises(KeyboardInterrupt):
        box.run_python("while True: pass")
    assert api.sequence() == [*SETUP, f"GET {POD}", f"DELETE {POD}"]


def test_a_pod_that_cannot_start_fails_naming_why_and_is_deleted(api, tmp_path):
    script(api, ["image-pull-backoff"])
    with pytest.raises(SandboxUnavailable, match=r"not running after 0.05 s: ImagePullBackOff: Back-off"):
        sandbox(api, tmp_path, start_timeout_s=0.05).run_python("print(1)")
    assert api.sequence()[-1] == f"DELETE {POD}"


def test_a_policy_of_that_name_that_denies_less_is_refused_before_any_pod(api, tmp_path):
    api.script(
        {f"GET {POLICY}/rollart-sandbox-deny-all": [(200, recorded("networkpolicy-ingress-only.json"))]}
    )
    with pytest.raises(SandboxUnavailable, match="exists but is not the deny-all policy of the sandbox pods"):
        sandbox(api, tmp_path).warmup()
    assert api.sequence() == [f"GET {POLICY}/rollart-sandbox-deny-all"]


def test_warmup_ensures_the_policy_and_runs_a_probe_pod(api, tmp_path):
    script(api, ["created", "succeeded"], log="ok\n")
    report = sandbox(api, tmp_path).warmup()
    assert report["network_policy"] == "created" and report["namespace"] == NS
    assert api.calls[2].body["spec"]["containers"][0]["command"][5] == "print('ok')"
    assert api.sequence() == [*SETUP, f"GET {POD}", f"GET {POD}", f"GET {LOG}", f"DELETE {POD}"]


def test_a_probe_that_does_not_print_ok_fails_the_warmup(api, tmp_path):
    script(api, ["failed-exit-3"], log="python3: not found\n")
    with pytest.raises(
        SandboxUnavailable, match=r"the probe pod \(image python:3.12-slim\) did not print ok"
    ):
        sandbox(api, tmp_path).warmup()


def _one_line(e: pytest.ExceptionInfo[SandboxUnavailable]) -> str:
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_a_missing_kubeconfig_fails_in_one_line_naming_the_file_it_tried(tmp_path, monkeypatch):
    missing = tmp_path / "nope" / "config"
    with pytest.raises(SandboxUnavailable) as e:
        k8s.KubernetesSandbox(kubeconfig=str(missing), context="prod")
    assert _one_line(e) == (
        f"backends.sandbox: kubernetes: no cluster reachable through kubeconfig {missing} (context prod): "
        "no such file"
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "from-env"))
    with pytest.raises(
        SandboxUnavailable, match=f"kubeconfig {tmp_path / 'from-env'} \\(its current context"
    ):
        k8s.KubernetesSandbox()
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match=f"kubeconfig {tmp_path / '.kube' / 'config'} "):
        k8s.KubernetesSandbox()


def test_a_kubeconfig_without_the_context_fails_in_one_line(tmp_path):
    path = kubeconfig(tmp_path, "http://127.0.0.1:9")
    with pytest.raises(SandboxUnavailable) as e:
        k8s.KubernetesSandbox(kubeconfig=str(path), context="staging")
    assert _one_line(e).startswith(
        f"backends.sandbox: kubernetes: no cluster reachable through kubeconfig {path}"
    )
    assert "staging" in str(e.value)


def test_a_kubeconfig_pointing_at_a_closed_port_fails_in_one_line_naming_the_file(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    path = kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    box = k8s.KubernetesSandbox(kubeconfig=str(path), namespace=NS)  # reading the file needs no cluster
    with pytest.raises(SandboxUnavailable) as e:
        box.warmup()
    message = _one_line(e)
    tried = f"no cluster reachable through kubeconfig {path} (its current context): "
    assert message.startswith(f"backends.sandbox: kubernetes: {tried}")
    assert f"port={port}" in message and "Connection refused" in message
