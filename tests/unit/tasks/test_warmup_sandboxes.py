"""The `warmup_sandboxes` task warms the configured sandbox first: bubblewrap reports its binary, a
Kubernetes sandbox without a reachable cluster fails the run there, in one line naming the kubeconfig."""

import shutil
import socket
from types import SimpleNamespace

import pytest

from engine.config import load_config
from infra.sandbox import SandboxUnavailable
from tasks.setup import warmup_sandboxes
from tests.unit.infra.sandbox.api_replay import kubeconfig

CODE = {"tasks": [{"env": "code"}]}


async def test_bwrap_reports_its_binary_and_the_code_envs_start():
    report = await warmup_sandboxes.fn(SimpleNamespace(cfg=load_config(data=CODE)))
    assert report["sandbox"] == {"backend": "bwrap", "bubblewrap": shutil.which("bwrap")}
    assert report["code"]["envs_started"] == 2


async def test_a_kubernetes_sandbox_without_a_cluster_fails_in_one_line_naming_the_kubeconfig(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the block ends
    path = kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    sandbox = f"backends.kubernetes_sandbox={{kubeconfig: {path}}}"
    cfg = load_config(data=CODE, overrides=["backends.sandbox=kubernetes", sandbox])
    with pytest.raises(SandboxUnavailable) as e:
        await warmup_sandboxes.fn(SimpleNamespace(cfg=cfg))
    message = str(e.value)
    assert "\n" not in message and "Connection refused" in message
    tried = f"no cluster reachable through kubeconfig {path} (its current context): "
    assert message.startswith(f"backends.sandbox: kubernetes: {tried}")
