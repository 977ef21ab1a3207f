"""Operational Prefect tasks that set a run up: pools, sandboxes, reward endpoint, actors.

Each is a small unit with its own retries and timeout; none caches (the inputs are live objects)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from engine.actor_args import sandbox_args, task_specs
from engine.envs.registry import make_env
from engine.experiment import Experiment
from engine.rollout.scheduler import TaskSpec
from infra.sandbox import make_sandbox
from tasks.stopping import retry_unless_stopped


@task(
    name="provision_pools",
    retries=2,
    retry_condition_fn=retry_unless_stopped,
    retry_delay_seconds=2,
    timeout_seconds=300,
    cache_policy=NO_CACHE,
)
def provision_pools(exp: Experiment) -> dict[str, Any]:
    return exp.provision()


@task(
    name="warmup_sandboxes",
    retries=1,
    retry_condition_fn=retry_unless_stopped,
    timeout_seconds=600,
    cache_policy=NO_CACHE,
)
async def warmup_sandboxes(exp: Experiment, envs_per_task: int = 2) -> dict[str, Any]:
    """Prepare each task's runtime: the sandbox backend first (a Kubernetes cluster that cannot run
    sandbox pods fails the run here, in one line), then the adapter imports, datasets, a few envs."""

    async def warm(t: TaskSpec) -> dict[str, Any]:
        t0 = time.perf_counter()
        for seed in range(envs_per_task):
            env = make_env(t.env, **t.env_args)
            await env.reset(seed)
            await env.close()
        return {"envs_started": envs_per_task, "seconds": round(time.perf_counter() - t0, 3)}

    report: dict[str, Any] = {
        "sandbox": await asyncio.to_thread(make_sandbox(**sandbox_args(exp.cfg)).warmup)
    }
    report.update({t.name: await warm(t) for t in task_specs(exp.cfg)})
    return report


@task(
    name="deploy_reward",
    retries=2,
    retry_condition_fn=retry_unless_stopped,
    retry_delay_seconds=2,
    timeout_seconds=300,
    cache_policy=NO_CACHE,
)
def deploy_reward(exp: Experiment) -> dict[str, Any]:
    """The scale-to-zero LLM-judge endpoint of each task that is judged (its URL and replicas in the result);
    the other tasks are scored by their environment's rule inside the rollout actor."""
    return exp.deploy_reward()


@task(
    name="prepare_model",
    retries=1,
    retry_condition_fn=retry_unless_stopped,
    retry_delay_seconds=2,
    timeout_seconds=1800,
    cache_policy=NO_CACHE,
)
def prepare_model(exp: Experiment) -> dict[str, Any]:
    """The configured model, or a tiny one built (and format-pretrained) in the run directory."""
    t0 = time.perf_counter()
    model_dir = Path(exp.prepare_model())
    report: dict[str, Any] = {"model_dir": str(model_dir), "seconds": round(time.perf_counter() - t0, 1)}
    pretrain = model_dir / "pretrain.json"
    if pretrain.exists():
        losses = json.loads(pretrain.read_text())["losses"]
        report["pretrain"] = {"steps": len(losses), "loss_first": losses[0], "loss_last": losses[-1]}
    return report


@task(
    name="start_actors",
    retries=1,
    retry_condition_fn=retry_unless_stopped,
    retry_delay_seconds=5,
    timeout_seconds=900,
    cache_policy=NO_CACHE,
)
def start_actors(exp: Experiment) -> dict[str, Any]:
    model = exp.model_dir or exp.prepare_model()
    store = exp.start_weight_store()
    return {"model_dir": model, "weight_store": store["kind"], **exp.start_actors()}
