"""`rollart k8s render`: the manifests that run an experiment on a Kubernetes cluster with KubeRay.

What they hold (validated offline by `engine/core/k8s_schema.py`; no API server is reached):
- a **RayCluster** (`ray.io/v1`): the head pod, where the run's driver, its control plane and the Mooncake
  master run (`network.host` is the pod's IP), and one worker group per pool, each pod offering the pool
  as a Ray resource as `rollart node start --pool` does on a machine; `gpu-*` pools ask for
  `nvidia.com/gpu` (up to 8 per pod), tolerate GPU taints and, with a `device` profile, select nodes
  labelled `rollart.io/device=<device>`. Ray's token authentication is on in every pod.
- a **Prefect worker**, a container in the head pod (a Ray driver needs its node's raylet beside it): it
  runs the deployments of `rollart deploy` against `PREFECT_API_URL`, each run joining the cluster there.
- a **Secret** with the tokens (Ray's, the Prefect API's auth string) and a **ConfigMap** with the
  experiment config in its resolved form.
- a **NetworkPolicy**: the cluster's pods take traffic only from each other (Mooncake and the Ray servers
  have no authentication of their own beyond Ray's token), plus the Prefect worker's egress to its API.
- with `backends.sandbox: kubernetes`, the sandbox pods' deny-all **NetworkPolicy** in their namespace
  (the backend also creates it when missing; here it exists before the first pod) and a pre-pull
  **DaemonSet** there, so every node has the sandbox image before the first sandbox pod needs it (the
  `warmup_sandboxes` probe pod pulls it on one node only).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import yaml

from engine.config import GPU_KINDS, ExperimentConfig, PoolConfig
from engine.core.resources import ray_resource
from infra.sandbox.k8s_objects import network_policy, prepull_daemonset

GPUS_PER_POD = 8  # a node's GPUs at most: a larger pool is several pods
APP_LABEL = "app.kubernetes.io/part-of"


def _names(cfg: ExperimentConfig) -> dict[str, str]:
    base = f"rollart-{cfg.name.lower().replace('_', '-').replace('.', '-')}"
    return {"cluster": base, "secret": f"{base}-tokens", "config": f"{base}-config", "policy": f"{base}-net"}


def _env(names: dict[str, str]) -> list[dict[str, Any]]:
    def secret(var: str, key: str) -> dict[str, Any]:
        return {"name": var, "valueFrom": {"secretKeyRef": {"name": names["secret"], "key": key}}}

    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        secret("RAY_AUTH_TOKEN", "ray-auth-token"),
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]


def _group(pool: PoolConfig, image: str, names: dict[str, str]) -> dict[str, Any]:
    """One worker group: pods that each offer `per_pod` units of the pool, `capacity` in all."""
    gpu = pool.kind in GPU_KINDS
    # GPU pods of equal size that add up to the pool exactly: the largest divisor of it that fits a node
    per_pod = max(d for d in range(1, min(pool.capacity, GPUS_PER_POD) + 1) if pool.capacity % d == 0)
    per_pod = per_pod if gpu else pool.capacity
    replicas = pool.capacity // per_pod
    limits: dict[str, str] = {"cpu": str(max(1, per_pod if not gpu else 2 * per_pod)), "memory": "16Gi"}
    if gpu:
        limits["nvidia.com/gpu"] = str(per_pod)
    params = {"resources": json.dumps(json.dumps({ray_resource(pool.name): per_pod}))}
    if gpu:
        params["num-gpus"] = str(per_pod)
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "ray-worker",
                "image": image,
                "env": _env(names),
                "resources": {"requests": dict(limits), "limits": dict(limits)},
            }
        ]
    }
    if pool.device:
        spec["nodeSelector"] = {"rollart.io/device": pool.device}
    if gpu:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "groupName": pool.name,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "rayStartParams": params,
        "template": {"metadata": {"labels": {APP_LABEL: names["cluster"]}}, "spec": spec},
    }


def _head(cfg: ExperimentConfig, image: str, names: dict[str, str], prefect_pool: str) -> dict[str, Any]:
    shared = [{"name": "ray-tmp", "mountPath": "/tmp/ray"}, {"name": "config", "mountPath": "/etc/rollart"}]
    env = _env(names)
    worker_env = [
        *env,
        {"name": "RAY_ADDRESS", "value": "127.0.0.1:6379"},
        {
            "name": "PREFECT_API_URL",
            "valueFrom": {"secretKeyRef": {"name": names["secret"], "key": "prefect-api-url"}},
        },
        {
            "name": "PREFECT_API_AUTH_STRING",
            "valueFrom": {"secretKeyRef": {"name": names["secret"], "key": "prefect-auth-string"}},
        },
    ]
    worker_command = ["prefect", "worker", "start", "--pool", prefect_pool, "--type", "process"]
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "127.0.0.1"},
        "template": {
            "metadata": {"labels": {APP_LABEL: names["cluster"]}},
            "spec": {
                "containers": [
                    {
                        "name": "ray-head",
                        "image": image,
                        "env": env,
                        "ports": [{"containerPort": 6379, "name": "gcs"}],
                        "volumeMounts": shared,
                        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                    },
                    {
                        "name": "prefect-worker",
                        "image": image,
                        "command": worker_command,
                        "env": worker_env,
                        "volumeMounts": shared,
                        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                    },
                ],
                "volumes": [
                    {"name": "ray-tmp", "emptyDir": {}},
                    {"name": "config", "configMap": {"name": names["config"]}},
                ],
            },
        },
    }


def _secret(names: dict[str, str], meta: dict[str, Any], prefect_api_url: str) -> dict[str, Any]:
    """The run's tokens (fresh ones: Ray's, the Prefect API's auth string) and the Prefect API's URL."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": names["secret"], **meta},
        "type": "Opaque",
        "stringData": {
            "ray-auth-token": secrets.token_hex(32),
            "prefect-auth-string": f"rollart:{secrets.token_urlsafe(32)}",
            "prefect-api-url": prefect_api_url,
        },
    }


def _cluster_policy(names: dict[str, str], meta: dict[str, Any]) -> dict[str, Any]:
    """The cluster's pods take traffic only from each other."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": names["policy"], **meta},
        "spec": {
            "podSelector": {"matchLabels": {APP_LABEL: names["cluster"]}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {APP_LABEL: names["cluster"]}}}]}],
        },
    }


def render(
    cfg: ExperimentConfig,
    *,
    image: str,
    namespace: str = "rollart",
    ray_version: str = "2.60.0",
    prefect_api_url: str = "http://prefect-server.prefect.svc:4200/api",
    prefect_pool: str = "rollart",
) -> list[dict[str, Any]]:
    """The manifests of `cfg` on Kubernetes (see the module docstring); fresh tokens on every call."""
    names = _names(cfg)
    meta = {"namespace": namespace, "labels": {APP_LABEL: names["cluster"]}}
    pools = [p for p in cfg.resources.pools if p.kind != "serverless" and p.capacity > 0]
    # in the head pod: services on the pod's IP, runs under the pod's data directory
    in_pod = {"run_root": "/data/runs", "network": cfg.network.model_copy(update={"host": "auto"})}
    config_yaml = cfg.model_copy(update=in_pod).to_yaml()
    sandbox = cfg.backends.kubernetes_sandbox
    return [
        _secret(names, meta, prefect_api_url),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": names["config"], **meta},
            "data": {"experiment.yaml": config_yaml},
        },
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": names["cluster"], **meta},
            "spec": {
                "rayVersion": ray_version,
                "headGroupSpec": _head(cfg, image, names, prefect_pool),
                "workerGroupSpecs": [_group(p, image, names) for p in pools],
            },
        },
        _cluster_policy(names, meta),
        *(
            [network_policy(sandbox.namespace), prepull_daemonset(sandbox.namespace, sandbox.image)]
            if sandbox
            else []
        ),
    ]


def write(manifests: list[dict[str, Any]], out: Path) -> list[Path]:
    """One YAML file per manifest in `out`, named by kind and name."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for m in manifests:
        path = out / f"{m['kind'].lower()}-{m['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(m, sort_keys=False))
        paths.append(path)
    return paths
