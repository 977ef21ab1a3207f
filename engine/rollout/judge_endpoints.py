"""A run's serverless reward (paper §6.2): one scale-to-zero LLM-judge endpoint per task that asks for one.

`deploy_judges` starts them on Ray Serve (infra/serve.py) before the rollout starts: each runs
`RewardWorker.judge` (the reward role's `@register_serverless` method; its worker, with the judge model, is
built once per replica), behind a fresh bearer token, with no replica until the first call (a cold start)
and none again after `idle_s` without calls. `judge_scores` is the rollout's score function: for the judged
tasks, the judge method's calls through the reward role's `Cluster`s; the environment's rule for the
others. The rollout's `RewardScorer` retries a failed call and drops the trajectory after the last attempt.
`undeploy_judges` removes them at teardown.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import TaskConfig
from engine.core.worker import serverless_body
from engine.models.importer import resolve_model_path
from engine.rollout.judge import serverless_scorer
from engine.rollout.reward import ScoreFn, TaskScores, env_return
from engine.rollout.reward_worker import RewardWorker
from infra.serve import deploy_function, new_token, replica_count, undeploy
from infra.serverless import ServerlessClient


@dataclass(frozen=True)
class JudgeEndpoint:
    task: str
    app: str  # the Serve application's name
    url: str
    model_dir: str
    token: str = field(repr=False)

    def replicas(self) -> int:
        """Replicas running now: 0 while the endpoint is scaled to zero."""
        return replica_count(self.app)

    def report(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model_dir, "replicas": self.replicas()}


def judge_model_dir(model: str, policy_dir: str) -> str:
    """The judge's HF directory: `policy` is the run's own base model; anything else a local model."""
    return policy_dir if model == "policy" else resolve_model_path(model)


def deploy_judges(
    tasks: Sequence[TaskConfig],
    *,
    prefix: str,
    policy_dir: str,
    host: str,
    pool: tuple[str, str],
    replica_options: Mapping[str, Any],
) -> dict[str, JudgeEndpoint]:
    """Deploy a judge endpoint for every task whose `reward.kind` is llm-judge; on Serve's proxy at `host`
    (Ray must be up), its replicas on the reward role's `pool` (name, kind). App names and routes start
    with `prefix`, so runs sharing a Ray cluster do not collide."""
    out: dict[str, JudgeEndpoint] = {}
    try:
        for i, task in enumerate(tasks):
            r = task.reward
            if r.kind != "llm-judge":
                continue
            assert r.model is not None  # the config requires it for a judge
            model_dir = judge_model_dir(r.model, policy_dir)
            app, token = f"{prefix}-judge-{i}", new_token()
            config = {"model_dir": model_dir, "max_tokens": r.max_tokens}
            url = deploy_function(
                app,
                functools.partial(serverless_body, RewardWorker, "judge", app, *pool, config),
                token=token,
                route_prefix=f"/{prefix}/judge/{i}",
                max_replicas=r.max_replicas,
                idle_s=r.idle_s,
                host=host,
                ray_actor_options=replica_options,
            )
            out[task.name] = JudgeEndpoint(task.name, app, url, model_dir, token)
    except BaseException:
        undeploy_judges(out)
        raise
    return out


def judge_scores(judges: Mapping[str, ServerlessClient], base: ScoreFn = env_return) -> TaskScores:
    """The rollout's score function: each judged task's judge client, `base` (the env's rule) for the rest.
    The clients do not retry: the rollout's `RewardScorer` does, with its backoff and counts."""
    return TaskScores({task: serverless_scorer(client) for task, client in judges.items()}, base)


def undeploy_judges(endpoints: Mapping[str, JudgeEndpoint]) -> None:
    for e in endpoints.values():
        undeploy(e.app)
