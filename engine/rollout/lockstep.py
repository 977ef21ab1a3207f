"""Batch granularity, the baseline the paper compares trajectory-level rollout against (§6.1, R2).

All members of a rollout step advance turn by turn together: a turn's generation starts only when every
live member has asked for it, and runs as one batch; so each turn waits for the slowest env step of the
turn before. `LockstepGenerator` imposes that barrier on any generator; the scheduler gives one to each
wave of groups.
"""

from __future__ import annotations

import asyncio

from engine.rollout.env_manager import Generator
from engine.types import GenOutput, GenRequest


class LockstepGenerator:
    def __init__(self, inner: Generator, members: int):
        self.inner = inner
        self.live = members  # members that have not ended
        self.turns = 0  # batches generated
        self._pending: list[tuple[GenRequest, asyncio.Future[GenOutput]]] = []
        self._batches: set[asyncio.Task[None]] = set()  # running turn batches (kept referenced)

    def join(self) -> None:
        """A member was added to the wave (a refill)."""
        self.live += 1

    async def generate(self, request: GenRequest) -> GenOutput:
        fut: asyncio.Future[GenOutput] = asyncio.get_running_loop().create_future()
        entry = (request, fut)
        self._pending.append(entry)
        self._maybe_flush()
        try:
            return await fut
        except asyncio.CancelledError:
            if entry in self._pending:
                self._pending.remove(entry)
            raise

    def release(self, trajectory_id: str) -> None:
        """A member ended: the barrier no longer waits for it."""
        self.live -= 1
        if hasattr(self.inner, "release"):
            self.inner.release(trajectory_id)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._pending and len(self._pending) >= self.live:
            batch, self._pending = self._pending, []
            self.turns += 1
            task = asyncio.ensure_future(self._run(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _run(self, batch: list[tuple[GenRequest, asyncio.Future[GenOutput]]]) -> None:
        outs = await asyncio.gather(*(self.inner.generate(r) for r, _ in batch), return_exceptions=True)
        for (_, fut), out in zip(batch, outs, strict=True):
            if fut.done():
                continue
            if isinstance(out, BaseException):
                fut.set_exception(out)
            else:
                fut.set_result(out)
