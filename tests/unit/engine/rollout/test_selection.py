import pytest

from engine.rollout.selection import SelectionBias
from engine.types import Group, Trajectory, TrajStatus, Turn


def traj(task: str, turns: int, tokens: int, status: TrajStatus, success: bool = False) -> Trajectory:
    t = Trajectory(f"{task}-{turns}-{status.value}", "g", task, 0, status=status, info={"success": success})
    t.turns = [Turn("obs", [1], "a", [7] * tokens, [0.0] * tokens, 0) for _ in range(turns)]
    return t


def test_training_the_short_ones_shows_as_bias_and_aborted_tokens_are_counted():
    short = [traj("lake", 2, 3, TrajStatus.DONE) for _ in range(3)]
    long = traj("lake", 8, 3, TrajStatus.DONE, success=True)
    aborted = traj("lake", 6, 3, TrajStatus.ABORTED)
    bias = SelectionBias()
    bias.ended([*short, long, aborted])
    bias.trained([Group("g", "lake", 0, 3, short)])  # the long and the aborted one are never trained
    m = bias.metrics()
    assert m["bias/lake/trained_mean_turns"] == 2 and m["bias/lake/started_mean_turns"] == pytest.approx(
        20 / 5
    )
    assert m["bias/lake/trained_mean_tokens"] == 6 and m["bias/lake/started_mean_tokens"] == pytest.approx(12)
    assert m["bias/lake/trained_success"] == 0 and m["bias/lake/started_success"] == pytest.approx(1 / 4)
    assert m["bias/aborted_token_frac"] == pytest.approx(18 / 60)


def test_an_unbiased_sample_has_equal_means_per_task():
    bias = SelectionBias()
    lake = [traj("lake", n, 2, TrajStatus.DONE, success=n > 3) for n in (1, 4, 7)]
    sums = [traj("sums", 1, 5, TrajStatus.DONE, success=True)]
    bias.ended([*lake, *sums])
    bias.trained([Group("a", "lake", 0, 3, lake), Group("b", "sums", 0, 1, sums)])
    m = bias.metrics()
    for task in ("lake", "sums"):
        for k in ("mean_turns", "mean_tokens", "success"):
            assert m[f"bias/{task}/trained_{k}"] == m[f"bias/{task}/started_{k}"]
    assert m["bias/aborted_token_frac"] == 0


def test_nothing_ended_yet_reports_no_task():
    assert SelectionBias().metrics() == {"bias/aborted_token_frac": 0.0}
