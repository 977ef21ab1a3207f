"""A fixed-length env for benchmarks: done after exactly N steps, whatever the model answers.

Benchmarks of the control plane (rollout granularity, staleness, weight sync) need episodes whose length
does not depend on a model's skill, so that every mode replays the same amount of work. N is `turns`, or,
with `max_turns`, drawn per episode from `turns..max_turns` by the reset seed (a mixed-length workload:
a group's members share a seed, so a group is all short or all long). Wrap it in `LatencyEnv` to give its
steps a modelled latency; on its own it answers at once.
"""

from __future__ import annotations

import random

from engine.envs.base import Env, EnvStep


class SyntheticEnv(Env):
    """Step k (1-based) observes "step k of N"; step N ends the episode with reward 1, earlier steps 0.

    The action is ignored (every answer is valid), so the episode return is always 1.
    """

    name = "synthetic"
    instructions = "Answer anything; the episode ends after a fixed number of turns."

    def __init__(self, turns: int = 1, max_turns: int | None = None) -> None:
        if turns < 1:
            raise ValueError(f"synthetic env: turns must be >= 1, got {turns}")
        if max_turns is not None and max_turns < turns:
            raise ValueError(f"synthetic env: max_turns must be >= turns ({turns}), got {max_turns}")
        self.min_turns, self.max_turns = turns, max_turns or turns
        self.turns = turns
        self.steps = 0

    async def reset(self, seed: int) -> str:
        self.steps = 0
        self.turns = random.Random(seed).randint(self.min_turns, self.max_turns)
        return f"step 0 of {self.turns}"

    async def step(self, action: str) -> EnvStep:
        if self.steps >= self.turns:
            raise RuntimeError(f"synthetic env: episode already ended after {self.turns} steps; reset first")
        self.steps += 1
        done = self.steps == self.turns
        return EnvStep(f"step {self.steps} of {self.turns}", 1.0 if done else 0.0, done)
