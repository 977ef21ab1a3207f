"""The LLM judge on a scale-to-zero Ray Serve endpoint, scoring trajectories through `RewardScorer`."""

import functools
from pathlib import Path

import pytest
import ray
from ray import serve

from engine.models.tiny import init_model
from engine.rollout.judge import make_judge, serverless_scorer
from engine.rollout.reward import RewardScorer, judge_payload
from engine.types import Trajectory, TrajStatus, Turn
from infra.serve import deploy_function, new_token, replica_count, undeploy
from infra.serverless import ServerlessClient

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")


def trajectory(traj_id: str, answer: str) -> Trajectory:
    t = Trajectory(traj_id, "g1", "arith", 3, start_version=0, status=TrajStatus.DONE)
    t.turns.append(Turn("What is 2+3?", [1], answer, [2], [-0.1], 0, env_reward=1.0))
    return t


@pytest.fixture(scope="module")
def judge_endpoint(tmp_path_factory):
    model_dir = init_model("tiny", tmp_path_factory.mktemp("judge") / "tiny")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        token = new_token()
        url = deploy_function(
            "judge", functools.partial(make_judge, model_dir), token=token, route_prefix="/judge", idle_s=60
        )
        yield model_dir, url, token
        undeploy("judge")
    finally:
        serve.shutdown()
        ray.shutdown()


async def test_judge_scores_on_the_endpoint_like_the_same_judge_run_locally(judge_endpoint):
    model_dir, url, token = judge_endpoint
    client = ServerlessClient(url, token, timeout_s=60)
    assert replica_count("judge") == 0  # min_replicas=0: the model is loaded by the first call
    scorer = RewardScorer(serverless_scorer(client), retries=1)
    first = await scorer(trajectory("a", "<answer>5</answer>"))
    again = await scorer(trajectory("b", "<answer>5</answer>"))
    assert first.status == again.status == TrajStatus.DONE and first.failure == ""
    assert first.reward in (0.0, 1.0) and again.reward == first.reward
    assert replica_count("judge") == 1 and client.attempts == 2 and scorer.counts == {"scored": 2}
    local = make_judge(model_dir)
    assert await local(judge_payload(first)) == first.reward
    await local.backend.close()


async def test_judge_error_is_retried_then_marks_the_trajectory_failed(judge_endpoint):
    _, url, token = judge_endpoint
    client = ServerlessClient(url, token, timeout_s=60, retries=1, backoff_s=0.01)
    empty = Trajectory("c", "g1", "arith", 3, status=TrajStatus.DONE)
    t = await RewardScorer(serverless_scorer(client), retries=0)(empty)
    assert t.status == TrajStatus.FAILED and t.reward is None and client.attempts == 2
    # the endpoint's own reason reaches the trajectory's failure
    assert t.failure.startswith("reward_failed: ServerlessError: ") and "HTTP 500" in t.failure
    assert "has no turns to judge" in t.failure
