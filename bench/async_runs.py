"""The shared driver of `async-modes` and `alpha-sweep`: one training run per (mode, α) on local Ray.

Each run is the real system built by `Experiment` — a torch `TrainWorker` actor, an HF-backend
`GenerationWorker` actor, the LLMProxy and RolloutService actors, weights through the configured store
(Mooncake by default) — driven by `IterationProtocol` exactly as the training flow drives it. Only the
env is a benchmark one: a fixed-length `SyntheticEnv` (T turns, whatever the model answers) wrapped in
`LatencyEnv`, so every mode plays the same amount of work and the env latency is what overlap can hide.
Env k (in creation order) sleeps the seeded draws of seed `seed + k` in every run. Round r of a
benchmark runs every configuration on seed `seed + r·SEED_STRIDE` (its env draws and its sampling), so
configurations are compared on the same draws within a round and rounds are independent repeats.

Every run starts from the same model directory (built once), and the wave size, the number of
environments and the batch are the same in every mode (`concurrency` defaults to one batch, B·G envs):
the modes differ only in what they overlap and what they abort.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.report import at_least, ci_text, median_ci
from engine.envs.base import Env
from engine.modes import Mode
from engine.rollout.scheduler import TaskSpec

if TYPE_CHECKING:
    from engine.core.warm import WarmWorkers

MODE_ORDER = tuple(Mode)  # sync, sync+, one-off, areal, rollart: the order throughput is expected in
SEED_STRIDE = 10_000  # between rounds' seeds: far more than the envs one run builds, so no draw is shared
MEDIAN_KEYS = (  # a run's numbers that `summarize_runs` takes the median of over rounds
    "step_s",
    "tokens_per_s",
    "wait_batch_s",
    "train_s",
    "sync_s",
    "push_s",
    "pull_s",
    "exposed_pull_s",
    "aborted",
    "trajectories_started",
    "trained_mean_turns",
    "started_mean_turns",
    "aborted_token_frac",
    "wall_s",
)


@dataclass(frozen=True)
class RunSettings:
    """What every run of one benchmark shares. Env latency is in wall milliseconds per reset/step.

    The defaults (`async-modes`' full run): one batch's rollout is mostly env time (5 × 150 ms per
    trajectory, 16 cheap decode steps) and of the order of one training step of the tiny model.
    """

    size: str = "tiny"
    group_size: int = 4
    batch_groups: int = 4
    concurrency: int | None = None  # None: one batch worth of envs (batch_groups · group_size)
    turns: int = 4
    max_turns: int | None = None  # set: a mixed-length workload, turns..max_turns per group (by seed)
    max_tokens: int = 4
    env_ms: float = 150.0
    env_sigma_ms: float = 50.0
    warmup: int = 1
    steps: int = 5
    store: str = "mooncake"
    seed: int = 0
    rounds: int = 2  # runs of every configuration, one per round, each round on its own seed

    @property
    def envs(self) -> int:
        return self.concurrency or self.batch_groups * self.group_size

    @property
    def turns_text(self) -> str:
        return f"{self.turns}–{self.max_turns}" if self.max_turns else str(self.turns)


# -- arguments ---------------------------------------------------------------------------------------
def add_run_arguments(parser: argparse.ArgumentParser, full: RunSettings, quick: RunSettings) -> None:
    """The options every async benchmark shares; each overrides its `--quick` or full default."""

    def both(name: str) -> str:
        a, b = getattr(full, name), getattr(quick, name)
        return f"default {a}" if a == b else f"default {a}; quick {b}"

    add = parser.add_argument
    add("--size", choices=["tiny", "small"], help=f"model built locally ({both('size')})")
    add("--group-size", type=at_least(int, 2), help=f"GRPO group size G ({both('group_size')})")
    add("--batch-groups", type=at_least(int, 1), help=f"groups per step B ({both('batch_groups')})")
    add("--concurrency", type=at_least(int, 1), help=f"envs at once ({both('concurrency')}; None: B*G)")
    add("--turns", type=at_least(int, 1), help=f"turns per trajectory ({both('turns')})")
    add(
        "--max-turns",
        type=at_least(int, 1),
        help="mixed lengths: each group's episodes last turns..max-turns turns, drawn by its seed",
    )
    add("--max-tokens", type=at_least(int, 1), help=f"tokens per action ({both('max_tokens')})")
    add("--env-ms", type=at_least(float, 0), help=f"mean env latency per reset/step ({both('env_ms')})")
    add("--env-sigma-ms", type=at_least(float, 0), help=f"its std dev ({both('env_sigma_ms')})")
    add("--warmup", type=at_least(int, 0), help=f"unmeasured steps per run ({both('warmup')})")
    add("--steps", type=at_least(int, 1), help=f"measured steps per run ({both('steps')})")
    add(
        "--rounds",
        type=at_least(int, 1),
        help=f"runs of every configuration, round r on seed seed+{SEED_STRIDE}r ({both('rounds')})",
    )
    add("--store", choices=["mooncake", "ray"], help=f"weight store ({both('store')})")
    add("--seed", type=at_least(int, 0), help=f"round 0's seed: env k sleeps seed+k's draws ({both('seed')})")


class LatencyEnvs:
    """Env factory for the rollout actor: env k is `SyntheticEnv(turns)` sleeping seed `seed + k`'s draws.

    Picklable (it travels to the RolloutService actor); the counter lives in the actor's copy.
    """

    def __init__(self, mu_ms: float, sigma_ms: float, seed: int) -> None:
        self.mu_ms, self.sigma_ms, self.seed = mu_ms, sigma_ms, seed
        self.built = 0

    def __call__(self, spec: TaskSpec) -> Env:
        from engine.envs.latency import LatencyEnv
        from engine.envs.registry import make_env

        latency = (self.mu_ms, self.sigma_ms)
        env = LatencyEnv(
            make_env(spec.env, **spec.env_args),
            latency,
            latency,
            seed=self.seed + self.built,
            time_scale=1e-3,
        )
        self.built += 1
        return env


def experiment_data(s: RunSettings, mode: str, alpha: int, model_dir: str, run_root: str) -> dict[str, Any]:
    """The experiment config (as `load_config(data=...)` takes it) of one run."""
    return {
        "name": f"bench-{mode.replace('+', 'plus')}-a{alpha}",
        "run_root": run_root,
        "model": {"path": model_dir, "max_context": 1024},
        "tasks": [
            {
                "env": "synthetic",
                "env_args": {"turns": s.turns, **({"max_turns": s.max_turns} if s.max_turns else {})},
                "group_size": s.group_size,
                "max_turns": s.max_turns or s.turns,
                "max_tokens": s.max_tokens,
                "profile": "prefill-heavy",
            }
        ],
        "rollout": {"concurrency": s.envs, "redundancy": 0, "granularity": "trajectory"},
        "train": {
            "steps": s.warmup + s.steps,
            "batch_groups": s.batch_groups,
            "micro_batch": s.batch_groups * s.group_size,
            "alpha": alpha,
            "mode": mode,
            "seed": s.seed,
        },
        "backends": {"generation": "hf", "weight_store": s.store},
    }


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    """Trajectories started, and aborted for staleness (in flight, or evicted from the buffer), so far."""
    counts, buffer = stats["counts"], stats["buffer"]
    return {
        "trajectories_started": int(counts.get("trajectories_started", 0)),
        "aborted": int(counts.get("aborted_stale_in_flight", 0)) + int(buffer.get("buffer_evicted_stale", 0)),
    }


def bias_summary(bias: dict[str, float]) -> dict[str, float]:
    """The run's selection bias (engine/rollout/selection.py), for its one task: trained vs started mean
    turns, and the share of generated tokens that went into aborted trajectories."""
    turns = {k.rsplit("/", 1)[1]: v for k, v in bias.items() if k.endswith("_mean_turns")}
    return {
        "trained_mean_turns": turns.get("trained_mean_turns", 0.0),
        "started_mean_turns": turns.get("started_mean_turns", 0.0),
        "aborted_token_frac": bias["bias/aborted_token_frac"],
    }


def summarize_steps(steps: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One run's measured steps as means; tokens/s is total trained tokens over total step time.

    `sync_s` is the step time that is neither waiting for the batch nor training: suspend → update →
    resume, the staleness advance, the trainer's publish (push) and, in the sync modes, the next wave's
    weight update — the weight sync a step is exposed to.
    """
    step_s = sum(m["step_s"] for m in steps)

    def mean(key: str) -> float:
        values = [float(m[key]) for m in steps if key in m]
        return statistics.fmean(values) if values else 0.0

    return {
        "step_s": step_s / len(steps),
        "tokens_per_s": sum(m["tokens"] for m in steps) / step_s,
        "wait_batch_s": mean("wait_batch_s"),
        "train_s": mean("train_s"),
        "sync_s": statistics.fmean(m["step_s"] - m["wait_batch_s"] - m["train_s"] for m in steps),
        "push_s": mean("push_s"),
        "pull_s": mean("pull_s"),
        "exposed_pull_s": mean("exposed_pull_s"),
        "staleness_max": max(int(m["staleness_max"]) for m in steps),
    }


def _run_one(
    s: RunSettings, mode: str, alpha: int, model_dir: str, run_root: str, warm: WarmWorkers
) -> dict[str, Any]:
    from engine.config import load_config
    from engine.experiment import Experiment

    exp = Experiment(load_config(data=experiment_data(s, mode, alpha, model_dir, run_root)), warm=warm)
    try:
        exp.provision()
        exp.prepare_model()
        exp.start_weight_store()
        exp.start_actors(env_factory=LatencyEnvs(s.env_ms, s.env_sigma_ms, s.seed))
        proto = exp.protocol()

        async def drive() -> tuple[list[dict[str, Any]], dict[str, float], float]:
            await proto.start()
            for _ in range(s.warmup):
                await proto.step()
            before = _counts(await exp.rollout.stats.remote())
            t0 = time.perf_counter()
            steps = [await proto.step() for _ in range(s.steps)]
            wall = time.perf_counter() - t0
            stats = await exp.rollout.stats.remote()
            after = _counts(stats)
            return steps, {**{k: after[k] - before[k] for k in after}, **bias_summary(stats["bias"])}, wall

        steps, counts, wall = asyncio.run(drive())
    finally:
        exp.teardown()
    return {
        "mode": mode,
        "alpha": alpha,
        "seed": s.seed,
        **summarize_steps(steps),
        **counts,
        "wall_s": wall,
        "steps": steps,
    }


def round_seeds(s: RunSettings) -> list[int]:
    """The seed of each round: `s.seed + r·SEED_STRIDE` for r < `s.rounds`."""
    return [s.seed + r * SEED_STRIDE for r in range(s.rounds)]


def run_order(configs: int, rounds: int) -> list[tuple[int, int]]:
    """(round, configuration) in the order they run: round by round, the configurations rotated by one
    each round, so over `configs` rounds each runs once in every position and neither the machine's
    drift nor going first (or last) in a round favours one of them."""
    return [(r, (r + j) % configs) for r in range(rounds) for j in range(configs)]


_kept: list[WarmWorkers] = []  # the workers `suite_session` keeps between `run_all` calls, while it is open


@contextlib.contextmanager
def suite_session() -> Iterator[WarmWorkers]:
    """While open, `run_all` calls share one Ray session and one `WarmWorkers` (`rollart bench all` opens it
    around the benchmarks built on this module that run one after another): a later call skips Ray's start
    and its workers' cold start. Their runs ask Ray for the same resources (`experiment_data` sets none)."""
    import ray

    from engine.core.warm import WarmWorkers

    _kept.append(warm := WarmWorkers())
    try:
        yield warm
    finally:
        _kept.pop().close()
        ray.shutdown()


def run_all(s: RunSettings, plan: Sequence[tuple[str, int]]) -> list[list[dict[str, Any]]]:
    """Run every (mode, α) of `plan` once per round (`run_order`, round r on seed `round_seeds(s)[r]`),
    in one Ray session, from one model directory (built from `s.seed`). The trainer's, generation
    workers' and rollout's processes pass from run to run (`WarmWorkers`): a run's start-up is its model
    load, not importing torch again (what each step measures is the same either way). Inside an open
    `suite_session` they are its; outside, the call opens one of its own for its runs.

    Returns, per plan entry, its runs in round order (so the k-th runs of two entries share a seed).
    """
    from engine.models.tiny import init_model

    out: list[list[dict[str, Any]]] = [[] for _ in plan]
    with tempfile.TemporaryDirectory(prefix="rollart-bench-") as tmp, contextlib.ExitStack() as own:
        root = Path(tmp)
        model_dir = str(init_model(s.size, root / "model", seed=s.seed))  # type: ignore[arg-type]
        # the open suite session's workers, else a session of its own, ended on the way out
        warm = _kept[-1] if _kept else own.enter_context(suite_session())
        seeds = round_seeds(s)
        for k, i in run_order(len(plan), s.rounds):
            mode, alpha = plan[i]
            r = _run_one(replace(s, seed=seeds[k]), mode, alpha, model_dir, str(root / "runs"), warm)
            out[i].append(r)
            print(
                f"round {k + 1}/{s.rounds} (seed {seeds[k]}) {mode} α={alpha}: {r['step_s']:.2f} "
                f"s/step, {r['tokens_per_s']:.0f} tokens/s, {r['aborted']} aborted",
                flush=True,
            )
    return out


def interval_fields(m: dict[str, Any]) -> dict[str, Any]:
    """A configuration's row fields from its `summarize_runs` summary: runs, step time and throughput, each
    with its 95% interval."""
    tokens = ("tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high")
    step = {"step_s": m["step_s"], "ci_low": m["step_s_ci_low"], "ci_high": m["step_s_ci_high"]}
    return {"runs": m["runs"], **step, **{k: m[k] for k in tokens}}


def interval_columns(r: dict[str, Any]) -> dict[str, str]:
    """The printed step time and throughput of an `interval_fields` row: median [95% interval]."""
    tokens = r["tokens_per_s"], r["tokens_per_s_ci_low"], r["tokens_per_s_ci_high"]
    return {
        "step_s": ci_text(r["step_s"], r["ci_low"], r["ci_high"], ".2f"),
        "tok/s": ci_text(*tokens, ".0f"),
    }


def summarize_runs(runs: Sequence[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """One configuration's runs (one per round) as one: the median over the runs of each `MEDIAN_KEYS`
    field (`statistics.median`: with an even number of runs the mean of the middle two, so the fields
    need not add up as one run's do), the largest `staleness_max`, and percentile-bootstrap 95%
    intervals (`median_ci`, bootstrap seed `seed`) of the step time and throughput over the run-level
    values (each run's mean step time, its total tokens over total time; steps within a run are not
    independent, so they are never pooled)."""
    out: dict[str, Any] = {
        "mode": runs[0]["mode"],
        "alpha": runs[0]["alpha"],
        "runs": len(runs),
        **{k: statistics.median(float(r[k]) for r in runs) for k in MEDIAN_KEYS},
        "staleness_max": max(int(r["staleness_max"]) for r in runs),
    }
    for key in ("step_s", "tokens_per_s"):
        _, out[f"{key}_ci_low"], out[f"{key}_ci_high"] = median_ci([float(r[key]) for r in runs], seed)
    return out
