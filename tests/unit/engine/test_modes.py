"""The mode table: each mode's name as configs write it, and what its row guarantees."""

import pytest

from engine.config import TrainConfig
from engine.modes import Mode, ModePolicy, policy


def test_the_modes_keep_the_names_configs_cli_json_and_metrics_use():
    assert [m.value for m in Mode] == ["sync", "sync+", "one-off", "areal", "rollart"]
    assert Mode("sync+") is Mode.SYNC_PLUS and f"{Mode.ONE_OFF}" == "one-off"
    assert policy("sync+") is policy(Mode.SYNC_PLUS)
    with pytest.raises(ValueError, match="'fast' is not a valid Mode"):
        policy("fast")


@pytest.mark.parametrize(
    ("mode", "row"),
    [
        ("sync", ModePolicy(waves=True, on_policy=True, lockstep=True, fixed_alpha=0, aborts_at_bump=True)),
        ("sync+", ModePolicy(waves=True, on_policy=True, lockstep=False, fixed_alpha=0, aborts_at_bump=True)),
        (
            "one-off",
            ModePolicy(waves=True, on_policy=False, lockstep=False, fixed_alpha=1, aborts_at_bump=True),
        ),
        (
            "areal",
            ModePolicy(waves=False, on_policy=False, lockstep=False, fixed_alpha=None, aborts_at_bump=False),
        ),
        (
            "rollart",
            ModePolicy(waves=False, on_policy=False, lockstep=False, fixed_alpha=None, aborts_at_bump=True),
        ),
    ],
)
def test_each_mode_row(mode: str, row: ModePolicy):
    assert policy(mode) == row


@pytest.mark.parametrize("mode", list(Mode))
def test_what_every_row_guarantees(mode: Mode):
    p = policy(mode)
    # on-policy means rollout and training take turns, wave by wave, at alpha 0
    assert not p.on_policy or (p.waves and p.fixed_alpha == 0)
    # a wave mode fixes alpha by construction; a continuous one takes train.alpha and gates admission
    assert p.waves == (p.fixed_alpha is not None) == (not p.admission)
    # lockstep turns are a way of running waves; only areal skips the checks at a version bump
    assert not p.lockstep or p.waves
    assert p.aborts_at_bump == (mode != Mode.AREAL)
    assert p.alpha(3) == (3 if p.fixed_alpha is None else p.fixed_alpha)


def test_the_config_field_takes_the_names_and_refuses_others_by_field():
    cfg = TrainConfig(mode="sync+")
    assert cfg.mode is Mode.SYNC_PLUS and cfg.alpha == 0
    assert cfg.model_dump(mode="json")["mode"] == "sync+"
    with pytest.raises(
        ValueError, match=r"mode\n  Input should be 'sync', 'sync\+', 'one-off', 'areal' or 'rollart'"
    ):
        TrainConfig(mode="fast")
