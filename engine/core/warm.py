"""WarmWorkers: worker processes kept between runs, so the next run skips their start-up.

A model-holding worker's process spends most of its start-up importing torch and transformers (~6 CPU-s
on this project's CPUs), more than a short run trains. A Cluster given a `WarmWorkers` retires its workers
at shutdown instead of killing them: each drops its run's state (`retire()`: model, optimiser, engine)
and waits here, still holding its Ray resources. The next Cluster that needs a worker of the same class
with the same Ray options takes it and rebuilds it from the new run's config (`reinit`, the constructor
again in the same process); the rest are killed (`drain`) so their resources are free. The run's
LLMProxy is kept the same way (engine/experiment.py, filed under `PROXY_KEY`).

A run's Mooncake master is kept here too (`keep_master`): the next run on the same host publishes
through it under its own run id, and the retired workers' store clients stay open for it
(infra/weightstore/factory.py `release_store`) instead of each closing and registering again.

For a sequence of runs on one Ray (a benchmark's configurations, a test module's runs), used as a context
manager (leaving it kills the idle workers and stops the kept master); a run that does not pass one
starts and kills its processes as before.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import ray
from ray.exceptions import RayActorError


class WarmWorkers:
    def __init__(self) -> None:
        self._idle: dict[Hashable, list[Any]] = {}  # key (class and Ray options) -> idle actor handles
        self.reused = 0  # workers handed to a later run so far
        self.retired = 0  # workers taken back so far
        self._master: Any = None  # a MooncakeMaster (infra/weightstore/mooncake_master.py) kept, or None

    def take(self, key: Hashable) -> Any | None:
        """An idle worker made with `key`, or None."""
        idle = self._idle.get(key)
        if not idle:
            return None
        self.reused += 1
        return idle.pop()

    def give(self, key: Hashable, actor: Any) -> None:
        """Keep a retired worker for the next run that needs one like it."""
        self._idle.setdefault(key, []).append(actor)
        self.retired += 1

    def idle(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def drain(self) -> None:
        """Kill every idle worker: what a run did not take would hold its Ray resources from the run. (After
        `ray.shutdown` they are gone already.)"""
        for actors in self._idle.values():
            for a in actors:
                if ray.is_initialized():
                    ray.kill(a, no_restart=True)
        self._idle.clear()

    def take_master(self, host: str) -> Any | None:
        """The kept Mooncake master if it listens on `host` (one elsewhere is stopped), or None."""
        master, self._master = self._master, None
        if master is not None and master.host != host:
            master.stop()
            return None
        return master

    def keep_master(self, master: Any) -> None:
        """Keep a run's Mooncake master for the next run (the run's own keys already removed by its
        trainer's `retire`); one kept before is stopped."""
        if self._master is not None and self._master is not master:
            self._master.stop()
        self._master = master

    def close(self) -> None:
        """Kill the idle workers and stop the kept master."""
        self.drain()
        if self._master is not None:
            self._master.stop()
            self._master = None

    def __enter__(self) -> WarmWorkers:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def retired(ref: Any, timeout_s: float = 60.0) -> bool:
    """Whether a worker's `retire()` (its result `ref`) let go of its run so the process can serve another:
    False if it declined, died or hung."""
    try:
        return bool(ray.get(ref, timeout=timeout_s))
    except (RayActorError, ray.exceptions.GetTimeoutError, ray.exceptions.RayTaskError):
        return False
