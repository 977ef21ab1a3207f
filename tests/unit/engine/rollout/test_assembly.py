"""build_rollout: the mode decides the buffer's eviction, the staleness policy, waves and lockstep."""

import pytest

from engine.envs.synthetic import SyntheticEnv
from engine.modes import Mode
from engine.rollout.assembly import RolloutSpec, build_rollout
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import TurnLimits
from engine.rollout.scheduler import TaskSpec
from tests.unit.engine.rollout.fakes import ScriptedGenerator, tokenizer

TASK = TaskSpec("t", "synthetic", {}, 1.0, 4, TurnLimits(2, 4, 1024), "decode-heavy")


def built(mode: Mode, alpha: int, granularity: str = "trajectory"):
    spec = RolloutSpec(
        tasks=(TASK,), concurrency=8, mode=mode, alpha=alpha, batch_groups=2, granularity=granularity
    )
    return build_rollout(
        spec, ChatFormat(tokenizer()), ScriptedGenerator(lambda k: "ok"), lambda _: SyntheticEnv(2)
    )


@pytest.mark.parametrize(
    ("mode", "alpha", "waves", "lockstep", "aborts"),
    [
        (Mode.SYNC, 0, True, True, True),
        (Mode.SYNC_PLUS, 0, True, False, True),
        (Mode.ONE_OFF, 1, True, False, True),
        (Mode.AREAL, 2, False, False, False),
        (Mode.ROLLART, 2, False, False, True),
    ],
)
def test_each_mode_builds_its_buffer_and_scheduler(mode, alpha, waves, lockstep, aborts):
    buffer, scheduler = built(mode, alpha)
    assert scheduler.buffer is buffer and buffer.alpha == alpha
    assert scheduler.waves is waves
    assert scheduler.granularity == ("batch" if lockstep else "trajectory")
    assert buffer.evict_on_advance is aborts and buffer.check_on_get is aborts
    assert scheduler.policy.per_step is aborts and scheduler.policy.alpha == alpha


def test_batch_granularity_is_kept_where_the_mode_does_not_force_it():
    _, scheduler = built(Mode.AREAL, 1, granularity="batch")
    assert scheduler.granularity == "batch" and scheduler.waves


def test_a_wave_mode_needs_room_for_a_whole_wave():
    spec = RolloutSpec(tasks=(TASK,), concurrency=4, mode=Mode.SYNC_PLUS, batch_groups=2)
    with pytest.raises(ValueError, match=r"rollout\.concurrency must be >= 8"):
        build_rollout(
            spec, ChatFormat(tokenizer()), ScriptedGenerator(lambda k: "ok"), lambda _: SyntheticEnv(2)
        )
