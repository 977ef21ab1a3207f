"""weight-sync's window: one batch's rollout of async-modes' workload (`bench/weight_sync.py` module doc),
measured with real `sync+` steps, or taken from an async-modes payload that ran the same workload."""

from __future__ import annotations

import statistics
from typing import Any

WINDOW_STEPS = 3  # measured sync+ steps (after one warm-up) whose median rollout is the window

WORKLOAD = ("size", "group_size", "batch_groups", "concurrency", "turns", "max_turns", "max_tokens", "env_ms",
            "env_sigma_ms", "store")  # fmt: skip  # the fields of `measure_window`'s run that shape a rollout


def window_from_async_modes(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The window from an `async-modes` payload: the median rollout of its sync+ runs (each run's mean
    `wait_batch_s`), when they ran `measure_window`'s workload; else None."""
    from bench.async_runs import RunSettings

    config, runs, mine = payload.get("config", {}), payload.get("runs", {}).get("sync+"), RunSettings()
    if not runs or any(config.get(k) != getattr(mine, k) for k in WORKLOAD):
        return None
    rollout = [float(r["wait_batch_s"]) for r in runs]
    source = f"async-modes' sync+ rollout, median of its {len(rollout)} runs in this suite"
    return {"window_s": statistics.median(rollout), "source": source, "rollout_s": rollout}


def measure_window(seed: int) -> dict[str, Any]:
    """The window: the median rollout of `WINDOW_STEPS` real `sync+` steps (`bench/weight_sync.py` doc)."""
    from bench.async_runs import RunSettings, run_all

    s = RunSettings(warmup=1, steps=WINDOW_STEPS, rounds=1, seed=seed)
    [[run]] = run_all(s, [("sync+", 0)])
    rollout = [float(m["wait_batch_s"]) for m in run["steps"]]
    return {"window_s": statistics.median(rollout), "source": "measured: sync+ rollout", "rollout_s": rollout}
