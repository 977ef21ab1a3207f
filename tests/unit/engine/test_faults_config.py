import pytest

from engine.config import ConfigError, load_config

TASKS = [{"env": "synthetic"}]


def test_faults_are_off_by_default():
    f = load_config(data={"tasks": TASKS}).faults
    assert not (f.env_faults or f.reward_faults or f.trainer_faults)
    assert f.gen_kill_after_requests is None


def test_bad_fault_settings_name_their_field():
    with pytest.raises(ConfigError) as e:
        load_config(
            data={"tasks": TASKS},
            overrides=["faults.env_hang=1.5", "faults.gen_kill_after_requests=0", "faults.env_crash=0.1"],
        )
    assert sorted(e.value.problems) == [
        "faults.env_crash: Extra inputs are not permitted",
        "faults.env_hang: Input should be less than or equal to 1",
        "faults.gen_kill_after_requests: Input should be greater than or equal to 1",
    ]


def test_set_faults_switch_their_wrappers_on():
    f = load_config(
        data={"tasks": TASKS}, overrides=["faults.env_step_crash=0.2", "faults.trainer_error_at_step=3"]
    ).faults
    assert f.env_faults and f.trainer_faults and not f.reward_faults
