import math

from engine.rollout.reward import RewardScorer, TaskScores, judge_payload
from engine.types import Failure, FailureReason, Trajectory, TrajStatus, Turn


def finished(reward: float = 0.5) -> Trajectory:
    t = Trajectory("t", "g", "task", 7, start_version=0, status=TrajStatus.DONE)
    t.turns.append(Turn("obs", [1], "act", [2], [-0.1], 0, env_reward=reward))
    return t


async def test_rule_reward_is_the_env_return():
    t = await RewardScorer()(finished(0.75))
    assert t.reward == 0.75 and t.status == TrajStatus.DONE


async def test_flaky_scorer_is_retried_with_backoff_then_succeeds():
    calls = []

    async def flaky(traj):
        calls.append(traj.traj_id)
        if len(calls) < 3:
            raise ConnectionError("endpoint down")
        return 2.0

    scorer = RewardScorer(flaky, retries=3, backoff_s=0.001)
    t = await scorer(finished())
    assert t.reward == 2.0 and len(calls) == 3 and scorer.counts == {"retries": 2, "scored": 1}


async def test_scorer_that_keeps_failing_marks_the_trajectory_failed_with_reason():
    def broken(traj):
        raise ValueError("judge crashed")

    scorer = RewardScorer(broken, retries=2, backoff_s=0.001)
    t = await scorer(finished())
    assert t.status == TrajStatus.FAILED and t.reward is None
    assert t.failure == Failure(FailureReason.REWARD_FAILED, "judge crashed", "ValueError")
    assert str(t.failure) == "reward_failed: ValueError: judge crashed"
    assert scorer.counts == {"retries": 2, "failed": 1}


async def test_non_finite_reward_is_a_failure_not_a_number():
    for bad in (math.nan, math.inf):
        t = await RewardScorer(lambda traj, bad=bad: bad)(finished())
        assert t.status == TrajStatus.FAILED
        assert t.failure == Failure(FailureReason.REWARD_NOT_FINITE, str(bad))


async def test_slow_scorer_times_out_and_is_retried():
    import asyncio

    async def slow(traj):
        await asyncio.sleep(10)

    t = await RewardScorer(slow, retries=1, backoff_s=0.001, timeout_s=0.02)(finished())
    assert t.status == TrajStatus.FAILED
    assert t.failure == Failure(FailureReason.REWARD_FAILED, "", "TimeoutError")


def test_judge_payload_is_json_friendly():
    assert judge_payload(finished()) == {
        "task": "task",
        "seed": 7,
        "status": "done",
        "env_return": 0.5,
        "turns": [{"observation": "obs", "action": "act"}],
    }


async def test_task_scores_send_each_task_to_its_own_scorer_and_the_rest_to_the_env_rule():
    seen = []

    async def judge(traj):
        seen.append(traj.task)
        return 0.0

    scorer = RewardScorer(TaskScores({"judged": judge}))
    judged, ruled = finished(1.0), finished(0.75)
    judged.task = "judged"
    assert (await scorer(judged)).reward == 0.0 and (await scorer(ruled)).reward == 0.75
    assert seen == ["judged"] and scorer.counts == {"scored": 2}
