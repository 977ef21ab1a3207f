"""Modelled env latency: a wrapper that sleeps a seeded random time before each call.

Benchmarks at paper scale replace slow real envs (sandboxes, web pages) by a wrapper around a fast
one. The draws are a pure function of the seed, so a benchmark can compute the ideal schedule from
`LatencyModel.draws(n)`: exactly the times the wrapper sleeps, in order.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engine.envs.base import Env, EnvStep

_RESET_STREAM, _STEP_STREAM = 0, 1


@dataclass(frozen=True)
class LatencyModel:
    """A Gaussian (mu, sigma) truncated at 0, in time units.

    Truncated, not clipped: negative draws are redrawn, so there is no mass at exactly 0 and the
    mean exceeds `mu` unless `mu` is several `sigma` above 0. `stream` separates independent
    sequences under one seed (a wrapper's resets and steps).
    """

    mu: float
    sigma: float
    seed: int = 0
    stream: int = 0

    def __post_init__(self) -> None:
        if self.mu < 0 or self.sigma < 0:
            raise ValueError(f"latency needs mu >= 0 and sigma >= 0, got ({self.mu}, {self.sigma})")
        if self.seed < 0 or self.stream < 0:
            raise ValueError(f"latency seed and stream must be >= 0, got {self.seed}, {self.stream}")

    def iter_draws(self) -> Iterator[float]:
        """The draw sequence, endless; every call starts it afresh from the seed."""
        rng = np.random.default_rng([self.seed, self.stream])
        while True:
            x = float(rng.normal(self.mu, self.sigma))
            if x >= 0.0:  # mu >= 0, so at least half the draws are kept
                yield x

    def draws(self, n: int) -> list[float]:
        """The first `n` draws of the sequence."""
        return list(itertools.islice(self.iter_draws(), n))


class LatencyEnv(Env):
    """Sleeps `draw * time_scale` seconds, then delegates to `inner`.

    `reset_latency` and `step_latency` are (mu, sigma) in time units; `time_scale` is seconds per
    unit. Resets and steps each follow their own sequence (`reset_model`, `step_model`), continued
    across episodes: the k-th step of the wrapper's life sleeps on `step_model.draws(k + 1)[k]`.
    """

    name = "latency"

    def __init__(
        self,
        inner: Env,
        reset_latency: tuple[float, float],
        step_latency: tuple[float, float],
        seed: int = 0,
        time_scale: float = 0.01,
    ) -> None:
        if time_scale < 0:
            raise ValueError(f"time_scale must be >= 0 (seconds per time unit), got {time_scale}")
        self.inner = inner
        self.instructions = inner.instructions
        self.time_scale = time_scale
        self.reset_model = LatencyModel(*reset_latency, seed=seed, stream=_RESET_STREAM)
        self.step_model = LatencyModel(*step_latency, seed=seed, stream=_STEP_STREAM)
        self._reset_draws = self.reset_model.iter_draws()
        self._step_draws = self.step_model.iter_draws()

    async def reset(self, seed: int) -> str:
        await asyncio.sleep(next(self._reset_draws) * self.time_scale)
        return await self.inner.reset(seed)

    async def step(self, action: str) -> EnvStep:
        draw = next(self._step_draws)
        await asyncio.sleep(draw * self.time_scale)
        result = await self.inner.step(action)
        return EnvStep(result.observation, result.reward, result.done, {**result.info, "latency": draw})

    async def close(self) -> None:
        await self.inner.close()
