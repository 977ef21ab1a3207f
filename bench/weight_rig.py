"""The two sides of `rollart bench weight-sync`'s measurement besides the trainer: the generation worker's
pull in its own process (`Puller`, a Ray actor), the store it reads from, and a CPU load for the loaded
window (`CpuLoad`)."""

from __future__ import annotations

import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from subprocess import PIPE, Popen
from typing import Any

_SPIN = "import sys, time\nfor end in map(float, sys.stdin):\n    while time.monotonic() < end: pass\n"


class CpuLoad:
    """`procs` processes that each busy-loop until the deadline they are sent (idle, blocked, otherwise)."""

    def __init__(self, procs: int) -> None:
        self.procs = [Popen([sys.executable, "-S", "-c", _SPIN], stdin=PIPE, text=True) for _ in range(procs)]
        self.pipes = [p.stdin for p in self.procs if p.stdin]

    def spin_for(self, seconds: float) -> None:
        """Load every core for `seconds` (this process sleeps meanwhile)."""
        end = time.monotonic() + seconds
        for pipe in self.pipes:
            pipe.write(f"{end!r}\n")
            pipe.flush()
        time.sleep(max(end - time.monotonic(), 0.0))

    def close(self) -> list[int]:
        """Stop the loops; their exit codes."""
        for pipe in self.pipes:
            pipe.close()
        return [p.wait() for p in self.procs]


class Puller:
    """The generation worker's side of the weight path, alone: `WeightPrefetcher`s in their own process."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from infra.weightstore.factory import open_store

        self.store = open_store(spec)
        self.prefetchers: dict[str, Any] = {}
        self.started: dict[tuple[str, int], float] = {}

    def start(self, run_id: str, version: int) -> None:
        from engine.weights.transfer import WeightPrefetcher

        if run_id not in self.prefetchers:
            self.prefetchers[run_id] = WeightPrefetcher(self.store, run_id)
        self.started[run_id, version] = time.perf_counter()  # the pool is idle: the pull starts now
        self.prefetchers[run_id].start(version)

    def wait(self, run_id: str, version: int) -> dict[str, float]:
        """Timings of `version`'s pull and when it started; the tensors are dropped (nowhere to load)."""
        timings = self.prefetchers[run_id].wait(version)[1]
        self.prefetchers[run_id].release(version)  # as a worker does once it loaded them
        return timings | {"started_at": self.started.pop((run_id, version))}

    def close(self) -> None:
        for prefetcher in self.prefetchers.values():
            prefetcher.close()
        self.store.close()


def store_spec(kind: str, segment_bytes: int, stack: ExitStack) -> dict[str, Any]:
    """How to open the store; a Mooncake master (and its log folder) lives as long as `stack`."""
    if kind == "ray":
        return {"kind": "ray", "name": "bench-weights", "namespace": "bench"}
    from infra.weightstore.mooncake_master import MooncakeMaster

    logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rollart-ws-")))
    master = stack.enter_context(MooncakeMaster(log_dir=logs))
    addresses = {"master_addr": master.master_addr, "metadata_url": master.metadata_url}
    # each client's start-up lines (glog, before its level applies) go to the folder, not the terminal
    return {"kind": "mooncake", **addresses, "segment_bytes": segment_bytes, "log_dir": str(logs)}
