"""Offline validation of rendered manifests: no Kubernetes API server is reached.

- Core kinds (Secret, ConfigMap, NetworkPolicy, the sandbox's pre-pull DaemonSet, ...) against the official
  Kubernetes JSON schemas that `kubernetes-validate` ships, for `K8S_VERSION`, strict (an unknown field is
  an error; the pod template of a DaemonSet included).
- A RayCluster against `RAYCLUSTER`: a JSON schema written by hand from KubeRay's `ray.io/v1` API types
  (`ray-operator/apis/ray/v1/raycluster_types.go`: required fields, `rayStartParams` a map of strings, the
  replica counts integers). Its pod templates, most of the manifest, are checked as what they are — core
  `PodTemplateSpec`s — against the official schema, wrapped in a `PodTemplate`.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate

K8S_VERSION = "1.37"

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_TEMPLATE = {"type": "object", "required": ["spec"], "properties": {"metadata": {}, "spec": {}}}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
RAYCLUSTER: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["headGroupSpec"],
            "properties": {
                "rayVersion": {"type": "string"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "suspend": {"type": "boolean"},
                "headGroupSpec": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["rayStartParams", "template"],
                    "properties": {
                        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                        "enableIngress": {"type": "boolean"},
                        "rayStartParams": _STRINGS,
                        "template": _TEMPLATE,
                    },
                },
                "workerGroupSpecs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"],
                        "properties": {
                            "groupName": {"type": "string", "minLength": 1},
                            "replicas": _COUNT,
                            "minReplicas": _COUNT,
                            "maxReplicas": _COUNT,
                            "numOfHosts": _COUNT,
                            "rayStartParams": _STRINGS,
                            "template": _TEMPLATE,
                        },
                    },
                },
            },
        },
    },
}


def _templates(cluster: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = cluster["spec"]
    out = [("headGroupSpec", spec["headGroupSpec"]["template"])]
    out += [(f"workerGroupSpecs.{g['groupName']}", g["template"]) for g in spec.get("workerGroupSpecs", [])]
    return out


def problems(manifest: dict[str, Any]) -> list[str]:
    """What is wrong with one manifest, one line per problem (empty: valid)."""
    name = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
    if manifest.get("kind") != "RayCluster":
        try:
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            return [f"{name}: {'.'.join(map(str, e.path))}: {e.message}"]
        return []
    found = [
        f"{name}: {'.'.join(map(str, e.path))}: {e.message}"
        for e in jsonschema.Draft7Validator(RAYCLUSTER).iter_errors(manifest)
    ]
    if found:
        return found
    for where, template in _templates(manifest):
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        found += [f"{name}: spec.{where}.template: {p.split(': ', 1)[1]}" for p in problems(pod)]
    return found


def validate(manifests: list[dict[str, Any]]) -> None:
    """Raise ValueError listing every problem of every manifest."""
    found = [p for m in manifests for p in problems(m)]
    if found:
        raise ValueError("manifests do not validate (Kubernetes " + K8S_VERSION + "):\n" + "\n".join(found))
