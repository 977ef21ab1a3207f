"""RewardWorker: the reward role, whose LLM judge is serverless (paper §6.2).

`judge` is declared `@register_serverless(endpoint="judge")`: on a `Cluster` of this class given the
endpoint's URL, `cluster.judge(payload)` (or the client `cluster.serverless_client("judge")`, which the
rollout's score function holds) is an HTTP call to it. The endpoint's replicas run this same method: each
replica builds one `RewardWorker` (`engine.core.worker.serverless_body`), which loads the judge model once.
The cluster itself starts no Ray actor (its role's count is 0): the replicas are Serve's, on the role's pool.
"""

from __future__ import annotations

from typing import Any

from engine.core.decorators import register_serverless
from engine.core.worker import Role, Worker
from engine.rollout.judge import make_judge


class RewardWorker(Worker):
    """config: {"model_dir": the judge's HF directory, "max_tokens": its reply budget}."""

    role = Role.REWARD

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.llm_judge = make_judge(self.config["model_dir"], max_tokens=int(self.config["max_tokens"]))

    @register_serverless(endpoint="judge")
    async def judge(self, payload: dict[str, Any]) -> float:
        """The verdict on one `judge_payload` (engine/rollout/reward.py): 1.0 for yes, else 0.0."""
        return await self.llm_judge(payload)
