"""The Kubernetes objects of `backends.sandbox: kubernetes`, as plain manifests, and the kubeconfig it reads.

No `kubernetes` import: `rollart k8s render` and the driver use these without the client, and the tests
validate them offline against the official schemas (`engine/core/k8s_schema.py`).

A sandbox pod runs one program and stops: `restartPolicy: Never`, a server-side deadline, requests equal
to limits, no service-account token or service links, a fixed non-root uid without privilege escalation or
capabilities, the runtime's default seccomp profile, a read-only root filesystem and a size-capped,
memory-backed /tmp. "No network" is the deny-all `NetworkPolicy` (every ingress and egress) selecting
`SANDBOX_LABEL`; it holds only where the cluster's network plugin enforces NetworkPolicies.

The pre-pull `DaemonSet` (`rollart k8s render` writes it) puts the sandbox image on every node a sandbox
pod can land on before the first one starts, so a pod's start timeout is not spent pulling: an init
container of the image runs `python3 -c pass` (the image is pulled, and python3 is proven to be on its
PATH), then a `pause` container holds the pod (and so the image, against the kubelet's image garbage
collection) at 10 millicores and 16 MiB. Its pods carry `PREPULL_LABEL`, not `SANDBOX_LABEL`: the sandbox
reads and deletes its pods by name, but the deny-all policy's selector and the leftovers hint (`kubectl
delete pod -l rollart.io/sandbox`) must mean the sandbox pods only.
"""

from __future__ import annotations

import os
from typing import Any

SANDBOX_LABEL = "rollart.io/sandbox"
POLICY_NAME = "rollart-sandbox-deny-all"
POD_PREFIX = "rollart-sandbox-"
CONTAINER = "sandbox"
PREPULL_NAME = "rollart-image-prepull"  # not POD_PREFIX: its pods are no sandbox pods
PREPULL_LABEL = "rollart.io/sandbox-prepull"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
SANDBOX_UID = 65534  # nobody: the same uid in every image, owning nothing in it
MAX_ARG_BYTES = (128 << 10) - 1  # Linux's limit on one exec argument (MAX_ARG_STRLEN, its NUL included)

# Run in the pod as `python3 -I -S -c BOOT CODE STDIN CPU_S MEMORY_BYTES TMP_BYTES` (no shell, working
# directory the pod's /tmp): writes the code to main.py, puts STDIN on fd 0 (an unlinked file), lowers the
# hard CPU, address-space, file-size and core limits, then execs the program with a minimal environment
# (the variables Kubernetes injects, such as the API server's address, are gone).
BOOT = """import os, resource, sys
code, stdin, cpu, memory, fsize = sys.argv[1:]
for name, text in (("main.py", code), ("stdin", stdin)):
    with open(name, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
fd = os.open("stdin", os.O_RDONLY)
os.unlink("stdin")
os.dup2(fd, 0)
os.close(fd)
for limit, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (int(value), int(value)))
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.getcwd(), "PYTHONDONTWRITEBYTECODE": "1"}
os.execve(sys.executable, [sys.executable, "-I", "-S", "main.py"], env)
"""


def kubeconfig_path(configured: str | None) -> str:
    """The kubeconfig file(s) the client reads: `configured`, else $KUBECONFIG, else ~/.kube/config (a
    `:`-separated list as kubectl takes it), `~` expanded so that an error names the real path."""
    path = configured or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return os.pathsep.join(os.path.expanduser(p) for p in path.split(os.pathsep))


def command(code: str, stdin: str, *, cpu_s: int, memory_bytes: int, tmp_bytes: int) -> list[str]:
    """The container's command: `BOOT` with the program, its input and its limits as arguments.

    Raises ValueError for text no exec argument can carry (a NUL, or more than `MAX_ARG_BYTES`)."""
    for what, text in (("code", code), ("stdin", stdin)):
        if "\0" in text or len(text.encode(errors="surrogateescape")) > MAX_ARG_BYTES:
            raise ValueError(
                f"kubernetes sandbox: the {what} travels as an exec argument: no NUL, "
                f"at most {MAX_ARG_BYTES} bytes"
            )
    return ["python3", "-I", "-S", "-c", BOOT, code, stdin, str(cpu_s), str(memory_bytes), str(tmp_bytes)]


def _container_security() -> dict[str, Any]:
    """A container's hardening, shared by the sandbox and pre-pull pods so that neither is weaker."""
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_security() -> dict[str, Any]:
    """A pod's hardening: a fixed non-root uid and gid (`SANDBOX_UID`) and the runtime's seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": SANDBOX_UID,
        "runAsGroup": SANDBOX_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod(
    name: str,
    namespace: str,
    *,
    image: str,
    cpu: str,
    memory: str,
    program: list[str],
    deadline_s: int,
    tmp_bytes: int,
) -> dict[str, Any]:
    """One sandbox pod running `program` (from `command`), stopped by the kubelet after `deadline_s`."""
    resources = {"cpu": cpu, "memory": memory}
    container = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": program,
        "workingDir": "/tmp",
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {SANDBOX_LABEL: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": deadline_s,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": _pod_security(),
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": str(tmp_bytes)}}],
        },
    }


def network_policy(namespace: str) -> dict[str, Any]:
    """Deny every ingress and egress of the sandbox pods of `namespace` (DNS and the API server included)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": POLICY_NAME, "namespace": namespace, "labels": {SANDBOX_LABEL: "true"}},
        "spec": {
            "podSelector": {"matchLabels": {SANDBOX_LABEL: "true"}},
            "policyTypes": ["Ingress", "Egress"],
        },
    }


def prepull_daemonset(namespace: str, image: str) -> dict[str, Any]:
    """One pod per node of `namespace`'s cluster holding `image` pulled (see the module docstring).

    No tolerations and no node selector: the sandbox pods have none either, so the DaemonSet lands on
    exactly the nodes they can be scheduled on (tainted GPU nodes would only spend disk on the image).
    The init container's limits leave room for python3's start; the pause container's are what it uses.
    A fixed name: one sandbox namespace pre-pulls one image, that of the manifest applied last."""
    labels = {PREPULL_LABEL: "true"}

    def container(name: str, of: str, cpu: str, memory: str, **extra: Any) -> dict[str, Any]:
        resources = {"cpu": cpu, "memory": memory}
        return {
            "name": name,
            "image": of,
            "imagePullPolicy": "IfNotPresent",  # as the sandbox pods: they then find it on the node
            **extra,
            "resources": {"requests": dict(resources), "limits": dict(resources)},
            "securityContext": _container_security(),
        }

    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": PREPULL_NAME, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(),
                    "initContainers": [
                        container("pull", image, "100m", "64Mi", command=["python3", "-c", "pass"])
                    ],
                    "containers": [container("pause", PAUSE_IMAGE, "10m", "16Mi")],
                },
            },
        },
    }
