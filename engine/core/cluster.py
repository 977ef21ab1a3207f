"""Cluster: spawns one role's workers as Ray actors where the ResourceManager bound them, and binds
each decorated Worker method onto itself so `cluster.method(...)` dispatches as declared.

`cluster.m(...)` blocks and returns the result(s); `await cluster.m.aio(...)` is the async form.
`Cluster(..., wait=False)` returns as soon as its actors are requested; `ready()` then waits for them, so a
run starts all its roles at once and their processes import in parallel.
A worker found dead (by `check()` or by a failed call) is rebound and respawned; the failed call is
retried once on the replacement. With `max_restarts`, Ray itself restarts a worker whose process died
(same handle, same placement); calls in flight then fail and the caller retries them (the LLMProxy does).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError

from engine.config import GPU_KINDS, RoleConfig
from engine.core.decorators import DispatchSpec, dispatch_spec
from engine.core.handles import RankGroup
from engine.core.resources import ResourceManager, ray_resource
from engine.core.routing import pick
from engine.core.warm import WarmWorkers, retired
from engine.core.worker import Worker
from infra.metadata import BindingRow
from infra.serverless import ServerlessClient


@dataclass
class WorkerHandle:
    rank: int
    actor: Any  # ray.actor.ActorHandle
    binding: BindingRow
    kind: str
    capacity: int = 1
    outstanding: int = 0
    calls: int = 0  # calls routed here so far: ties go to the least used (spreads load)
    warm_key: Hashable = None  # what a WarmWorkers files the process under once it is retired


def gpus_for(kind: str, units: int, cluster_gpus: float, share: float | None = None) -> float:
    """The GPUs Ray gives a worker holding `units` of a pool of `kind`: when the Ray cluster has GPUs,
    `share` (the role's `gpus`; a fraction colocates roles on one GPU) or one per unit of a GPU pool;
    none otherwise — on a machine without GPUs the GPU pools are placement labels (optionally CPU cores).
    A worker given no GPU hides them from itself (`Worker.__init__`)."""
    if kind not in GPU_KINDS or not cluster_gpus:
        return 0.0
    return float(units) if share is None else share


class Cluster:
    def __init__(
        self,
        name: str,
        worker_cls: type[Worker],
        rm: ResourceManager,
        role: RoleConfig,
        worker_config: dict[str, Any] | None = None,
        serverless_urls: dict[str, str] | None = None,
        serverless_token: str | None = None,
        serverless_timeout_s: float = 30.0,
        serverless_retries: int = 3,
        max_concurrency: int = 1,
        namespace: str | None = None,
        max_restarts: int = 0,
        wait: bool = True,
        warm: WarmWorkers | None = None,
    ):
        if not ray.is_initialized():
            raise RuntimeError("Cluster needs Ray: call ray.init(resources=rm.ray_resources) first")
        self.name = name
        self.worker_cls = worker_cls
        self.rm = rm
        self.role = role
        self.worker_config = worker_config or {}
        self.max_concurrency = max_concurrency
        self.namespace = namespace
        self.max_restarts = max_restarts
        # processes kept between runs (engine/core/warm.py): only for a role that can retire its workers
        self.warm = warm if hasattr(worker_cls, "retire") else None
        self.serverless = {
            k: ServerlessClient(
                u, token=serverless_token, timeout_s=serverless_timeout_s, retries=serverless_retries
            )
            for k, u in (serverless_urls or {}).items()
        }
        self.routes: Counter[str] = Counter()  # pool -> hw_mapping calls sent there
        self.fallback_calls = 0
        self.restarts = 0
        self._starting: list[tuple[BindingRow, Any]] = []  # (binding, ping ref) not yet answered
        self._retiring: list[Any] = []  # the workers' retire() refs, once asked (`begin_retiring`)
        self.workers = self._spawn(
            [
                (rank, rm.bind(self._wname(rank), worker_cls.role.value, role.pool, role.units))
                for rank in range(role.count)
            ]
        )
        self.specs: dict[str, DispatchSpec] = {}  # method -> how it is dispatched (its decorator)
        for attr in dir(worker_cls):
            spec = dispatch_spec(getattr(worker_cls, attr, None))
            if spec is not None:
                self.specs[attr] = spec
                setattr(self, attr, _BoundMethod(self, attr, spec))
        if wait:
            self.ready()

    def _wname(self, rank: int) -> str:
        return f"{self.name}-{rank}"

    def _spawn(self, bound: list[tuple[int, BindingRow]]) -> list[WorkerHandle]:
        """Request one actor per (rank, binding) at once; `ready()` records where each landed."""
        for _, b in bound:
            res, have = ray_resource(b.pool), ray.cluster_resources().get(ray_resource(b.pool), 0)
            if have < b.units:
                for _, other in bound:
                    self.rm.release(other)
                raise RuntimeError(
                    f"Ray cluster has {have} of resource '{res}' (pool {b.pool}) but a worker "
                    f"needs {b.units}: start Ray with resources=rm.ray_resources"
                )
        have_gpus = ray.cluster_resources().get("GPU", 0)
        gpus = {b.id: gpus_for(self.rm.kind(b.pool), b.units, have_gpus, self.role.gpus) for _, b in bound}
        short = [b for _, b in bound if gpus[b.id] > have_gpus]
        if short:
            for _, other in bound:
                self.rm.release(other)
            raise RuntimeError(
                f"pool {short[0].pool}: a worker needs {gpus[short[0].id]:g} GPUs, the Ray cluster has "
                f"{have_gpus:g}"
            )
        handles = []
        for rank, b in bound:
            options = {
                "resources": {ray_resource(b.pool): b.units},
                "num_gpus": gpus[b.id],
                "num_cpus": 0,
                "max_concurrency": self.max_concurrency,
                "max_restarts": self.max_restarts,
            }
            kind, cores = self.rm.kind(b.pool), self.rm.pools[b.pool].cores
            args = (self._wname(rank), rank, self.role.count, b.pool, kind, self.worker_config)
            key = (self.worker_cls.__qualname__, repr(sorted(options.items())))
            actor = self.warm.take(key) if self.warm is not None else None
            if actor is None:
                made = ray.remote(self.worker_cls).options(namespace=self.namespace, **options)
                actor = made.remote(*args, cores=cores)
                # ray types an actor handle's methods as the class's plain functions, which have no .remote
                first = actor.ping.remote()  # type: ignore[attr-defined]
            else:  # a warm process: the constructor again, with this run's config
                first = actor.reinit.remote(*args, cores=cores)
            self._starting.append((b, first))
            handles.append(WorkerHandle(rank, actor, b, kind, self.max_concurrency, warm_key=key))
        return handles

    def ready(self) -> Cluster:
        """Wait until every requested worker answers (raises what its constructor raised); record the node
        each landed on."""
        starting, self._starting = self._starting, []
        infos = ray.get([ref for _, ref in starting])
        for (b, _), info in zip(starting, infos, strict=True):
            self.rm.store.set_binding(b.id, node=info["node"])
        return self

    # liveness ------------------------------------------------------------------------------------
    def _replace(self, w: WorkerHandle) -> WorkerHandle:
        ray.kill(w.actor, no_restart=True)
        [new] = self._spawn([(w.rank, self.rm.rebind(w.binding))])
        self.ready()
        self.workers[w.rank] = new
        self.restarts += 1
        return new

    def check(self) -> int:
        """Ping every worker; rebind and respawn dead ones. Returns how many were replaced."""
        dead = []
        for w in self.workers:
            try:
                ray.get(w.actor.ping.remote(), timeout=30)
            except RayActorError:
                dead.append(w)
        for w in dead:
            self._replace(w)
        return len(dead)

    def begin_retiring(self) -> None:
        """Ask every worker to retire (when the cluster has a WarmWorkers), without waiting: `shutdown` then
        collects the answers, so the clusters of a run retire theirs at once."""
        if self.warm is not None and not self._retiring:
            self._retiring = [w.actor.retire.remote() for w in self.workers]

    def shutdown(self) -> None:
        """Kill the workers, or retire them into the WarmWorkers the cluster was given (a worker that cannot
        retire, or does not answer, is killed); free their pool units either way."""
        self.begin_retiring()
        warm = self.warm
        kept = [retired(ref) for ref in self._retiring] if warm is not None else [False] * len(self.workers)
        for w, keep in zip(self.workers, kept, strict=True):
            if keep and warm is not None:
                warm.give(w.warm_key, w.actor)
            else:
                ray.kill(w.actor, no_restart=True)
            self.rm.release(w.binding)
        self.workers, self._retiring = [], []

    # routing -------------------------------------------------------------------------------------
    def ranks(self) -> RankGroup:
        """The workers as one actor-like handle whose `@register` methods every worker takes in lockstep
        (`group.m.remote(...)` gives rank 0's result): how a run calls its trainer, one rank or several."""
        declared = frozenset(m for m, spec in self.specs.items() if spec.kind == "all")
        return RankGroup([w.actor for w in self.workers], declared)

    def serverless_client(self, method: str) -> ServerlessClient:
        """The client a `@register_serverless` method calls (picklable: a caller in another actor, the
        rollout's score function, holds it); a method declared otherwise, or without a URL, is refused."""
        spec = self.specs.get(method)
        if spec is None or spec.kind != "serverless":
            raise ValueError(f"{self.name}: {self.worker_cls.__name__}.{method} is not a serverless method")
        return _BoundMethod(self, method, spec)._serverless()

    def hw_tag(self, method: str) -> str:
        """The tag an `hw_mapping` method routes by (a router outside the cluster, the LLMProxy, routes the
        method's calls as declared); a method declared otherwise is refused."""
        spec = self.specs.get(method)
        if spec is None or spec.kind != "hw":
            raise ValueError(f"{self.name}: {self.worker_cls.__name__}.{method} is not an hw_mapping method")
        return spec.tag_name

    def targets(
        self, spec: DispatchSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[WorkerHandle]:
        if spec.kind == "all":
            return list(self.workers)
        try:
            w, fallback = pick(self.workers, spec.tag(args, kwargs))
        except (RuntimeError, TypeError) as e:
            raise type(e)(f"{self.name}: {e}") from None
        self.fallback_calls += fallback
        self.routes[w.binding.pool] += 1
        w.calls += 1
        return [w]


class _BoundMethod:
    def __init__(self, cluster: Cluster, method: str, spec: DispatchSpec):
        self.cluster, self.method, self.spec = cluster, method, spec

    def _serverless(self) -> ServerlessClient:
        client = self.cluster.serverless.get(self.spec.endpoint)
        if client is None:
            raise RuntimeError(
                f"{self.cluster.name}.{self.method}: no URL for serverless endpoint "
                f"'{self.spec.endpoint}' (pass serverless_urls)"
            )
        return client

    def _result(self, results: list[Any]) -> Any:
        return results if self.spec.kind == "all" else results[0]

    def _begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[WorkerHandle]:
        targets = self.cluster.targets(self.spec, args, kwargs)
        for w in targets:
            w.outstanding += 1
        return targets

    def _end(self, targets: list[WorkerHandle]) -> None:
        for w in targets:
            w.outstanding -= 1

    def _send(self, targets: list[WorkerHandle], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        return [getattr(w.actor, self.method).remote(*args, **kwargs) for w in targets]

    def _recover(self, targets: list[WorkerHandle]) -> list[WorkerHandle]:
        """A target died: replace the dead ones (once, even if several calls saw it) for a retry."""
        c = self.cluster
        for w in targets:
            if c.workers[w.rank] is w:
                c._replace(w)
        return [c.workers[w.rank] for w in targets]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.spec.kind == "serverless":
            return self._serverless().call(*args, **kwargs)
        targets = self._begin(args, kwargs)
        try:
            try:
                results = ray.get(self._send(targets, args, kwargs))
            except RayActorError:
                results = ray.get(self._send(self._recover(targets), args, kwargs))
        finally:
            self._end(targets)
        return self._result(results)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        if self.spec.kind == "serverless":
            return await self._serverless().acall(*args, **kwargs)
        targets = self._begin(args, kwargs)
        try:
            try:
                results = await asyncio.gather(*self._send(targets, args, kwargs))
            except RayActorError:
                fresh = await asyncio.to_thread(self._recover, targets)
                results = await asyncio.gather(*self._send(fresh, args, kwargs))
        finally:
            self._end(targets)
        return self._result(list(results))
