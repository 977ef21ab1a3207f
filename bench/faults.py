"""Issue 7: training under faults — env crashes and hangs, one generation-worker kill — with and without
redundant env rollouts. Required in every run: `steps_done == steps_asked`, `lost == 0`,
`partial_groups_trained == 0`.

Each run drives the real control plane and trainer for `steps` iterations of the six-step protocol: two
generation workers are Ray actors (ModelledBackend: Qwen2.5-7B on an H20, time scaled to run in seconds)
behind the LLMProxy; the env loops, scheduler, reward and SampleBuffer run in a RolloutService; a torch
TrainWorker trains the tiny model on the batches (weights pushed to the workers through Ray). The workload
is the quickstart's shape on a synthetic env: GRPO groups of G, a few turns per episode, each env call
sleeping a modelled latency (`LatencyEnv`). Times are wall-clock: generation and env latency are modelled
and scaled (`unit_ms` wall ms per modelled unit), hangs cost the real `env_timeout_s`, and the training
is real torch on this machine's CPUs.

Faults (`engine.faults`, seeded): at failure rate p every env reset and step crashes with probability
0.75·p and hangs (until `env_timeout_s`) with probability 0.25·p; worker gen-0 is killed (its process
exits) on its `kill_after`-th request in every run, and Ray restarts it (gen-1, never killed, is kept
from run to run). Redundancy r starts G + r members per group.

Statistics: every (redundancy, rate) runs once per seed (`--rounds` seeds, 5 in the full run, 3 with
`--quick`: one step per run and fewer groups per step, only the lowest and highest failure rate, the same G,
turns and faults, gen-0 killed on its 20th request, not its 40th, so that the kill falls inside the step),
seed by seed with the configurations rotated each seed (`bench.async_runs.run_order`); a seed sets the
fault draws, the env latencies and the sampling. A row is one configuration over its seeds: the requirements
as totals over its runs (steps_done, steps_asked, lost, partial_groups_trained), the step time as the
median of the runs' mean step times with a percentile-bootstrap 95% interval (`ci_low`/`ci_high`), the other
counts as medians per run. Columns: lost = members started that never ended with a counted status;
partial_groups_trained = groups handed to the trainer with fewer than G scored members; retries = members
refilled + generation requests retried + reward retries; dropped = failed members (each counted with its
reason: env crash, env timeout); gen_requests_failed = requests gen-0 held when it died (each retried on
gen-1); groups_dropped_stale = groups the staleness bound (rollart, α = 1) discarded, not a fault.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import report
from bench.async_runs import RunSettings, round_seeds, run_order

MODEL, DEVICE = "qwen2.5-7b", "H20"
RATES = (0.0, 0.05, 0.2)
TOTALS = ("steps_done", "steps_asked", "lost", "partial_groups_trained")  # summed over a row's runs
# the median per run over a row's runs
MEDIANS = ("retries", "dropped", "env_crashes", "env_timeouts", "members_refilled", "gen_requests_retried",
           "gen_requests_failed", "groups_dropped_incomplete", "groups_dropped_stale", "trajectories_started",
           "wall_s")  # fmt: skip
BESIDE_SIMULATED = (  # bench/all.py: the quick suite runs it while the simulated-clock benchmarks run
    "its requirements are counts, and a hang costs a fixed env_timeout_s; its step times include their load"
)


@dataclass(frozen=True)
class Settings:
    steps: int = 10
    group_size: int = 8
    batch_groups: int = 4
    concurrency: int = 32  # one batch of envs: batch_groups · group_size
    turns: int = 4
    redundancies: tuple[int, ...] = (0, 2)
    rates: tuple[float, ...] = RATES
    env_timeout_s: float = 1.0  # what a hang costs (well above a slow call on a loaded 2-core box)
    unit_ms: float = 2.0  # wall ms per modelled second (generation) and per env latency unit
    seed: int = 0
    rounds: int = 5  # runs of every configuration, one per seed
    kill_after: int = 40  # gen-0 dies on this request: inside the first steps of every run

    @property
    def configs(self) -> list[tuple[int, float]]:
        """(redundancy, failure rate) of every row, in the rows' order."""
        return [(r, p) for r in self.redundancies for p in self.rates]

    @property
    def seeds(self) -> list[int]:
        """Round r's seed, as the async benches space them (no env draw shared between rounds)."""
        return round_seeds(RunSettings(seed=self.seed, rounds=self.rounds))


FULL = Settings()
QUICK = replace(
    FULL, steps=1, batch_groups=2, concurrency=16, kill_after=20, rounds=3, rates=(RATES[0], RATES[-1])
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add, positive = parser.add_argument, report.at_least(int, 1)
    add("--steps", type=positive, help=f"training steps per run ({FULL.steps}; quick {QUICK.steps})")
    add("--rounds", type=positive, help=f"seeds per configuration ({FULL.rounds}; quick {QUICK.rounds})")
    add("--seed", type=report.at_least(int, 0), help=f"round 0's seed (default {FULL.seed})")


# -- one run -----------------------------------------------------------------------------------------
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


async def _workers(s: Settings, kept: list[Any]) -> tuple[list[Any], list[int]]:
    """Two modelled generation workers (gen-0 dies on its `s.kill_after`-th request) and their pids; gen-1 is
    the last run's process if `kept` holds it, rebuilt (`Worker.reinit`): a process start less per run."""
    import ray

    from engine.rollout.gen_worker import GenerationWorker

    backend = {"kind": "modelled", "model": MODEL, "device": DEVICE, "time_scale": s.unit_ms / 1000,
               "token_id": 10}  # fmt: skip
    args = [(f"gen-{i}", i, 2, "bandwidth", "gpu-bandwidth",
             {"backend": backend, "store": None, "run_id": "faults", "kill_after_requests": s.kill_after})
            for i in range(2)]  # fmt: skip
    new = ray.remote(GenerationWorker).options(max_restarts=4, max_concurrency=1024, num_cpus=0)
    gen1 = kept.pop() if kept else None
    workers = [new.remote(*args[0]), gen1 or new.remote(*args[1])]
    first = (workers[0].ping.remote(), gen1.reinit.remote(*args[1]) if gen1 else workers[1].ping.remote())
    return workers, [info["pid"] for info in await asyncio.gather(*first)]


async def _pid(worker: Any, wait_s: float = 60.0) -> int:
    """The worker's pid once it answers: a call sent while Ray restarts it fails as unavailable (gen-0 dies
    during every run), so it is asked again until `wait_s` has passed."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return int((await worker.ping.remote())["pid"])
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def _rollout(s: Settings, rate: float, redundancy: int, model_dir: str, proxy: Any) -> Any:
    from engine.config import FaultsConfig
    from engine.faults import FaultyEnvFactory
    from engine.rollout.env_manager import TurnLimits
    from engine.rollout.scheduler import TaskSpec
    from engine.rollout.service import RolloutService

    faults = FaultsConfig(
        seed=s.seed, env_reset_crash=0.75 * rate, env_step_crash=0.75 * rate, env_hang=0.25 * rate
    )
    limits = TurnLimits(s.turns + 1, 4, 4096, env_timeout_s=s.env_timeout_s)
    task = TaskSpec("synthetic", "synthetic", {}, 1.0, s.group_size, limits, "decode-heavy")
    return RolloutService(
        [task], model_dir, proxy, "rollart", 1, s.concurrency, redundancy, s.batch_groups, seed=s.seed,
        env_factory=FaultyEnvFactory(faults, LatencySynthetic(s.turns, s.unit_ms / 1000, s.seed)),
    )  # fmt: skip


async def _drive(proto: Any, s: Settings) -> tuple[list[float], int, str]:
    """`s.steps` protocol steps: their times, the partial groups handed to the trainer, the error if any."""
    partial = 0

    async def phase(name: str, fn: Any) -> Any:
        nonlocal partial
        out = await fn()
        if name == "get_batch":  # (its size, the groups the trainer is about to get)
            partial += sum(len(g.members) != s.group_size or not g.complete for g in out[1])
        return out

    steps_s: list[float] = []
    try:
        await proto.start()
        for _ in range(s.steps):
            steps_s.append((await proto.step(phase))["step_s"])
    except Exception as e:  # the row shows it: steps_done < steps_asked
        return steps_s, partial, f"{type(e).__name__}: {str(e)[:300]}"
    return steps_s, partial, ""


def _counts(stats: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """A run's fault counts from the rollout's stats and the proxy's summary."""
    from engine.rollout.ledger import unended

    c, reward = stats["counts"], stats["reward"]
    return {
        "lost": unended(c),
        "retries": c.get("members_refilled", 0) + summary["retried"] + reward.get("retries", 0),
        "dropped": c.get("trajectories_failed", 0),
        "env_crashes": c.get("member_failed_InjectedEnvCrash", 0),
        "env_timeouts": c.get("member_failed_env_timeout", 0),
        "members_refilled": c.get("members_refilled", 0),
        "gen_requests_retried": summary["retried"],
        "gen_requests_failed": sum(summary["worker_failures"].values()),  # held by gen-0 when it died
        "groups_dropped_incomplete": c.get("groups_dropped_incomplete", 0),
        "groups_dropped_stale": c.get("groups_dropped_stale", 0),  # rollart's bound α = 1, not faults
        "trajectories_started": c.get("trajectories_started", 0),
    }


async def _run_one(s: Settings, redundancy: int, rate: float, tiny: str, kept: list[Any]) -> dict[str, Any]:
    """One run of `s.steps` steps on seed `s.seed`, faults at `rate`, `redundancy` spares, model `tiny`."""
    import ray

    from engine.core.warm import retired
    from engine.protocol import Collaborators, IterationProtocol
    from engine.rollout.proxy import GenSlot, LLMProxy
    from engine.train.train_worker import TrainWorker

    workers, pids = await _workers(s, kept)
    proxy = LLMProxy(
        [GenSlot(f"gen-{i}", "gpu-bandwidth", w, capacity=s.concurrency) for i, w in enumerate(workers)]
    )
    rollout = _rollout(s, rate, redundancy, tiny, proxy)
    trainer = TrainWorker("train-0", 0, 1, "compute", "gpu-compute",
                          {"model_dir": tiny, "trainer": {"lr": 1e-4, "micro_batch_size": 64},
                           "store": None, "run_id": "faults"})  # fmt: skip
    collaborators = Collaborators(rollout, proxy, trainer, workers, weights_via_store=False)
    proto = IterationProtocol(collaborators, "rollart", s.batch_groups, get_batch_timeout_s=300)
    steps_s, partial, error = await _drive(proto, s)
    try:
        restarted = await _pid(workers[0]) != pids[0]
    finally:
        await rollout.stop()
        ray.kill(workers[0], no_restart=True)
        if retired(workers[1].retire.remote()):  # (False if it declined, died or hung)
            kept.append(workers[1])
        else:
            ray.kill(workers[1], no_restart=True)
    return {
        "redundancy": redundancy,
        "failure_rate": rate,
        "seed": s.seed,
        "steps_done": len(steps_s),
        "steps_asked": s.steps,
        "step_s": statistics.fmean(steps_s) if steps_s else None,
        "partial_groups_trained": partial,
        **_counts(rollout.stats(), proxy.summary()),
        "gen0_restarted": restarted,
        "error": error,
    }


# -- every run ---------------------------------------------------------------------------------------
RunOne = Callable[[Settings, int, float], Awaitable[dict[str, Any]]]


async def run_plan(s: Settings, one: RunOne) -> list[list[dict[str, Any]]]:
    """`one(settings on round r's seed, redundancy, rate)` for every configuration once per round, round by
    round with the configurations rotated (`run_order`). Returns, per configuration, its runs in round
    order, each with its `wall_s`."""
    configs, seeds = s.configs, s.seeds
    out: list[list[dict[str, Any]]] = [[] for _ in configs]
    for k, i in run_order(len(configs), s.rounds):
        redundancy, rate = configs[i]
        t0 = time.perf_counter()
        run = await one(replace(s, seed=seeds[k]), redundancy, rate)
        out[i].append(run | {"wall_s": time.perf_counter() - t0})
        print(
            f"round {k + 1}/{s.rounds} (seed {seeds[k]}) r={redundancy} p={rate:g}: {run['steps_done']}/"
            f"{run['steps_asked']} steps, {run['lost']} lost, {run['partial_groups_trained']} partial",
            flush=True,
        )
    return out


async def _measure(s: Settings) -> list[list[dict[str, Any]]]:
    """Every run of `run_plan` in one local Ray, from one tiny model (built from `s.seed`)."""
    import ray

    from engine.experiment import WORKER_ENV
    from engine.models.tiny import init_model
    from infra.local_ray import init_local_ray

    with tempfile.TemporaryDirectory(prefix="rollart-bench-faults-") as tmp:
        model_dir = str(init_model("tiny", Path(tmp) / "model", seed=s.seed))
        init_local_ray(num_cpus=os.cpu_count(), include_dashboard=False, runtime_env={"env_vars": WORKER_ENV})
        try:
            kept: list[Any] = []
            return await run_plan(s, lambda s_k, r, p: _run_one(s_k, r, p, model_dir, kept))
        finally:
            ray.shutdown()


# -- the rows ----------------------------------------------------------------------------------------
def summarize(runs: list[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """A configuration's runs (one per seed) as a row: the requirement counts summed, the median of the
    runs' mean step times with its bootstrap 95% interval (runs with a step; else None), other medians."""
    steps = [float(r["step_s"]) for r in runs if r["step_s"] is not None]
    step, low, high = report.median_ci(steps, seed) if steps else (None, None, None)
    return {
        "redundancy": runs[0]["redundancy"],
        "failure_rate": runs[0]["failure_rate"],
        "runs": len(runs),
        **{k: sum(int(r[k]) for r in runs) for k in TOTALS},
        "step_s": step,
        "ci_low": low,
        "ci_high": high,
        **{k: statistics.median(float(r[k]) for r in runs) for k in MEDIANS},
        "gen0_restarts": sum(bool(r["gen0_restarted"]) for r in runs),
        "errors": [f"seed {r['seed']}: {r['error']}" for r in runs if r["error"]],
    }


def requirements_met(rows: list[dict[str, Any]]) -> bool:
    """Every run did all its steps, lost no member and trained no partial group (the totals say so)."""
    return all(
        r["steps_done"] == r["steps_asked"] and r["lost"] == 0 and r["partial_groups_trained"] == 0
        for r in rows
    )


def _table(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {
            "fail": f"{r['failure_rate']:g}",
            "r": str(r["redundancy"]),
            "runs": str(r["runs"]),
            "done/asked": f"{r['steps_done']}/{r['steps_asked']}",
            "step_s": report.ci_text(r["step_s"], r["ci_low"], r["ci_high"], ".2f"),
            "lost": str(r["lost"]),
            "partial": str(r["partial_groups_trained"]),
            "retries": f"{r['retries']:g}",
            "dropped": f"{r['dropped']:g}",
            "gen_retry": f"{r['gen_requests_retried']:g}",
            "restarted": f"{r['gen0_restarts']}/{r['runs']}",
        }
        for r in rows
    ]


def _plot(rows: list[dict[str, Any]], path: str | None) -> str:
    fig, ax = report.new_figure(6, 4)
    for redundancy in sorted({row["redundancy"] for row in rows}):
        sel = [x for x in rows if x["redundancy"] == redundancy and x["step_s"] is not None]
        rates, steps = [100 * x["failure_rate"] for x in sel], [x["step_s"] for x in sel]
        yerr = report.ci_errors(sel, "step_s", "ci_low", "ci_high")
        ax.errorbar(rates, steps, yerr=yerr, fmt="o-", capsize=3, label=f"redundancy {redundancy}")
    ax.set(xlabel="env failure rate (%)", ylabel="step time (s), median and 95% CI over seeds",
           title="Training under faults (+1 worker kill per run)")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend()
    return report.save_figure(fig, path, "faults.png")


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The requirements as totals over every run (ideal: every step, nothing lost, no partial group) and the
    step time at the highest failure rate per redundancy with its interval (the paper gives no figure)."""
    rows = payload["rows"]
    total, top = {k: sum(r[k] for r in rows) for k in TOTALS}, max(r["failure_rate"] for r in rows)
    return [
        report.headline_row(
            "steps done / asked, all runs", total["steps_done"] / total["steps_asked"], ideal=1.0
        ),
        report.headline_row("members lost, all runs", total["lost"], ideal=0),
        report.headline_row("partial groups trained, all runs", total["partial_groups_trained"], ideal=0),
    ] + [report.headline_row(f"step s at failure rate {top:g}, r={r['redundancy']}", r["step_s"], r["ci_low"],
                      r["ci_high"]) for r in rows if r["failure_rate"] == top]  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    results = asyncio.run(_measure(s))
    rows = [summarize(rs, s.seed) for rs in results]
    ok = requirements_met(rows)
    note = (
        f"G={s.group_size}, {s.batch_groups} groups/step, E={s.concurrency}, {s.turns}-turn synthetic env, "
        f"{s.steps} steps per run, {s.rounds} seeds per row (seed by seed, rows rotated); env failure p: "
        f"crash 0.75p + hang 0.25p per call (hang = {s.env_timeout_s}s timeout); gen-0 killed on request "
        f"{s.kill_after} in every run.\ndone/asked, lost and partial (partial_groups_trained) are totals "
        "over a row's runs; step_s the median of the runs' mean step times and, in brackets, its bootstrap "
        "95% interval; retries, dropped and gen_retry (generation requests retried on the other worker) "
        "medians per run. Required: "
        f"steps_done == steps_asked, lost == 0, partial == 0 in every run: {'MET' if ok else 'NOT MET'}."
    )
    payload = report.publish(
        args,
        "Faults: steps done, lost and partial groups under env failures",
        s,
        rows,
        note,
        table=_table(rows),
        clock="wall",
        config={"redundancies": list(s.redundancies), "rates": list(s.rates), "model": MODEL,
                            "device": DEVICE, "cpus": os.cpu_count()},
        plot=lambda path: _plot(rows, path),
        requirements_met=ok,
        runs=results,
    )  # fmt: skip
    if not ok:
        raise SystemExit("faults benchmark: a requirement was not met (see the table)")
    return payload
