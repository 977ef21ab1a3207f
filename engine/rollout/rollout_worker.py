"""RolloutWorker: the environment role — a run's `RolloutService` (env loops, scheduler, reward, sample
buffer) as a `Worker`, so the `Cluster` binds it to the `environment` role's pool like every other role.

Its config is the `RolloutService`'s keyword arguments (the task specs, the LLMProxy's handle, the env
factory and reward scorer objects: Ray pickles them into the actor). A pool with `cores` pins the env
loops to them, as the paper puts environments on CPU machines of their own.
"""

from __future__ import annotations

from typing import Any

from engine.core.worker import Role, Worker
from engine.rollout.service import RolloutService


class RolloutWorker(Worker, RolloutService):
    role = Role.ENVIRONMENT

    def __init__(self, *args: Any, **kwargs: Any):
        Worker.__init__(self, *args, **kwargs)
        RolloutService.__init__(self, **self.config)

    async def retire(self) -> bool:
        """Stop the scheduler (every member it started ends, counted) and let the process serve another run:
        `reinit` builds a new service from that run's config (engine/core/warm.py)."""
        await self.stop()
        return self._runner is None or self._runner.done()
