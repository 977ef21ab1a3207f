"""A trajectory's failure: the reason code reads, the name it is counted under, the text people read."""

from engine.types import Failure, FailureReason


def test_an_error_raised_mid_episode_is_named_and_counted_by_its_exception():
    f = Failure(FailureReason.EPISODE_ERROR, "sandbox died", "RuntimeError")
    assert f.counted_as == "RuntimeError" and str(f) == "RuntimeError: sandbox died"


def test_other_failures_are_counted_by_reason_and_keep_their_detail():
    reward = Failure(FailureReason.REWARD_FAILED, "judge crashed", "ValueError")
    assert reward.counted_as == "reward_failed" and str(reward) == "reward_failed: ValueError: judge crashed"
    stale = Failure(FailureReason.STALE, "started at v0, next batch at v2, alpha 1")
    assert stale.counted_as == "stale" and str(stale) == "stale: started at v0, next batch at v2, alpha 1"
    assert str(Failure(FailureReason.ENV_TIMEOUT)) == "env_timeout"
