"""The per-iteration protocol of asynchronous training (paper §6.3, "six-step weight sync").

    1 get_batch  — B complete GRPO groups within the staleness bound (blocks); on Ray they stay in the
                   rollout actor's object store and reach the trainer as an ObjectRef, not via the driver
    2 suspend    — the LLMProxy stops admitting requests and waits for in-flight ones
    3 update     — generation workers apply the weights they prefetched in the background
    4 resume     — requests flow again; `advance` aborts what the new version made too stale
    5 continue   — in-flight trajectories go on with the new weights (engines reset their prefix cache,
                   so the cached context is recomputed under the new weights)
    6 train_step — overlaps rollout in one-off, areal and rollart (sync, sync+: no wave is out), and
                   steps 2–5: the batch is taken, so training does not wait for the workers' update;
                   then the new version is packed and prefetched, its push going on in the background

Modes are the same code with different overlap (`engine/modes.py` `ModePolicy`): `sync`/`sync+` keep
rollout out of training (one gated wave per step, `on_policy`; `sync` runs each wave in lockstep turns),
`one-off` releases the next wave before training (one step of overlap), `areal` and `rollart` roll out
continuously under their bound.
Every collaborator is awaited through `acall`, so they may be Ray actors or local objects. A generation
worker that died is being restarted by Ray; weight calls to it wait for the restart (`_on_worker`), up
to `restart_wait_s`. One Ray cannot place again (its node is gone) is then left out and counted
(`gen_workers_unavailable`); the others go on serving (`_each_worker`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray.exceptions import ActorUnavailableError, RayActorError

from engine import modes
from engine.core.handles import RankGroup, acall, acall_split

if TYPE_CHECKING:
    from engine.rollout.gen_worker import GenerationWorker
    from engine.rollout.proxy import LLMProxy
    from engine.rollout.service import RolloutService
    from engine.train.train_worker import TrainWorker

Phase = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]


@dataclass
class Collaborators:
    """The run's actors as the protocol calls them: each typed as its worker class (a Ray handle to one
    has the same methods, called through `acall`), so a renamed or missing method fails the type check."""

    rollout: RolloutService
    proxy: LLMProxy
    trainer: TrainWorker | RankGroup  # its ranks behind one handle with tensor or pipeline parallelism
    gen_workers: list[GenerationWorker]
    weights_via_store: bool = True  # False: push state dicts through Ray (no weight store)


class IterationProtocol:
    def __init__(
        self,
        c: Collaborators,
        mode: modes.Mode,
        batch_groups: int,
        get_batch_timeout_s: float | None = None,
        restart_wait_s: float = 120.0,
    ):
        self.c, self.policy, self.batch_groups = c, modes.policy(mode), batch_groups
        self.timeout_s = get_batch_timeout_s
        self.restart_wait_s = restart_wait_s
        self.serving_version = -1
        self.unavailable: set[int] = set()  # generation workers (indices) left out of weight updates

    async def serve_trainer(self) -> int:
        """Publish the trainer's weights and make every generation worker serve them. Returns the version."""
        version = await acall(self.c.trainer.version)
        await self._publish_and_prefetch()
        await self._apply(version)
        return version

    async def start(self) -> int:
        """Bring the generation workers to the trainer's version and start rollout. Returns the version."""
        version = await self.serve_trainer()
        await acall(self.c.rollout.advance, version)
        await acall(self.c.rollout.start)
        if self.policy.waves:
            await acall(self.c.rollout.release_wave, 1)
        return version

    async def _publish_and_prefetch(self) -> dict[str, float]:
        """Workers start pulling the trainer's version as it is published, so each bucket is read as soon as
        it lands. The publish does not wait for the prefetch calls: one to a worker Ray is restarting (or
        cannot place again) waits up to `restart_wait_s`, and the other workers' pulls, already polling
        for the version, would time out meanwhile."""
        if not self.c.weights_via_store:
            return {}
        version = await acall(self.c.trainer.version)
        _, pub = await asyncio.gather(
            self._each_worker(lambda w: w.prefetch, version), acall(self.c.trainer.publish)
        )
        return {
            "publish_s": pub["pack_s"] + pub["push_wait_s"],  # the trainer's path; the push goes on alone
            "push_s": pub["last_push_s"],  # the store writes of the version published before this one
            "weight_bytes": pub["bytes"],
        }

    async def _apply(self, version: int) -> dict[str, float]:
        """Steps 2–4: suspend, update every worker in place, resume."""
        if version == self.serving_version:
            return {}
        t0 = time.perf_counter()
        suspend_wait = await acall(self.c.proxy.suspend)
        try:
            if self.c.weights_via_store:
                res = [r for r in await self._each_worker(lambda w: w.update, version) if r is not None]
            else:
                state = await acall(self.c.trainer.state_dict)
                await self._each_worker(lambda w: w.load_weights, state, version)
                res = []
        finally:
            await acall(self.c.proxy.resume)
        self.serving_version = version
        out = {"suspend_wait_s": suspend_wait, "update_s": time.perf_counter() - t0}
        if res:
            out.update(
                pull_s=max(r["pull_s"] for r in res),
                exposed_pull_s=max(r["exposed_s"] for r in res),
                load_s=max(r["load_s"] for r in res),
            )
        return out

    async def _each_worker(self, method: Callable[[GenerationWorker], Any], *args: Any) -> list[Any]:
        """`method(worker)(*args)` on every generation worker; None for one left out. A worker still
        unavailable after `restart_wait_s` (Ray cannot place it again: its node is gone and no other offers
        its pool) is left out and counted, and gets one immediate try per later call until it answers: a
        worker Ray does restart loads the newest published weights itself before it serves. With none
        left, it raises."""
        workers = self.c.gen_workers

        async def one(i: int, w: GenerationWorker) -> Any:
            # a call to an actor Ray is restarting may wait unanswered rather than fail: ask with a ping
            if not await _answers(w, 0.0 if i in self.unavailable else self.restart_wait_s):
                if len(self.unavailable | {i}) == len(workers):
                    raise RuntimeError(f"no generation worker answers within {self.restart_wait_s:g} s")
                self.unavailable.add(i)
                return None
            self.unavailable.discard(i)
            return await _on_worker(method(w), *args, wait_s=self.restart_wait_s)

        return list(await asyncio.gather(*(one(i, w) for i, w in enumerate(workers))))

    async def serve_latest(self) -> int:
        """Make the generation workers serve the trainer's newest weights (before an evaluation: in the
        continuous modes the last published version is otherwise applied only by the next step).
        Returns that version. Harmless mid-run: the next step finds it applied already."""
        version = await acall(self.c.trainer.version)
        await self._apply(version)
        return version

    async def step(self, phase: Phase | None = None) -> dict[str, Any]:
        """One iteration; returns its metrics (train metrics + protocol timings).

        `phase(name, fn)` runs each step of the protocol (e.g. as a Prefect task); by default it just
        awaits `fn()`. The order and the mode logic live only here.
        """
        run = phase or _direct
        t0 = time.perf_counter()
        version = await acall(self.c.trainer.version)

        async def get_batch() -> tuple[dict[str, int], Any]:  # (its size, the groups or their ObjectRef)
            return await acall_split(self.c.rollout.take_batch, self.batch_groups, version, self.timeout_s)

        async def sync_weights() -> dict[str, float]:  # suspend -> update -> resume, then the bound
            out = await self._apply(version)
            await acall(self.c.rollout.advance, version)
            if self.policy.waves and not self.policy.on_policy:  # one-off: the next batch is made
                await acall(self.c.rollout.release_wave, 1)  # while this one trains (one step behind)
            return out

        async def train_step() -> dict[str, Any]:
            t = time.perf_counter()
            out = await acall(self.c.trainer.train_step, groups)
            return {**out, "train_s": time.perf_counter() - t}

        size, groups = await run("get_batch", get_batch)  # 1
        t_batch = time.perf_counter()
        # 2-5 on the generation workers, 6 on the trainer: the batch is taken, so training does not wait for
        # the workers' update (in sync and sync+ the last step's next_wave made it already: nothing to do)
        sync, metrics = await _both(run("sync_weights", sync_weights), run("train_step", train_step))
        publish = await run("publish_weights", self._publish_and_prefetch)
        if self.policy.on_policy:

            async def next_wave() -> dict[str, float]:  # on-policy: the next wave uses the new weights
                out = await self._apply(version + 1)
                await acall(self.c.rollout.release_wave, 1)
                return out

            sync.update(await run("sync_weights_next", next_wave))
        metrics.update(
            sync,
            **publish,
            wait_batch_s=t_batch - t0,
            batch_action_tokens=size["action_tokens"],
            gen_workers_unavailable=len(self.unavailable),
            step_s=time.perf_counter() - t0,
            version=version + 1,
        )
        return metrics


async def _direct(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()


async def _both(a: Awaitable[Any], b: Awaitable[Any]) -> tuple[Any, Any]:
    """`a` and `b` at once; both run to their end (a failing train step does not leave the workers half
    updated or the proxy suspended), then the first error, if any, is raised."""
    out = await asyncio.gather(a, b, return_exceptions=True)
    for x in out:
        if isinstance(x, BaseException):
            raise x
    return out[0], out[1]


async def _answers(w: GenerationWorker, wait_s: float) -> bool:
    """Whether worker `w` answers a ping within `wait_s` (at least one try of up to a second)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            await asyncio.wait_for(acall(w.ping), timeout=max(1.0, min(5.0, deadline - time.monotonic())))
            return True
        except (TimeoutError, RayActorError):  # restarting (or dead for good: it never answers)
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)


async def _on_worker(method: Any, *args: Any, wait_s: float) -> Any:
    """`acall` a generation worker's weight `method` (idempotent); while Ray restarts the worker, wait."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await acall(method, *args)
        except ActorUnavailableError:  # restarting; a worker dead for good raises ActorDiedError
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
