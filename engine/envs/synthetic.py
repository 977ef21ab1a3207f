"""A fixed-length env for benchmarks: done after exactly `turns` steps, whatever the model answers.

Benchmarks of the control plane (rollout granularity, staleness, weight sync) need episodes whose length
does not depend on a model's skill, so that every mode replays the same amount of work. Wrap it in
`LatencyEnv` to give its steps a modelled latency; on its own it answers at once.
"""

from __future__ import annotations

from engine.envs.base import Env, EnvStep


class SyntheticEnv(Env):
    """Step k (1-based) observes "step k of N"; step N ends the episode with reward 1, earlier steps 0.

    The action is ignored (every answer is valid), so the episode return is always 1.
    """

    name = "synthetic"
    instructions = "Answer anything; the episode ends after a fixed number of turns."

    def __init__(self, turns: int = 1) -> None:
        if turns < 1:
            raise ValueError(f"synthetic env: turns must be >= 1, got {turns}")
        self.turns = turns
        self.steps = 0

    async def reset(self, seed: int) -> str:
        self.steps = 0
        return f"step 0 of {self.turns}"

    async def step(self, action: str) -> EnvStep:
        if self.steps >= self.turns:
            raise RuntimeError(f"synthetic env: episode already ended after {self.turns} steps; reset first")
        self.steps += 1
        done = self.steps == self.turns
        return EnvStep(f"step {self.steps} of {self.turns}", 1.0 if done else 0.0, done)
