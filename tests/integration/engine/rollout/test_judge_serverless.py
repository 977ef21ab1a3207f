"""The LLM judge on a scale-to-zero Ray Serve endpoint: scoring trajectories through `RewardScorer`, and a
judged task trained end to end (the endpoint deployed by `deploy_reward`, called by the rollout)."""

import asyncio
import functools
import time

import httpx
import pytest
import ray
from ray import serve

from engine.config import load_config
from engine.experiment import Experiment
from engine.models.tiny import init_model
from engine.rollout.judge import make_judge, serverless_scorer
from engine.rollout.reward import RewardScorer, judge_payload
from engine.types import FailureReason, Trajectory, TrajStatus, Turn
from infra.serve import deploy_function, new_token, replica_count, undeploy
from infra.serverless import ServerlessClient
from tasks.setup import deploy_reward
from tests.integration.runs import G, ray_for, tiny_config
from tests.services import COLD_CALL_S

# Serve's HTTP proxy on another loopback address, as a run's `network.host` would put it on a private
# interface: the test stays on loopback and still tells the configured host from the default one
HOST = "127.0.0.2"

pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")


def trajectory(traj_id: str, answer: str) -> Trajectory:
    t = Trajectory(traj_id, "g1", "arith", 3, start_version=0, status=TrajStatus.DONE)
    t.turns.append(Turn("What is 2+3?", [1], answer, [2], [-0.1], 0, env_reward=1.0))
    return t


@pytest.fixture(scope="module")
def judge_endpoint(tmp_path_factory):
    """A Ray with the test run's pools (shared with the training test) and a judge endpoint on it."""
    model_dir = init_model("tiny", tmp_path_factory.mktemp("judge") / "tiny")
    with ray_for(tiny_config(tmp_path_factory.mktemp("ray"), "ray")):
        try:
            token = new_token()
            url = deploy_function(
                "judge",
                functools.partial(make_judge, model_dir),
                token=token,
                route_prefix="/judge",
                idle_s=60,
                host=HOST,
            )
            yield model_dir, url, token
            undeploy("judge")
        finally:
            serve.shutdown()


async def test_judge_scores_on_the_endpoint_like_the_same_judge_run_locally(judge_endpoint):
    model_dir, url, token = judge_endpoint
    client = ServerlessClient(url, token, timeout_s=COLD_CALL_S)
    assert replica_count("judge") == 0  # min_replicas=0: the model is loaded by the first call
    scorer = RewardScorer(serverless_scorer(client), retries=1)
    first = await scorer(trajectory("a", "<answer>5</answer>"))
    again = await scorer(trajectory("b", "<answer>5</answer>"))
    assert first.status == again.status == TrajStatus.DONE and first.failure is None
    assert first.reward in (0.0, 1.0) and again.reward == first.reward
    assert replica_count("judge") == 1 and client.attempts == 2 and scorer.counts == {"scored": 2}
    local = make_judge(model_dir)
    assert await local(judge_payload(first)) == first.reward
    await local.backend.close()


async def test_judge_error_is_retried_then_marks_the_trajectory_failed(judge_endpoint):
    _, url, token = judge_endpoint
    client = ServerlessClient(url, token, timeout_s=COLD_CALL_S, retries=1, backoff_s=0.01)
    empty = Trajectory("c", "g1", "arith", 3, status=TrajStatus.DONE)
    t = await RewardScorer(serverless_scorer(client), retries=0)(empty)
    assert t.status == TrajStatus.FAILED and t.reward is None and client.attempts == 2
    # the endpoint's own reason reaches the trajectory's failure
    assert t.failure is not None and t.failure.reason is FailureReason.REWARD_FAILED
    assert t.failure.error == "ServerlessError" and "HTTP 500" in t.failure.detail
    assert "has no turns to judge" in t.failure.detail


def _untokened_status(url: str) -> int:
    return httpx.post(url, json={"args": [{}], "kwargs": {}}, timeout=COLD_CALL_S).status_code


def _scaled_to_zero(endpoint, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while endpoint.replicas():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_judged_task_trains_on_the_judges_scores_from_an_endpoint_that_scales_to_zero(
    judge_endpoint, tmp_path
):
    """2 sync+ steps of a task whose reward is an LLM judge (the run's own tiny model). The synthetic env
    pays 1.0 for every finished episode; this judge (random weights, replying blank lines) says yes to
    none, so a batch whose rewards are not all 0 was scored by something other than the judge. Between
    steps no wave is live (sync+ releases the next one after the update): the judge must scale to zero
    there, and the next batch is then scored after a cold start."""
    cfg = tiny_config(
        tmp_path, "judged", train={"mode": "sync+", "alpha": 0}, rollout={"reward_timeout_s": 60.0}
    )
    cfg["tasks"][0]["reward"] = {"kind": "llm-judge", "model": "policy", "idle_s": 1.0}
    cfg["network"] = {"host": HOST}
    exp = Experiment(load_config(data=cfg))
    up, zero_before_wave, refused = [], [], []
    try:
        exp.provision()
        exp.prepare_model()
        report = deploy_reward.fn(exp)  # the flow's task: its result names the endpoint
        (task,) = report["endpoints"]
        endpoint = exp.judges[task]
        assert report["endpoints"][task]["url"] == endpoint.url and endpoint.url.startswith(f"http://{HOST}:")
        assert report["endpoints"][task]["replicas"] == 0 and report["scoring"][task].endswith(endpoint.url)
        # the reward role is a Cluster of RewardWorker whose `judge` (@register_serverless) is that endpoint
        reward = exp.clusters[f"reward-{task}"]
        assert reward.workers == [] and reward.serverless_client("judge").url == endpoint.url
        exp.start_weight_store()
        exp.start_actors()
        proto = exp.protocol()

        async def phase(name, fn):
            if name == "sync_weights_next":  # the batch is scored and no wave is live: the judge goes idle
                zero_before_wave.append(await asyncio.to_thread(_scaled_to_zero, endpoint))
            out = await fn()
            if name == "get_batch":  # the batch's last trajectory was just scored
                up.append(endpoint.replicas())
                if not refused:  # a warm replica: a call without the run's token
                    refused.append(await asyncio.to_thread(_untokened_status, endpoint.url))
            return out

        async def run():
            await proto.start()
            return [await proto.step(phase) for _ in range(2)]

        metrics = asyncio.run(run())
        stats = ray.get(exp.rollout.stats.remote())
        app = endpoint.app
    finally:
        exp.teardown()
    assert refused == [401]  # the endpoint takes only calls with the run's token
    assert [m["version"] for m in metrics] == [1, 2]
    assert [m["reward_mean"] for m in metrics] == [0.0, 0.0]  # the judge's verdicts, not the env's 1.0
    assert stats["reward"]["scored"] >= 2 * 2 * G and "failed" not in stats["reward"]
    assert up == [1, 1]  # a replica served each batch ...
    assert zero_before_wave == [True, True]  # ... and none was left between steps: the second batch cold
    assert app not in serve.status().applications  # teardown removed the endpoint
