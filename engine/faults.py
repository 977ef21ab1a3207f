"""Fault injection by config (`faults:` section, issue 7), for tests and benchmarks; all off by default.

Each fault is a wrapper around the real piece, seeded from `faults.seed`, so a run fails the same way
twice:
- envs: `FaultyEnvFactory` wraps every env it builds in `FaultyEnv` (crash at reset/step, hang);
- reward: `FaultyScore` wraps the score function (error, hang → `rollout.reward_timeout_s`);
- trainer: `FaultyTrainWorker` raises in train step k, `trainer_error_times` times in a row;
- generation: `GenerationWorker` itself exits on its N-th request (`gen_kill_after_requests`), once.

What the system does about each one is not here: the EnvManager times out and fails the member, the
scheduler replaces it or drops the group whole, the RewardScorer retries then fails the member, the
LLMProxy retries a dead worker's requests elsewhere, the train flow retries a failed step then stops.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable
from typing import Any

from engine.config import FaultsConfig
from engine.core.decorators import register
from engine.envs.base import Env
from engine.envs.faulty import FaultyEnv
from engine.rollout.reward import ScoreFn, env_return
from engine.rollout.scheduler import TaskSpec
from engine.train.train_worker import TrainWorker
from engine.types import Group, Trajectory


class InjectedRewardError(RuntimeError):
    """A reward endpoint error drawn by `FaultyScore`."""


class InjectedTrainerError(RuntimeError):
    """A trainer failure injected by `FaultyTrainWorker`."""


class FaultyEnvFactory:
    """Builds envs with `base` and wraps the i-th one in a `FaultyEnv` seeded `"{seed}/env/{i}"`.

    Picklable (it travels to the rollout actor) as long as `base` is.
    """

    def __init__(self, faults: FaultsConfig, base: Callable[[TaskSpec], Env]) -> None:
        self.faults, self.base = faults, base
        self.made = 0

    def __call__(self, spec: TaskSpec) -> Env:
        f = self.faults
        rng = random.Random(f"{f.seed}/env/{self.made}")
        self.made += 1
        return FaultyEnv(self.base(spec), rng, f.env_reset_crash, f.env_step_crash, f.env_hang)


class FaultyScore:
    """A score function whose calls fail (`reward_error`) or never answer (`reward_hang`) at random."""

    def __init__(self, faults: FaultsConfig, base: ScoreFn = env_return) -> None:
        self.error, self.hang, self.base = faults.reward_error, faults.reward_hang, base
        self.rng = random.Random(f"{faults.seed}/reward")

    async def __call__(self, traj: Trajectory) -> float:
        errors, hangs = self.rng.random() < self.error, self.rng.random() < self.hang
        if errors:
            raise InjectedRewardError(f"injected reward endpoint error for {traj.traj_id}")
        if hangs:
            await asyncio.Event().wait()  # only the scorer's timeout ends this
        value = self.base(traj)
        return float(await value if inspect.isawaitable(value) else value)


class FaultyTrainWorker(TrainWorker):
    """A TrainWorker whose step `trainer_error_at_step` (1-based, the step that makes version k) raises
    `trainer_error_times` times in a row before it succeeds. It raises before any state changes, as a
    real failure (OOM, lost device) inside a step leaves nothing applied."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fault = FaultsConfig(**self.args.faults)
        self.raised = 0

    @register
    def train_step(self, groups: list[Group]) -> dict[str, float]:
        step = self.trainer.version + 1
        if step == self.fault.trainer_error_at_step and self.raised < self.fault.trainer_error_times:
            self.raised += 1
            raise InjectedTrainerError(f"injected trainer failure at step {step} ({self.raised})")
        return super().train_step(groups)
