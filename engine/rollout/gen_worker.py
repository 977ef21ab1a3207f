"""GenerationWorker: the ActorGen role — one inference engine, serving while it prefetches weights.

`generate` serves requests (continuous batching inside the backend). `prefetch(v)` starts pulling
version v's buckets from the weight store in the background while serving goes on; `update(v)` — run
while the LLMProxy holds new requests — waits for whatever of the pull is left (the *exposed* part)
and loads the weights in place; outputs then carry version v.

Fault injection (`faults.gen_kill_after_requests`, config key `kill_after_requests`): worker 0's process
exits on its N-th request, in-flight requests and all. Ray restarts the actor (the Cluster gives it
`max_restarts`); the restarted incarnation does not die again, and the LLMProxy retries the lost requests
on another worker. A restarted worker loads the newest published version in its constructor, before it
serves (Ray queues the calls sent to it meanwhile), so it never answers with the initial weights.

torch and the engine are imported in the actor's process when it starts, not by the driver that only
names the class.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import TYPE_CHECKING, Any

from engine.core.decorators import hw_mapping
from engine.core.worker import Role, Worker, device, latest_args, restarted
from engine.rollout.gen_worker_args import GenerationWorkerArgs
from engine.types import GenOutput, GenRequest
from infra.weightstore.factory import open_store, release_store

if TYPE_CHECKING:
    from engine.backends.base import GenerationBackend
    from engine.weights.transfer import WeightPrefetcher

# engines a process can close and build again (`retire`); vLLM's only on a CPU: there its engine runs in
# this process and closing it gives its memory back (RSS flat over 5 builds and closes; a new engine in a
# process that had one starts in ~2 s against ~13 s for a new process). On a GPU that is untested: not reused.
REUSABLE_BACKENDS = ("hf", "modelled")
CPU_REUSABLE_BACKENDS = ("vllm",)


def _on_cpu() -> bool:
    import torch  # (here, not at the top: a modelled backend's worker never needs it)

    return not torch.cuda.is_available()


class GenerationWorker(Worker):
    """config: the fields of `engine/rollout/gen_worker_args.py` `GenerationWorkerArgs`."""

    role = Role.ACTOR_GEN

    def __init__(self, *args: Any, **kwargs: Any):
        args, kwargs = latest_args(args, kwargs)  # restarted after a `reinit`: that run's worker again
        super().__init__(*args, **kwargs)

        from engine.backends import make_backend

        conf = GenerationWorkerArgs.model_validate(self.config)
        if conf.threads:  # before the engine is built; also in a process rebuilt for another run (`reinit`)
            from engine.backends.threads import set_threads  # (torch: not imported by a modelled worker)

            set_threads(conf.threads)
        spec = dict(conf.backend)
        if spec["kind"] == "hf":  # on the GPU Ray gave this worker, if any (vLLM finds it by itself)
            spec.setdefault("device", device())
        self.backend: GenerationBackend = make_backend(spec.pop("kind"), **spec)
        store = conf.store
        self.prefetcher: WeightPrefetcher | None = None
        if store:  # (torch, which the prefetcher needs: imported only then)
            from engine.weights.transfer import WeightPrefetcher

            self.prefetcher = WeightPrefetcher(open_store(store), conf.run_id)
        kill = conf.kill_after_requests
        self.requests = 0
        again = restarted()
        self.kill_after: int | None = kill if kill and self.rank == 0 and not again else None
        if again and self.prefetcher is not None:
            self._rejoin(self.prefetcher)

    async def retire(self) -> bool:
        """Reusable with an engine this process can close and build again (`REUSABLE_BACKENDS`, and vLLM
        on a CPU) and not a restarted incarnation (its constructor rejoins a run): close the engine, hand
        the store client back (kept open for a next run on the same store); `reinit` builds them anew from
        the next run's config."""
        kind = self.config["backend"]["kind"]
        if restarted() or not (kind in REUSABLE_BACKENDS or (kind in CPU_REUSABLE_BACKENDS and _on_cpu())):
            return False
        await self.backend.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
            release_store(self.config["store"], self.prefetcher.store)
        del self.backend, self.prefetcher
        gc.collect()
        return True

    def _rejoin(self, prefetcher: WeightPrefetcher) -> None:
        """Load the newest published weights (none published yet: the initial ones are current)."""
        version = prefetcher.latest()
        if version is not None:
            tensors, _ = prefetcher.wait(version)
            self.backend.load_weights(tensors.items(), version)
            prefetcher.release(version)

    @hw_mapping(tag_name="profile")  # a request goes to the pool whose kind suits its task's workload
    async def generate(self, request: GenRequest) -> GenOutput:
        self.requests += 1
        if self.kill_after is not None and self.requests >= self.kill_after:
            os._exit(1)  # injected fault: the process dies with every request it holds
        return await self.backend.generate(request)

    async def abort(self, request_id: str) -> None:
        await self.backend.abort(request_id)

    def version(self) -> int:
        return self.backend.version

    def prefetch(self, version: int) -> None:
        if self.prefetcher is None:
            raise RuntimeError(f"{self.name}: no weight store configured, cannot prefetch")
        self.prefetcher.start(version)

    async def update(self, version: int) -> dict[str, float]:
        """Apply a prefetched version in place. Returns pull/exposed/load timings (seconds)."""
        if self.prefetcher is None:
            raise RuntimeError(f"{self.name}: no weight store configured, cannot update")
        tensors, timings = await asyncio.to_thread(self.prefetcher.wait, version)
        t0 = time.perf_counter()
        self.backend.load_weights(tensors.items(), version)  # copies them into the engine's weights
        self.prefetcher.release(version)
        return {**timings, "load_s": time.perf_counter() - t0}

    def load_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        """Direct path (no store): weights passed through Ray's object store."""
        self.backend.load_weights(named_tensors.items(), version)
