"""The sandbox pod's program, run here as the pod would run it (its /tmp a test folder): the code gets its
stdin, its limits and a minimal environment, and its exit code is the container's. The pre-pull DaemonSet
is as hardened as a sandbox pod, and no sandbox label selects its pods."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.k8s_schema import problems
from infra.sandbox.k8s_objects import (
    MAX_ARG_BYTES,
    PAUSE_IMAGE,
    SANDBOX_LABEL,
    command,
    network_policy,
    pod,
    prepull_daemonset,
)

PROBE = """import json, os, resource, sys
print(json.dumps({
    "stdin": sys.stdin.read(),
    "files": sorted(os.listdir(".")),
    "env": sorted(os.environ),
    "cpu": resource.getrlimit(resource.RLIMIT_CPU),
    "as": resource.getrlimit(resource.RLIMIT_AS),
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
    "core": resource.getrlimit(resource.RLIMIT_CORE),
    "isolated": sys.flags.isolated,
}))
sys.exit(7)
"""


def run_as_the_pod(program: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    assert program[0] == "python3"
    return subprocess.run([sys.executable, *program[1:]], cwd=tmp, capture_output=True, text=True, timeout=60)


def test_the_pod_program_runs_the_code_on_its_stdin_within_its_limits(tmp_path: Path):
    limits = {"cpu_s": 3, "memory_bytes": 512 << 20, "tmp_bytes": 4 << 20}
    done = run_as_the_pod(command(PROBE, "é stdin\nline 2", **limits), tmp_path)
    assert done.returncode == 7, done.stderr
    seen = json.loads(done.stdout)
    assert seen["stdin"] == "é stdin\nline 2"
    assert seen["files"] == ["main.py"]  # the stdin file is unlinked once open
    # LC_CTYPE comes from Python's own C-locale coercion (PEP 538), where the C.UTF-8 locale exists
    assert set(seen["env"]) - {"LC_CTYPE"} == {"HOME", "PATH", "PYTHONDONTWRITEBYTECODE"}
    assert (seen["cpu"], seen["as"], seen["fsize"], seen["core"]) == (
        [3, 3],
        [512 << 20] * 2,
        [4 << 20] * 2,
        [0, 0],
    )
    assert seen["isolated"] == 1


def test_text_no_exec_argument_can_carry_is_refused():
    limits = {"cpu_s": 1, "memory_bytes": 1 << 28, "tmp_bytes": 1 << 20}
    with pytest.raises(ValueError, match="the code travels as an exec argument: no NUL"):
        command("print('\0')", "", **limits)
    with pytest.raises(ValueError, match=f"the stdin travels .* at most {MAX_ARG_BYTES} bytes"):
        command("print(1)", "x" * (MAX_ARG_BYTES + 1), **limits)
    assert command("pass", "x" * MAX_ARG_BYTES, **limits)[6] == "x" * MAX_ARG_BYTES


def test_the_pre_pull_daemonset_is_hardened_as_a_sandbox_pod_and_outside_the_sandbox_label():
    ds = prepull_daemonset("sbx", "registry.local/sandbox:7")
    assert problems(ds) == []
    assert ds["metadata"]["namespace"] == "sbx"
    template = ds["spec"]["template"]
    assert ds["spec"]["selector"]["matchLabels"] == template["metadata"]["labels"]
    labels = {**ds["metadata"]["labels"], **template["metadata"]["labels"]}
    assert SANDBOX_LABEL not in labels  # the deny-all policy and `kubectl delete pod -l` mean sandbox pods
    assert not set(labels) & set(network_policy("sbx")["spec"]["podSelector"]["matchLabels"])
    sandbox = pod("p", "sbx", image="i", cpu="1", memory="1Gi", program=["true"], deadline_s=1, tmp_bytes=1)
    spec = template["spec"]
    assert spec["securityContext"] == sandbox["spec"]["securityContext"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert "tolerations" not in spec and "nodeSelector" not in spec  # the nodes a sandbox pod can land on
    (init,) = spec["initContainers"]
    (pause,) = spec["containers"]
    assert (init["image"], init["command"]) == ("registry.local/sandbox:7", ["python3", "-c", "pass"])
    assert pause["image"] == PAUSE_IMAGE
    for c in (init, pause):
        assert c["securityContext"] == sandbox["spec"]["containers"][0]["securityContext"]
        assert c["resources"]["requests"] == c["resources"]["limits"]
        assert c["imagePullPolicy"] == "IfNotPresent"  # as the sandbox pod's, which then finds it pulled
