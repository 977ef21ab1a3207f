"""Injected env faults (issue 7): a wrapper that crashes or hangs a reset or a step with given odds.

Like `LatencyEnv`, it wraps any env. Its draws come from its own `random.Random`, so a run with the
same seeds fails the same calls. A crash raises `InjectedEnvCrash` (the EnvManager fails the member
with that reason and the scheduler replaces it); a hang never answers, so only the env timeout
(`rollout.env_timeout_s`) ends it.
"""

from __future__ import annotations

import asyncio
import random

from engine.envs.base import Env, EnvStep


class InjectedEnvCrash(RuntimeError):
    """A crash drawn by `FaultyEnv` (stands for a sandbox or env process that died)."""


class FaultyEnv(Env):
    name = "faulty"

    def __init__(
        self,
        inner: Env,
        rng: random.Random,
        reset_crash: float = 0.0,
        step_crash: float = 0.0,
        hang: float = 0.0,
    ) -> None:
        for what, p in (("reset_crash", reset_crash), ("step_crash", step_crash), ("hang", hang)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"faulty env: {what} must be a probability in [0, 1], got {p}")
        self.inner, self.instructions, self.rng = inner, inner.instructions, rng
        self.reset_crash, self.step_crash, self.hang = reset_crash, step_crash, hang

    async def _maybe_fail(self, call: str, crash: float) -> None:
        # Two draws per call, always, so one fault's odds do not shift the other's sequence.
        crashes, hangs = self.rng.random() < crash, self.rng.random() < self.hang
        if crashes:
            raise InjectedEnvCrash(f"injected env crash at {call}")
        if hangs:
            await asyncio.Event().wait()  # never set: only a timeout (a cancellation) ends this

    async def reset(self, seed: int) -> str:
        await self._maybe_fail("reset", self.reset_crash)
        return await self.inner.reset(seed)

    async def step(self, action: str) -> EnvStep:
        await self._maybe_fail("step", self.step_crash)
        return await self.inner.step(action)

    async def close(self) -> None:
        await self.inner.close()
