"""An iteration's protocol phases (get_batch, sync_weights, train_step, publish_weights, ...) as Prefect
tasks: `engine.protocol` names each phase and hands over its work; the iteration flow says which phases may
be retried and how often."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.stopping import retry_unless_stopped


async def run_phase(name: str, fn: Callable[[], Awaitable[Any]], retries: int = 0) -> Any:
    """Run `fn` as a Prefect task called `name` (never cached: every phase acts on live actors), retried
    `retries` times unless the run is being stopped (tasks/stopping.py)."""

    async def body() -> Any:
        return await fn()

    return await task(
        body, name=name, cache_policy=NO_CACHE, retries=retries, retry_condition_fn=retry_unless_stopped
    )()
