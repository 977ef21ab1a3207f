"""LLMProxy: the gateway between env loops and generation workers (paper §6.1).

- Routing per request, as `GenerationWorker.generate` declares it (`@hw_mapping(tag_name="profile")`):
  the request's tag (its task's workload profile) picks the preferred pool kind (affinity), then the
  least-loaded worker there (fallback to a compatible pool when it is saturated), with the Cluster's own
  `engine.core.routing.pick`; requests of one trajectory stick to the worker that served its previous
  turn, for prefix-cache reuse, while that worker has room. Routed calls are counted per (tag, pool).
- `suspend()` stops admitting new requests and waits until in-flight ones are done; `resume()` lets the
  waiting ones through. The weight update happens in between.
- Each request's timings (time held by a suspend, time in the worker, proxy overhead) are recorded.
- A worker whose process died (`RayActorError`) fails the requests it held; each is retried (up to
  `max_retries` times) on another worker, and the dead one is routed around until the next weight update
  has reached every worker (`resume()`), so a worker Ray restarted rejoins serving the current version.

Plain async class; run it as a Ray async actor (`ray.remote(LLMProxy)`) to share it between env loops.
Workers are local objects with `async generate(req)` or Ray actor handles with the same method.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import RayActorError

from engine.core.handles import acall
from engine.core.routing import pick
from engine.types import GenOutput, GenRequest


@dataclass
class GenSlot:
    name: str
    kind: str  # pool kind of the worker (gpu-compute / gpu-bandwidth ...)
    target: Any  # object with `async generate(req)` / `abort(id)`, or a Ray actor handle
    capacity: int = 64  # requests it batches at once before it counts as busy
    pool: str = ""  # the pool it is bound to (routes are counted per pool)
    outstanding: int = 0
    calls: int = 0
    down: bool = False  # died; routed around until the next weight update reached it

    async def generate(self, req: GenRequest) -> GenOutput:
        return await acall(self.target.generate, req)

    async def abort(self, request_id: str) -> None:
        if hasattr(self.target, "abort"):
            await acall(self.target.abort, request_id)


@dataclass
class ProxyStats:
    requests: int = 0
    sticky_hits: int = 0
    fallbacks: int = 0
    retried: int = 0  # requests sent again because their worker died
    worker_failures: Counter[str] = field(default_factory=Counter)
    per_worker: Counter[str] = field(default_factory=Counter)
    routes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tag, pool) -> affinity routes
    timings: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=20000))


class LLMProxy:
    def __init__(
        self,
        workers: list[GenSlot],
        max_sticky: int = 100_000,
        max_retries: int = 3,
        tag_name: str = "profile",
    ):
        if not workers:
            raise ValueError("LLMProxy needs at least one generation worker")
        if tag_name not in GenRequest.__dataclass_fields__:
            raise ValueError(f"LLMProxy: requests have no field '{tag_name}' to route by")
        self.tag_name = tag_name
        self.workers = {w.name: w for w in workers}
        self.stats = ProxyStats()
        self._sticky: OrderedDict[str, str] = OrderedDict()  # trajectory -> worker, LRU-bounded
        self._max_sticky = max_sticky
        self.max_retries = max_retries
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._sent: dict[str, GenSlot] = {}  # request id -> the worker serving it, while it is there

    # -- routing -----------------------------------------------------------------------------------
    def _route(self, req: GenRequest) -> GenSlot:
        name = self._sticky.get(req.trajectory_id) if req.trajectory_id else None
        if name is not None:
            w = self.workers.get(name)
            if w is not None and not w.down and w.outstanding < w.capacity:
                self.stats.sticky_hits += 1
                self._sticky.move_to_end(req.trajectory_id)
                return w
        live = [w for w in self.workers.values() if not w.down]
        tag = str(getattr(req, self.tag_name))
        w, fallback = pick(live or list(self.workers.values()), tag)  # all down: Ray restarts them
        self.stats.fallbacks += fallback
        self.stats.routes[tag, w.pool or w.kind] += 1
        if req.trajectory_id:
            self._sticky[req.trajectory_id] = w.name
            self._sticky.move_to_end(req.trajectory_id)
            while len(self._sticky) > self._max_sticky:
                self._sticky.popitem(last=False)
        return w

    def release(self, trajectory_id: str) -> None:
        """The trajectory ended: forget its sticky worker."""
        self._sticky.pop(trajectory_id, None)

    # -- serving -----------------------------------------------------------------------------------
    async def generate(self, req: GenRequest) -> GenOutput:
        t0 = time.perf_counter()
        for attempt in range(self.max_retries + 1):
            await self._open.wait()  # a retry, too, waits out a suspend
            t_admit = time.perf_counter()
            w = self._route(req)
            try:
                t_send = time.perf_counter()
                out = await self._send(w, req)
                break
            except RayActorError:
                w.down = True
                self.stats.worker_failures[w.name] += 1
                self._sticky.pop(req.trajectory_id, None)
                if attempt == self.max_retries:
                    raise
                self.stats.retried += 1
        t_end = time.perf_counter()
        self.stats.requests += 1
        self.stats.per_worker[w.name] += 1
        out.worker = w.name
        out.timings.update(suspended_s=t_admit - t0, worker_s=t_end - t_send, proxy_s=(t_send - t_admit))
        self.stats.timings.append(out.timings)
        return out

    async def _send(self, w: GenSlot, req: GenRequest) -> GenOutput:
        w.outstanding += 1
        w.calls += 1
        self._in_flight += 1
        self._idle.clear()
        self._sent[req.request_id] = w
        try:
            return await w.generate(req)
        except asyncio.CancelledError:
            with contextlib.suppress(RayActorError):  # don't leave the engine decoding for nobody
                await asyncio.shield(w.abort(req.request_id))
            raise
        finally:
            self._sent.pop(req.request_id, None)
            w.outstanding -= 1
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def suspend(self) -> float:
        """Stop admitting requests; return once in-flight ones finished (seconds waited)."""
        t0 = time.perf_counter()
        self._open.clear()
        await self._idle.wait()
        return time.perf_counter() - t0

    def resume(self) -> None:
        """Admit requests again. The weight update just reached every worker: dead ones are back."""
        for w in self.workers.values():
            w.down = False
        self._open.set()

    @property
    def suspended(self) -> bool:
        return not self._open.is_set()

    # -- reuse across runs (engine/core/warm.py) -----------------------------------------------------
    async def retire(self, drain_s: float = 5.0) -> bool:
        """Let go of this run's workers and counts, so the process can route another run's, once the
        requests the stopped rollout left in flight have ended: they are aborted first (their trajectories
        were cancelled, nobody reads them; a sync+ run's next batch left generating took 4.4 s to finish
        a SmolLM2 run's teardown); False if they outlast `drain_s`."""
        await asyncio.gather(*(w.abort(rid) for rid, w in list(self._sent.items())), return_exceptions=True)
        try:
            await asyncio.wait_for(self._idle.wait(), drain_s)
        except TimeoutError:
            return False
        self.workers, self._sticky = {}, OrderedDict()
        return True

    def reinit(self, *args: Any, **kwargs: Any) -> None:
        """Become the proxy of a new run, as the constructor would build it."""
        type(self).__init__(self, *args, **kwargs)

    def summary(self) -> dict[str, Any]:
        t = list(self.stats.timings)
        mean = (lambda k: sum(x.get(k, 0.0) for x in t) / len(t)) if t else (lambda k: 0.0)
        return {
            "requests": self.stats.requests,
            "sticky_hits": self.stats.sticky_hits,
            "fallbacks": self.stats.fallbacks,
            "retried": self.stats.retried,
            "worker_failures": dict(self.stats.worker_failures),
            "per_worker": dict(self.stats.per_worker),
            "routes": [[tag, pool, n] for (tag, pool), n in sorted(self.stats.routes.items())],
            "mean_worker_s": mean("worker_s"),
            "mean_proxy_s": mean("proxy_s"),
            "mean_suspended_s": mean("suspended_s"),
        }
