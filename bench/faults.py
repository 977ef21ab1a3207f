"""Issue 7: training under faults — env crashes and hangs, one generation-worker kill — with and without
redundant env rollouts. Required in every row: `steps_done == steps_asked`, `lost == 0`,
`partial_groups_trained == 0`.

Each row runs the real control plane and trainer for `steps` iterations of the six-step protocol: two
generation workers are Ray actors (ModelledBackend: Qwen2.5-7B on an H20, time scaled to run in seconds)
behind the LLMProxy; the env loops, scheduler, reward and SampleBuffer run in a RolloutService; a torch
TrainWorker trains the tiny model on the batches (weights pushed to the workers through Ray). The
workload is the quickstart's shape on a synthetic env: GRPO groups of G, a few turns per episode, each
env call sleeping a modelled latency (`LatencyEnv`).

Faults (`engine.faults`, seeded): at failure rate p every env reset and step crashes with probability
0.75·p and hangs (until `env_timeout_s`) with probability 0.25·p; worker gen-0 is killed (its process
exits) on its `KILL_AFTER`-th request in every row, and Ray restarts it. Redundancy r starts G + r members
per group. Columns: lost = members started that never ended with a counted status; partial_groups_trained
= groups handed to the trainer with fewer than G scored members; retries = members refilled + generation
requests retried + reward retries; dropped = failed members (each counted with its reason: env crash,
env timeout); gen_requests_failed = requests gen-0 held when it died (each retried on gen-1);
groups_dropped_stale = groups the staleness bound (rollart, α = 1) discarded, not a fault.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.report import png_path, print_table, write_json

MODEL, DEVICE = "qwen2.5-7b", "H20"
KILL_AFTER = 40  # gen-0 dies on this request: inside the first steps of every row
RATES = (0.0, 0.05, 0.2)


@dataclass(frozen=True)
class Settings:
    steps: int = 10
    group_size: int = 8
    batch_groups: int = 4
    concurrency: int = 32
    turns: int = 4
    redundancies: tuple[int, ...] = (0, 2)
    rates: tuple[float, ...] = RATES
    env_timeout_s: float = 1.0  # what a hang costs (well above a slow call on a loaded 2-core box)
    unit_ms: float = 2.0  # wall ms per modelled second (generation) and per env latency unit
    seed: int = 0


FULL = Settings()
QUICK = Settings(steps=4, group_size=4, batch_groups=2, concurrency=16, turns=3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, help=f"training steps per row (default {FULL.steps})")


def settings(args: argparse.Namespace) -> Settings:
    s = QUICK if getattr(args, "quick", False) else FULL
    steps = getattr(args, "steps", None)
    if steps is not None and steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {steps}")
    return replace(s, steps=steps) if steps else s


# -- one row -----------------------------------------------------------------------------------------
class LatencySynthetic:
    """Env factory (picklable): a `turns`-step synthetic env whose calls sleep N(1, 0.5) units."""

    def __init__(self, turns: int, unit_s: float, seed: int) -> None:
        self.turns, self.unit_s, self.seed, self.made = turns, unit_s, seed, 0

    def __call__(self, _spec: Any) -> Any:
        from engine.envs.latency import LatencyEnv
        from engine.envs.synthetic import SyntheticEnv

        self.made += 1
        latency = (1.0, 0.5)
        return LatencyEnv(SyntheticEnv(self.turns), latency, latency, self.seed + self.made, self.unit_s)


async def _row(s: Settings, rate: float, redundancy: int, model_dir: str) -> dict[str, Any]:
    import ray

    from engine.config import FaultsConfig
    from engine.faults import FaultyEnvFactory
    from engine.protocol import Collaborators, IterationProtocol
    from engine.rollout.env_manager import TurnLimits
    from engine.rollout.gen_worker import GenerationWorker
    from engine.rollout.proxy import GenSlot, LLMProxy
    from engine.rollout.scheduler import TaskSpec, unended
    from engine.rollout.service import RolloutService
    from engine.train.train_worker import TrainWorker

    unit_s = s.unit_ms / 1000
    faults = FaultsConfig(
        seed=s.seed, env_reset_crash=0.75 * rate, env_step_crash=0.75 * rate, env_hang=0.25 * rate
    )
    backend = {"kind": "modelled", "model": MODEL, "device": DEVICE, "time_scale": unit_s, "token_id": 10}
    workers = [
        ray.remote(GenerationWorker)
        .options(max_restarts=4, max_concurrency=1024, num_cpus=0)
        .remote(f"gen-{i}", i, 2, "bandwidth", "gpu-bandwidth",
                {"backend": backend, "store": None, "run_id": "faults", "kill_after_requests": KILL_AFTER})
        for i in range(2)
    ]  # fmt: skip
    pids = [info["pid"] for info in await asyncio.gather(*(w.ping.remote() for w in workers))]
    proxy = LLMProxy(
        [GenSlot(f"gen-{i}", "gpu-bandwidth", w, capacity=s.concurrency) for i, w in enumerate(workers)]
    )
    limits = TurnLimits(s.turns + 1, 4, 4096, env_timeout_s=s.env_timeout_s)
    task = TaskSpec("synthetic", "synthetic", {}, 1.0, s.group_size, limits, "decode-heavy")
    rollout = RolloutService(
        [task], model_dir, proxy, "rollart", 1, s.concurrency, redundancy, s.batch_groups, seed=s.seed,
        env_factory=FaultyEnvFactory(faults, LatencySynthetic(s.turns, unit_s, s.seed)),
    )  # fmt: skip
    trainer = TrainWorker("train-0", 0, 1, "compute", "gpu-compute",
                          {"model_dir": model_dir, "trainer": {"lr": 1e-4, "micro_batch_size": 64},
                           "store": None, "run_id": "faults"})  # fmt: skip
    proto = IterationProtocol(
        Collaborators(rollout, proxy, trainer, workers, weights_via_store=False),
        "rollart",
        s.batch_groups,
        get_batch_timeout_s=300,
    )
    partial = 0

    async def phase(name: str, fn: Any) -> Any:
        nonlocal partial
        out = await fn()
        if name == "get_batch":  # what the trainer is about to get
            partial += sum(len(g.members) != s.group_size or not g.complete for g in out)
        return out

    steps_s: list[float] = []
    error = ""
    try:
        await proto.start()
        for _ in range(s.steps):
            m = await proto.step(phase)
            steps_s.append(m["step_s"])
    except Exception as e:  # the row shows it: steps_done < steps_asked
        error = f"{type(e).__name__}: {str(e)[:300]}"
    try:
        restarted = (await workers[0].ping.remote())["pid"] != pids[0]
    finally:
        await rollout.stop()
        for w in workers:
            ray.kill(w, no_restart=True)
    stats = rollout.stats()
    c, reward = stats["counts"], stats["reward"]
    summary = proxy.summary()
    return {
        "failure_rate": rate,
        "redundancy": redundancy,
        "steps_done": len(steps_s),
        "steps_asked": s.steps,
        "step_s": statistics.fmean(steps_s) if steps_s else None,
        "lost": unended(c),
        "partial_groups_trained": partial,
        "retries": c.get("members_refilled", 0) + summary["retried"] + reward.get("retries", 0),
        "dropped": c.get("trajectories_failed", 0),
        "env_crashes": c.get("member_failed_InjectedEnvCrash", 0),
        "env_timeouts": c.get("member_failed_env_timeout", 0),
        "members_refilled": c.get("members_refilled", 0),
        "gen_requests_retried": summary["retried"],
        "gen_requests_failed": sum(summary["worker_failures"].values()),  # held by gen-0 when it died
        "gen0_restarted": restarted,
        "groups_dropped_incomplete": c.get("groups_dropped_incomplete", 0),
        "groups_dropped_stale": c.get("groups_dropped_stale", 0),  # rollart's bound α = 1, not faults
        "trajectories_started": c.get("trajectories_started", 0),
        "error": error,
    }


async def _measure(s: Settings) -> list[dict[str, Any]]:
    import ray

    from engine.experiment import WORKER_ENV
    from engine.models.tiny import init_model
    from infra.local_ray import init_local_ray

    rows = []
    with tempfile.TemporaryDirectory(prefix="rollart-bench-faults-") as tmp:
        model_dir = str(init_model("tiny", Path(tmp) / "model", seed=s.seed))
        init_local_ray(
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            runtime_env={"env_vars": WORKER_ENV},
        )
        try:
            for redundancy in s.redundancies:
                for rate in s.rates:
                    t0 = time.perf_counter()
                    row = await _row(s, rate, redundancy, model_dir)
                    row["wall_s"] = time.perf_counter() - t0
                    rows.append(row)
        finally:
            ray.shutdown()
    return rows


def _plot(rows: list[dict[str, Any]], path: str | None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = png_path(path, "faults.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in sorted({row["redundancy"] for row in rows}):
        sel = [row for row in rows if row["redundancy"] == r]
        ax.plot(
            [100 * x["failure_rate"] for x in sel], [x["step_s"] for x in sel], "o-", label=f"redundancy {r}"
        )
    ax.set(
        xlabel="env failure rate (%)",
        ylabel="mean step time (s)",
        title="Training under faults (+1 worker kill)",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return str(out)


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = settings(args)
    rows = asyncio.run(_measure(s))
    ok = all(
        r["steps_done"] == r["steps_asked"] and r["lost"] == 0 and r["partial_groups_trained"] == 0
        for r in rows
    )
    short = {
        "failure_rate": "fail", "redundancy": "r", "steps_done": "done", "steps_asked": "asked",
        "step_s": "step_s", "lost": "lost", "partial_groups_trained": "partial", "retries": "retries",
        "dropped": "dropped", "gen_requests_retried": "gen_retry", "gen0_restarted": "restarted",
    }  # fmt: skip
    note = (
        f"G={s.group_size}, {s.batch_groups} groups/step, E={s.concurrency}, {s.turns}-turn synthetic env; "
        f"env failure p: crash 0.75p + hang 0.25p per call (hang = {s.env_timeout_s}s timeout); gen-0 killed "
        f"on request {KILL_AFTER} in every row.\npartial = partial_groups_trained; gen_retry = generation "
        "requests retried on the other worker. Required: steps_done == steps_asked, lost == 0, "
        f"partial_groups_trained == 0 in every row: {'MET' if ok else 'NOT MET'}."
    )
    table = [{v: r[k] for k, v in short.items()} for r in rows]
    print_table("Faults: steps done, lost and partial groups under env failures", table, note)
    payload: dict[str, Any] = {
        "rows": rows,
        "config": asdict(s) | {"quick": bool(getattr(args, "quick", False)), "model": MODEL, "device": DEVICE,
                               "kill_after_requests": KILL_AFTER, "cpus": os.cpu_count()},
        "requirements_met": ok,
        "png": _plot(rows, getattr(args, "json", None)),
    }  # fmt: skip
    write_json(getattr(args, "json", None), payload)
    if not ok:
        raise SystemExit("faults benchmark: a requirement was not met (see the table)")
    return payload
