"""The training modes (`train.mode`) and what each one does, in one table (README "Modes").

A mode's name is a `Mode`; its behaviour is the `ModePolicy` that `policy(mode)` returns. The protocol,
the rollout service, the staleness policy, the config and the thread counts read these fields instead of
comparing names, so a mode's behaviour is stated here once:

| mode      | waves | on_policy | lockstep | fixed_alpha | aborts_at_bump |
|-----------|-------|-----------|----------|-------------|----------------|
| `sync`    | yes   | yes       | yes      | 0           | yes            |
| `sync+`   | yes   | yes       | no       | 0           | yes            |
| `one-off` | yes   | no        | no       | 1           | yes            |
| `areal`   | no    | no        | no       | —           | no             |
| `rollart` | no    | no        | no       | —           | yes            |
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Mode(enum.StrEnum):
    """A training mode; its value is the name configs, the CLI, JSON and metrics use."""

    SYNC = "sync"
    SYNC_PLUS = "sync+"
    ONE_OFF = "one-off"
    AREAL = "areal"
    ROLLART = "rollart"


@dataclass(frozen=True)
class ModePolicy:
    """What a mode does.

    - `waves`: rollout runs in gated waves of B groups, one released per training step; else it runs
      continuously, each new group admitted under the staleness bound (`admission`).
    - `on_policy`: the next wave is released only once the new weights serve, so rollout and training
      take turns and every trained sample comes from the weights it trains (α = 0). A wave mode that is
      not on-policy (`one-off`) releases the next wave before training: one step of overlap.
    - `lockstep`: each wave's turns run in lockstep (batch granularity, whatever `rollout.granularity` says).
    - `fixed_alpha`: the α the mode runs at by construction; None: `train.alpha`, at least 1.
    - `aborts_at_bump`: at each version bump, in-flight trajectories and buffered groups the next batch
      could not take are aborted and evicted; else the bound is checked only when a group starts.
    """

    waves: bool
    on_policy: bool
    lockstep: bool
    fixed_alpha: int | None
    aborts_at_bump: bool

    @property
    def admission(self) -> bool:
        """New groups are admitted one by one, each only if the batch it lands in is within α of the
        serving version (`StalenessPolicy.may_start`): the continuous modes."""
        return not self.waves

    def alpha(self, bound: int) -> int:
        """The α this mode runs at when `bound` is asked for: its fixed α, else `bound`."""
        return bound if self.fixed_alpha is None else self.fixed_alpha


_POLICIES = {
    Mode.SYNC: ModePolicy(waves=True, on_policy=True, lockstep=True, fixed_alpha=0, aborts_at_bump=True),
    Mode.SYNC_PLUS: ModePolicy(
        waves=True, on_policy=True, lockstep=False, fixed_alpha=0, aborts_at_bump=True
    ),
    Mode.ONE_OFF: ModePolicy(waves=True, on_policy=False, lockstep=False, fixed_alpha=1, aborts_at_bump=True),
    Mode.AREAL: ModePolicy(
        waves=False, on_policy=False, lockstep=False, fixed_alpha=None, aborts_at_bump=False
    ),
    Mode.ROLLART: ModePolicy(
        waves=False, on_policy=False, lockstep=False, fixed_alpha=None, aborts_at_bump=True
    ),
}


def policy(mode: Mode | str) -> ModePolicy:
    """The behaviour of `mode` (a `Mode` or its name); ValueError for a name that is no mode."""
    return _POLICIES[Mode(mode)]
