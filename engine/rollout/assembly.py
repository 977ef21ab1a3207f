"""One rollout assembled from a typed spec: the sample buffer and the scheduler that fills it.

Every place that runs a rollout builds it here — the rollout actor (`RolloutService`) and the benchmarks
that drive the control plane without one (`bench/harness.py`, `bench/rollout_granularity.py`) — so the
mode decides the buffer's eviction, the staleness policy, waves and lockstep the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import modes
from engine.rollout.buffer import SampleBuffer
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import Generator
from engine.rollout.reward import RewardScorer
from engine.rollout.scheduler import EnvFactory, RewardFn, RolloutScheduler, TaskSpec
from engine.rollout.staleness import StalenessPolicy


@dataclass(frozen=True)
class RolloutSpec:
    """What a rollout is, apart from the objects it talks to.

    - `mode`, `alpha`: the training mode and its staleness bound (`engine/modes.py`); `areal` at α 0 is
      the benchmarks' single rollout step: every group admitted for batch v0, nothing aborted.
    - `concurrency`: envs at once; `redundancy`: extra members per group; `batch_groups`: groups per batch.
    - `granularity`: `trajectory` or `batch` (lockstep turns; a lockstep mode forces it).
    - `drop_uniform`: drop and replace groups whose members all scored the same.
    """

    tasks: tuple[TaskSpec, ...]
    concurrency: int
    mode: modes.Mode = modes.Mode.AREAL
    alpha: int = 0
    redundancy: int = 0
    batch_groups: int = 1
    seed: int = 0
    granularity: str = "trajectory"
    drop_uniform: bool = False


def build_rollout(
    spec: RolloutSpec,
    chat: ChatFormat,
    generator: Generator,
    env_factory: EnvFactory,
    reward: RewardFn | None = None,
) -> tuple[SampleBuffer, RolloutScheduler]:
    """The buffer and the scheduler of `spec`; `reward` defaults to the env's return (`RewardScorer`)."""
    policy = StalenessPolicy(spec.mode, spec.alpha)
    behaviour = modes.policy(spec.mode)
    buffer = SampleBuffer(spec.alpha, evict_on_advance=policy.per_step, check_on_get=policy.per_step)
    scheduler = RolloutScheduler(
        list(spec.tasks),
        chat,
        generator,
        buffer,
        reward or RewardScorer(),
        env_factory,
        policy,
        concurrency=spec.concurrency,
        redundancy=spec.redundancy,
        batch_groups=spec.batch_groups,
        seed=spec.seed,
        granularity="batch" if behaviour.lockstep else spec.granularity,
        gated_waves=behaviour.waves,
        drop_uniform=spec.drop_uniform,
    )
    return buffer, scheduler
