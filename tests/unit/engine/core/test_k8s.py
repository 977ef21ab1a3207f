"""`rollart k8s render`: manifests of a run, validated offline (no Kubernetes API server runs here)."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from engine.config import ExperimentConfig, load_config
from engine.core.k8s import render
from engine.core.k8s_schema import problems, validate

ROOT = Path(__file__).resolve().parents[4]
GPU_POOLS = [
    "resources.pools=["
    "{name: compute, kind: gpu-compute, capacity: 12, device: H800},"
    "{name: bandwidth, kind: gpu-bandwidth, capacity: 7, device: H20},"
    "{name: cpu, kind: cpu, capacity: 16},"
    "{name: serverless, kind: serverless, capacity: 4}]"
]


def by_kind(manifests: list[dict]) -> dict[str, dict]:
    return {m["kind"]: m for m in manifests}


@pytest.mark.parametrize("name", ["quickstart", "frozenlake"])
def test_every_manifest_of_a_shipped_config_validates(name):
    manifests = render(load_config(ROOT / "configs" / f"{name}.yaml"), image="registry.local/rollart:1")
    assert [m["kind"] for m in manifests] == ["Secret", "ConfigMap", "RayCluster", "NetworkPolicy"]
    assert all(problems(m) == [] for m in manifests)


def test_each_pool_is_a_worker_group_offering_exactly_its_units_with_gpus_and_node_selection():
    cluster = by_kind(render(load_config(ROOT / "configs/quickstart.yaml", GPU_POOLS), image="i"))[
        "RayCluster"
    ]
    validate([cluster])
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"compute", "bandwidth", "cpu"}  # serverless is Serve's, on the reward pool
    offered = {}
    for name, g in groups.items():
        (units,) = json.loads(json.loads(g["rayStartParams"]["resources"])).values()
        offered[name] = (g["replicas"], units)
        assert g["minReplicas"] == g["maxReplicas"] == g["replicas"]
    assert offered == {"compute": (2, 6), "bandwidth": (1, 7), "cpu": (1, 16)}  # 12 = 2 x 6, nodes of <= 8
    compute = groups["compute"]["template"]["spec"]
    assert compute["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "6"
    assert groups["compute"]["rayStartParams"]["num-gpus"] == "6"
    assert compute["nodeSelector"] == {"rollart.io/device": "H800"} and compute["tolerations"][0]["key"] == (
        "nvidia.com/gpu"
    )
    cpu = groups["cpu"]["template"]["spec"]
    assert "nodeSelector" not in cpu and "tolerations" not in cpu
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"]


def test_the_config_map_holds_the_run_with_its_services_on_the_pod_address_and_tokens_are_fresh():
    cfg = load_config(ROOT / "configs/quickstart.yaml")
    first, second = render(cfg, image="i"), render(cfg, image="i")
    stored = ExperimentConfig.model_validate(
        yaml.safe_load(by_kind(first)["ConfigMap"]["data"]["experiment.yaml"])
    )
    assert stored.network.host == "auto" and stored.run_root == "/data/runs"
    assert stored.model_copy(update={"network": cfg.network, "run_root": cfg.run_root}) == cfg
    tokens = [by_kind(m)["Secret"]["stringData"]["ray-auth-token"] for m in (first, second)]
    assert tokens[0] != tokens[1] and len(tokens[0]) == 64
    head = by_kind(first)["RayCluster"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in head] == ["ray-head", "prefect-worker"]
    env = {e["name"]: e for e in head[1]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
    policy = by_kind(first)["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == policy["ingress"][0]["from"][0]["podSelector"]  # only from its own pods


def test_validation_names_what_is_wrong_in_the_cluster_and_in_its_pod_templates():
    cluster = by_kind(render(load_config(ROOT / "configs/quickstart.yaml"), image="i"))["RayCluster"]
    bad = copy.deepcopy(cluster)
    bad["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 1  # a map of strings
    del bad["spec"]["workerGroupSpecs"][1]["groupName"]
    bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"] = "6379"
    found = problems(bad)
    assert any("workerGroupSpecs.0.rayStartParams.num-gpus: 1 is not of type 'string'" in p for p in found)
    assert any("'groupName' is a required property" in p for p in found)
    bad = copy.deepcopy(cluster)
    bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["port"] = 6379  # a typo'd field
    (found,) = problems(bad)
    assert "spec.headGroupSpec.template:" in found and "'port' was unexpected" in found
    with pytest.raises(ValueError, match="do not validate"):
        validate([bad])


def test_a_kubernetes_sandbox_adds_its_deny_all_policy_and_image_pre_pull_in_the_sandbox_namespace():
    cfg = load_config(
        data={"tasks": [{"env": "code"}]},
        overrides=[
            "backends.sandbox=kubernetes",
            "backends.kubernetes_sandbox.namespace=sbx",
            "backends.kubernetes_sandbox.image=registry.local/sandbox:7",
        ],
    )
    manifests = render(cfg, image="i")
    assert [m["kind"] for m in manifests] == [
        "Secret",
        "ConfigMap",
        "RayCluster",
        "NetworkPolicy",
        "NetworkPolicy",
        "DaemonSet",
    ]
    validate(manifests)
    sandbox, prepull = manifests[-2:]
    assert sandbox["metadata"]["namespace"] == prepull["metadata"]["namespace"] == "sbx"
    assert sandbox["spec"] == {
        "podSelector": {"matchLabels": {"rollart.io/sandbox": "true"}},
        "policyTypes": ["Ingress", "Egress"],
    }
    (init,) = prepull["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == "registry.local/sandbox:7" and init["command"] == ["python3", "-c", "pass"]


def test_without_a_kubernetes_sandbox_no_sandbox_manifest_is_rendered():
    cfg = load_config(data={"tasks": [{"env": "code"}]}, overrides=["backends.sandbox=bwrap"])
    kinds = [m["kind"] for m in render(cfg, image="i")]
    assert kinds == ["Secret", "ConfigMap", "RayCluster", "NetworkPolicy"]


def test_a_broken_pre_pull_daemonset_does_not_validate():
    cfg = load_config(data={"tasks": [{"env": "code"}]}, overrides=["backends.sandbox=kubernetes"])
    prepull = by_kind(render(cfg, image="i"))["DaemonSet"]
    assert problems(prepull) == []
    bad = copy.deepcopy(prepull)
    bad["spec"]["template"]["spec"]["initContainers"][0]["comand"] = ["python3"]  # a typo'd field
    (found,) = problems(bad)
    assert found.startswith("DaemonSet/rollart-image-prepull: spec.template.spec.initContainers.0:")
    assert "'comand' was unexpected" in found
    with pytest.raises(ValueError, match="do not validate"):
        validate([bad])
