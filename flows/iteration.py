"""One training iteration as a Prefect flow, run by the driver that owns the run's live objects.

`LiveRun` holds what a running driver built (the Experiment with its actors, the iteration protocol, the
metrics sink); its `iteration` flow runs the six-step protocol with every phase as a Prefect task, records
the step in the metadata store, writes metrics (jsonl, TensorBoard, the run's table artifact) and checkpoints
every k steps. The flow machinery's share of each step's time is measured and reported.

A failing `train_step` phase is retried `train.step_retries` times, only while the failed attempt applied
nothing (the trainer's version did not move).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prefect import flow

from engine.experiment import Experiment
from engine.protocol import IterationProtocol
from flows.observe import MetricsSink
from flows.report import slug
from tasks.checkpoint import save_checkpoint
from tasks.phase import run_phase


@dataclass
class LiveRun:
    """The live objects of one driver run: owned by its train flow, gone with it."""

    exp: Experiment
    proto: IterationProtocol
    sink: MetricsSink

    @flow(name="rollart-iteration", flow_run_name="{experiment} step {step}", validate_parameters=False)
    async def iteration(self, experiment: str, step: int, last: int) -> dict[str, Any]:
        """Train step `step` (1-based) of `last`; `experiment` names the run in the UI."""
        exp, proto = self.exp, self.proto
        t0 = time.perf_counter()
        inside, active, since = 0.0, 0, 0.0  # time with at least one phase running (phases may overlap)

        async def timed(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
            nonlocal inside, active, since
            if active == 0:
                since = time.perf_counter()
            active += 1
            try:
                return await fn()
            finally:
                active -= 1
                if active == 0:
                    inside += time.perf_counter() - since

        attempts: Counter[str] = Counter()
        before: dict[str, int] = {}

        async def counted(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
            attempts[name] += 1
            if name == "train_step":  # a retry is safe only if the failed attempt applied nothing
                version = await exp.trainer.version.remote()
                if before.setdefault(name, version) != version:
                    raise RuntimeError(
                        f"train step failed after its optimiser step (v{version}): not retried"
                    )
            return await timed(name, fn)

        retries = {"train_step": exp.cfg.train.step_retries}  # a failed step is retried, then the run stops
        metrics = await proto.step(
            phase=lambda name, fn: run_phase(name, lambda: counted(name, fn), retries.get(name, 0))
        )
        metrics["count/train_step_retries"] = attempts["train_step"] - 1
        metrics.update(await _counts(exp, metrics["step_s"]))
        if step % exp.cfg.train.checkpoint_every == 0 or step == last:
            metrics["checkpoint"] = await timed(
                "checkpoint", lambda: asyncio.to_thread(save_checkpoint, exp, step)
            )
        wall = time.perf_counter() - t0
        metrics["flow_overhead_s"] = wall - inside  # Prefect's machinery: everything but the work itself
        metrics["flow_overhead_frac"] = metrics["flow_overhead_s"] / wall
        exp.store.record_step(exp.run_id, step, int(metrics["version"]), _jsonable(metrics), wall)
        await self.sink.write(step, metrics, artifact_key=f"{slug(exp.run_id)}-metrics")
        return metrics


async def _counts(exp: Experiment, step_s: float) -> dict[str, Any]:
    """Retry and drop counters of rollout, generation and reward, per-task rollout scores and the
    trained-vs-started selection bias (rollout/selection.py), for the step's metrics."""
    rollout = await exp.rollout.stats.remote()
    proxy = await exp.proxy.summary.remote()
    out: dict[str, Any] = {
        "count/gen_requests_retried": proxy["retried"],
        "count/gen_requests_failed": sum(proxy["worker_failures"].values()),  # a worker died holding them
        **{f"count/gen_routed/{tag}/{pool}": n for tag, pool, n in proxy["routes"]},  # hw-mapped, per pool
        "tokens_per_s_rollout": rollout["tokens"] / max(step_s, 1e-9),
        **{f"count/reward_{k}": v for k, v in rollout["reward"].items()},
        **{f"count/{k}": v for k, v in rollout["buffer"].items()},  # buffer_evicted_<reason> ...
        **{f"count/{k}": v for k, v in rollout["counts"].items()},
        **rollout["bias"],
    }
    for name, t in rollout["tasks"].items():
        if t["reward_mean"] is not None:
            out[f"rollout/{name}/reward"] = t["reward_mean"]
            out[f"rollout/{name}/success"] = t["success_rate"]
    return out


def _jsonable(m: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(m, default=str))
