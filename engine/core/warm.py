"""WarmWorkers: worker processes kept between runs, so the next run skips their start-up.

A model-holding worker's process spends most of its start-up importing torch and transformers (~6 CPU-s
on this project's CPUs), more than a short run trains. A Cluster given a `WarmWorkers` retires its workers
at shutdown instead of killing them: each drops its run's state (`retire()`: model, optimiser, engine,
store clients) and waits here, still holding its Ray resources. The next Cluster that needs a worker of
the same class with the same Ray options takes it and rebuilds it from the new run's config (`reinit`,
the constructor again in the same process); the rest are killed (`drain`) so their resources are free.

For a sequence of runs on one Ray (a benchmark's configurations, a test module's runs); a run that
does not pass one starts and kills its processes as before.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import ray


class WarmWorkers:
    def __init__(self) -> None:
        self._idle: dict[Hashable, list[Any]] = {}  # key (class and Ray options) -> idle actor handles
        self.reused = 0  # workers handed to a later run so far
        self.retired = 0  # workers taken back so far

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

    def __enter__(self) -> WarmWorkers:
        return self

    def __exit__(self, *_: object) -> None:
        self.drain()
