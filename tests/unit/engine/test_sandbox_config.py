"""`backends.sandbox`: bwrap by default, or kubernetes with `backends.kubernetes_sandbox`. A setting with
nothing behind it is refused naming its field, and the choice reaches the code envs through task_specs."""

from pathlib import Path

import pytest
import yaml

from engine.actor_args import task_specs
from engine.config import BackendsConfig, ConfigError, KubernetesSandboxConfig, load_config

CODE = {"tasks": [{"env": "code"}]}
KUBERNETES = ["backends.sandbox=kubernetes"]


def loads_back(backends: BackendsConfig) -> bool:
    """The section's resolved form (every default written out, as `rollart config show` prints it)."""
    return (
        BackendsConfig.model_validate(yaml.safe_load(yaml.safe_dump(backends.model_dump(mode="json"))))
        == backends
    )


def problems(data: dict, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(data=data, overrides=overrides)
    return e.value.problems


def test_kubernetes_settings_are_refused_while_the_sandbox_is_bwrap():
    assert problems(CODE, ["backends.kubernetes_sandbox={image: python:3.13}"]) == [
        "backends: kubernetes_sandbox: only sandbox: kubernetes uses it (sandbox is bwrap)"
    ]


def test_a_kubernetes_sandbox_needs_a_task_that_runs_code():
    assert problems({"tasks": [{"env": "synthetic"}]}, KUBERNETES) == [
        "backends.sandbox: kubernetes runs the code of tasks with env code; no task has one"
    ]


def test_a_task_cannot_choose_its_own_sandbox():
    data = {"tasks": [{"env": "code", "env_args": {"sandbox": {"backend": "kubernetes"}}}]}
    assert problems(data, []) == [
        "tasks[0].env_args: sandbox: set backends.sandbox (and backends.kubernetes_sandbox), not a task's"
    ]


def test_bad_kubernetes_settings_name_their_field():
    bad = ["kubernetes_sandbox.cpu=lots", "kubernetes_sandbox.namespace=Sand_Box", "kubernetes_sandbox.gpu=1"]
    found = problems(CODE, [*KUBERNETES, *(f"backends.{b}" for b in bad)])
    assert [p.split(":")[0] for p in sorted(found)] == [
        "backends.kubernetes_sandbox.cpu",
        "backends.kubernetes_sandbox.gpu",
        "backends.kubernetes_sandbox.namespace",
    ]


def test_the_resolved_form_loads_back_and_the_sandbox_reaches_the_code_task_only(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    data = {"tasks": [{"env": "code"}, {"env": "synthetic"}]}
    cfg = load_config(data=data, overrides=[*KUBERNETES, "backends.kubernetes_sandbox.memory=1Gi"])
    assert cfg.backends.kubernetes_sandbox == KubernetesSandboxConfig(memory="1Gi")
    assert loads_back(cfg.backends)
    code, synthetic = task_specs(cfg)
    assert code.env_args == {
        "sandbox": {
            "backend": "kubernetes",
            "kubeconfig": str(tmp_path / "kubeconfig"),  # resolved on the driver, for the rollout actor
            "context": None,
            "namespace": "rollart-sandbox",
            "image": "python:3.12-slim",
            "cpu": "1",
            "memory": "1Gi",
            "start_timeout_s": 60.0,
        }
    }
    assert synthetic.env_args == {}
    default = load_config(data=CODE)
    assert default.backends.kubernetes_sandbox is None
    assert loads_back(default.backends)
    assert task_specs(default)[0].env_args == {"sandbox": {"backend": "bwrap"}}
