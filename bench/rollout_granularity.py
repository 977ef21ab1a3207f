"""R2 of the paper: trajectory-level against batch-level rollout as env latency variance grows (§6.1).

E environments each play one trajectory of T turns. Every reset and step first sleeps a draw from a
Gaussian (μ, σ) truncated at 0 (`LatencyEnv` around a fixed-length `SyntheticEnv`), in modelled seconds.
The generation backend (`ModelledBackend`: Qwen2.5-7B on one H800, 16-token actions) is paced on the same
clock, so LLM time and env time keep their real proportion — generation is about 1% of a 10 s env step.

The clock is simulated by default (`bench.clock`: the loop jumps to its next timer, so a step's time is what
the env and device models predict for the decisions the real control plane made, independent of the
machine's load); `--clock wall` waits for real, `--unit-ms` wall milliseconds per modelled second, and then
also charges the control plane's own CPU time (every turn's burst of E results in batch mode). Times are
reported in modelled seconds on either clock.

For each T and σ the same draws run through the real control plane twice (LLMProxy → ModelledBackend,
EnvManager, RolloutScheduler, RewardScorer, SampleBuffer): (a) trajectory granularity, and (b) batch
granularity, where every turn's generation waits for the slowest env (`LockstepGenerator`). Env i of a
seed is seeded `env_seed(seed, i)` in both modes, and the latencies each env slept are checked against the
precomputed draws after every run. One rollout step = all E trajectories scored and in the buffer (E/8
GRPO groups of 8, no redundancy).

Ideal times from the draws alone (no generation, no scheduling overhead): trajectory mode ends when the
env with the largest total latency ends (max over envs of the sum); batch mode pays each turn's slowest
env (sum over turns of the max). efficiency = ideal_traj_s / traj_s.

The paper does not state the T of R2 (its prefill-heavy tasks have 30–100 turns), and the ratio depends on
it: at σ = 1 batch/trajectory is about (T+1)(μ + zσ) / ((T+1)μ + zσ√(T+1)) with z ≈ 2.6 for the max of 128
normals, rising with T towards 1.26. So T is swept (25, 50, 100, 200; `--quick` 25 and 50) and every
(T, σ) is reported, not the T that meets the paper (σ 1, 2, 5 and 10; `--quick` the paper's 1 and 10).
Each (T, σ) runs on 5 seeds (`--quick`: 3), each a new set of draws: a row gives the medians over them and
the speedup's bootstrap 95% interval.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench import report
from bench.clock import run as run_loop
from bench.harness import (
    add_clock_arguments,
    clock_note,
    clock_unit_s,
    measured_gc,
    run_to_batch,
)
from engine.envs.base import Env, EnvStep

if TYPE_CHECKING:
    from engine.envs.latency import LatencyEnv
    from engine.rollout.chat import ChatFormat
    from engine.rollout.scheduler import TaskSpec

PAPER_SPEEDUP = {1.0: 1.23, 10.0: 2.27}  # R2, μ = 10 (the points the paper states)
GROUP_SIZE = 8
ACTION_TOKENS = 16
MODEL, DEVICE = "qwen2.5-7b", "H800"  # the smallest preset, on the paper's prefill (compute) pool
ENV_TIMEOUT_S = 3600.0  # modelled latencies never hang; a bound that cannot trip
MAX_CONTEXT = 1 << 20  # the synthetic episode always fits: context limits are not what R2 measures


@dataclass(frozen=True)
class Settings:
    mu: float = 10.0
    sigmas: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0)
    envs: int = 128
    turns: tuple[int, ...] = (25, 50, 100, 200)
    clock: str = "virtual"
    unit_ms: float = 10.0  # with clock="wall": wall ms per modelled second
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)


FULL = Settings()
# the same workload at fewer lengths and the two turn-time spreads the paper reports (σ = 1 and 10)
QUICK = Settings(sigmas=(1.0, 10.0), turns=(25, 50), unit_ms=5.0, seeds=(0, 1, 2))


def env_seed(seed: int, i: int) -> int:
    """Env i's latency seed under `seed` (seeds far apart: no two seeds share an env's draws)."""
    return 1_000_000 * seed + i


# -- arguments ---------------------------------------------------------------------------------------
def _envs(text: str) -> int:
    n = int(text)
    if n < GROUP_SIZE or n % GROUP_SIZE:
        raise argparse.ArgumentTypeError(
            f"envs must be a positive multiple of {GROUP_SIZE} (GRPO groups of {GROUP_SIZE}), got {text}"
        )
    return n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = FULL
    parser.add_argument(
        "--mu", type=report.at_least(float, 0, strict=True), help=f"mean env latency, s (default {d.mu})"
    )
    parser.add_argument(
        "--sigmas",
        type=report.numbers(float, 0),
        help="env latency std devs, s (default 1,2,5,10; quick 1,10)",
    )
    parser.add_argument("--envs", type=_envs, help=f"concurrent environments E (default {d.envs})")
    parser.add_argument(
        "--turns",
        type=report.numbers(int, 1),
        help="turns T per trajectory, swept (25,50,100,200; quick 25,50)",
    )
    add_clock_arguments(parser, d.unit_ms)
    parser.add_argument(
        "--seeds", type=report.numbers(int, 0), help="seeds of each (T, σ) (default 0-4; quick 0-2)"
    )


def settings(args: argparse.Namespace) -> Settings:
    """`--quick` picks the base; every option given explicitly overrides it."""
    return report.pick_settings(args, FULL, QUICK)


# -- the draws and the ideal schedule ----------------------------------------------------------------
def latency_draws(s: Settings, turns: int, sigma: float, seed: int) -> list[list[float]]:
    """Per env, in modelled s: its reset latency, then its T step latencies (what `LatencyEnv` sleeps)."""
    from engine.envs.latency import LatencyModel  # numpy: not at CLI start

    out = []
    for i in range(s.envs):
        reset = LatencyModel(s.mu, sigma, seed=env_seed(seed, i), stream=0).draws(1)
        out.append(reset + LatencyModel(s.mu, sigma, seed=env_seed(seed, i), stream=1).draws(turns))
    return out


def ideal_times(draws: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(trajectory, batch) step seconds (modelled) with zero generation and scheduling time.

    Trajectory: the env with the largest total ends last. Batch: every stage (reset, then each turn)
    waits for its slowest env.
    """
    traj = max(sum(env) for env in draws)
    batch = sum(max(stage) for stage in zip(*draws, strict=True))
    return traj, batch


# -- one rollout step on the real control plane ------------------------------------------------------
class _Recorded(Env):
    """A `LatencyEnv` that keeps the latencies it slept, in units, so both modes can be checked.

    A step reports its draw (`info["latency"]`); a reset does not, so the k-th reset's draw is read
    from the env's own reset sequence.
    """

    name = "recorded"

    def __init__(self, inner: LatencyEnv) -> None:
        self.inner, self.instructions = inner, inner.instructions
        self.slept: list[float] = []
        self._resets = 0

    async def reset(self, seed: int) -> str:
        obs = await self.inner.reset(seed)
        self._resets += 1
        self.slept.append(self.inner.reset_model.draws(self._resets)[-1])
        return obs

    async def step(self, action: str) -> EnvStep:
        result = await self.inner.step(action)
        self.slept.append(result.info["latency"])
        return result


async def rollout_step(
    s: Settings, turns: int, sigma: float, granularity: str, chat: ChatFormat, timeout_s: float, seed: int
) -> dict[str, Any]:
    """Run E trajectories of `turns` turns to the buffer once; return the step's modelled seconds, what each
    env slept, and the modelled device's busy seconds. `timeout_s` is on the loop's clock.

    Env i (in the order the scheduler builds them) is seeded `env_seed(seed, i)`.
    """
    from engine.backends.modelled import ModelledBackend
    from engine.devices import get_device, get_model
    from engine.rollout.assembly import RolloutSpec, build_rollout
    from engine.rollout.env_manager import TurnLimits
    from engine.rollout.proxy import GenSlot, LLMProxy
    from engine.rollout.scheduler import TaskSpec
    from engine.types import Profile, TrajStatus

    unit_s = clock_unit_s(s.clock, s.unit_ms)
    envs: list[_Recorded] = []
    factory = _recorded_envs(envs, s.mu, sigma, seed, unit_s)
    backend = ModelledBackend(
        get_model(MODEL),
        get_device(DEVICE),
        time_scale=unit_s,
        max_batch=s.envs,
    )
    proxy = LLMProxy([GenSlot("gen0", "gpu-compute", backend, capacity=s.envs)])
    groups = s.envs // GROUP_SIZE
    limits = TurnLimits(turns, ACTION_TOKENS, MAX_CONTEXT, env_timeout_s=ENV_TIMEOUT_S)
    task = TaskSpec(
        "synthetic", "synthetic", {"turns": turns}, 1.0, GROUP_SIZE, limits, Profile.PREFILL_HEAVY.value
    )
    # AReaL admission with α = 0 starts exactly one step's groups in trajectory mode: nothing beyond the
    # E measured envs competes for the CPU. (Batch granularity starts its waves itself.)
    spec = RolloutSpec(
        tasks=(task,), concurrency=s.envs, batch_groups=groups, seed=seed, granularity=granularity
    )
    buffer, scheduler = build_rollout(spec, chat, proxy, factory)
    what = f"{granularity} rollout (T={turns}, σ={sigma})"
    with measured_gc():
        try:
            batch, elapsed = await run_to_batch(scheduler, buffer, groups, timeout_s, what)
        finally:
            await backend.close()
    members = [m for g in batch for m in g.members]
    if any(m.status != TrajStatus.DONE or len(m.turns) != turns or m.reward != 1.0 for m in members):
        raise RuntimeError(f"{granularity} rollout: a trajectory did not play {turns} turns to reward 1")
    return {
        "seconds": elapsed / unit_s,
        "slept": [e.slept for e in envs[: s.envs]],
        "busy_s": backend.stats()["busy_s"],  # modelled seconds the device worked
    }


def _recorded_envs(
    envs: list[_Recorded], mu: float, sigma: float, seed: int, unit_s: float
) -> Callable[[TaskSpec], Env]:
    """The scheduler's env factory: the task's env in a `LatencyEnv` (env i seeded `env_seed(seed, i)`),
    recorded; it appends each env it builds to `envs`."""
    from engine.envs.latency import LatencyEnv
    from engine.envs.registry import make_env

    def factory(task: TaskSpec) -> Env:
        latency = (mu, sigma)
        inner = make_env(task.env, **task.env_args)
        envs.append(
            _Recorded(LatencyEnv(inner, latency, latency, seed=env_seed(seed, len(envs)), time_scale=unit_s))
        )
        return envs[-1]

    return factory


async def _one(s: Settings, turns: int, sigma: float, seed: int, chat: ChatFormat) -> dict[str, Any]:
    """Both granularities on one seed's draws: modelled times, the ideal from the draws, device busy."""
    draws = latency_draws(s, turns, sigma, seed)
    ideal_traj, ideal_batch = ideal_times(draws)
    timeout_s = (3 * ideal_batch) * clock_unit_s(s.clock, s.unit_ms) + 60  # a hung run fails with its counts
    traj = await rollout_step(s, turns, sigma, "trajectory", chat, timeout_s, seed)
    batch = await rollout_step(s, turns, sigma, "batch", chat, timeout_s, seed)
    for mode, got in (("trajectory", traj), ("batch", batch)):
        if got["slept"] != draws:
            raise RuntimeError(
                f"T={turns}, σ={sigma}, seed {seed}: the {mode} run's envs slept other latencies"
            )
    return {
        "seed": seed,
        "traj_s": traj["seconds"],
        "batch_s": batch["seconds"],
        "speedup": batch["seconds"] / traj["seconds"],
        "ideal_traj_s": ideal_traj,
        "ideal_batch_s": ideal_batch,
        "ideal_speedup": ideal_batch / ideal_traj,
        "efficiency": ideal_traj / traj["seconds"],
        "batch_efficiency": ideal_batch / batch["seconds"],
        "device_busy_traj": traj["busy_s"] / traj["seconds"],  # the modelled H800's share
        "device_busy_batch": batch["busy_s"] / batch["seconds"],
    }


def _row(s: Settings, turns: int, sigma: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One (T, σ): the median of each figure over the seeds, the speedup's bootstrap 95% interval."""
    speedup, low, high = report.median_ci([r["speedup"] for r in runs])
    keys = [k for k in runs[0] if k not in ("seed", "speedup")]
    return {
        "turns": turns,
        "sigma": sigma,
        "speedup": speedup,
        "ci_low": low,
        "ci_high": high,
        "paper_speedup": PAPER_SPEEDUP.get(sigma) if s.mu == 10.0 else None,
        **{k: statistics.median(r[k] for r in runs) for k in keys},
        "runs": runs,
    }


async def _measure(s: Settings) -> list[dict[str, Any]]:
    from engine.models.tokenizer import train_tokenizer
    from engine.rollout.chat import ChatFormat

    chat = ChatFormat(train_tokenizer(vocab_size=512, seed=0))
    rows = []
    for turns in s.turns:
        for sigma in s.sigmas:
            runs = [await _one(s, turns, sigma, seed, chat) for seed in s.seeds]
            rows.append(_row(s, turns, sigma, runs))
    return rows


# -- output ------------------------------------------------------------------------------------------
def _plot(rows: list[dict[str, Any]], s: Settings, path: str | None) -> str:
    fig, ax = report.new_figure()
    for k, turns in enumerate(s.turns):
        mine = [r for r in rows if r["turns"] == turns]
        sig = [r["sigma"] for r in mine]
        ax.plot(sig, [r["speedup"] for r in mine], "o-", color=f"C{k}", label=f"T={turns} measured")
        ax.plot(
            sig, [r["ideal_speedup"] for r in mine], "--", color=f"C{k}", alpha=0.5, label=f"T={turns} ideal"
        )
    if s.mu == 10.0:
        ax.plot(list(PAPER_SPEEDUP), list(PAPER_SPEEDUP.values()), "kx", ms=10, mew=2, label="paper (R2)")
    ax.set(xlabel="env latency σ (s)", ylabel="speedup (batch / trajectory step time)")
    ax.set_title(f"Trajectory vs batch rollout: E={s.envs}, μ={s.mu} s, {s.clock} clock")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return report.save_figure(fig, path, "rollout_granularity.png")


def _table(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The printed columns, short enough for 80 characters; the JSON keeps every field."""
    return [
        {
            "T": str(r["turns"]),
            "σ": f"{r['sigma']:g}",
            "traj_s": f"{r['traj_s']:.1f}",
            "batch_s": f"{r['batch_s']:.1f}",
            "speedup": report.ci_text(r["speedup"], r["ci_low"], r["ci_high"], ".3f"),
            "paper": "—" if r["paper_speedup"] is None else f"{r['paper_speedup']:.2f}",
            "ideal×": f"{r['ideal_speedup']:.3f}",
            "eff": f"{r['efficiency']:.3f}",
        }
        for r in rows
    ]


def _verdict(rows: list[dict[str, Any]]) -> str:
    """Each paper point against every T: where ours meets it and where not."""
    return "; ".join(
        f"σ={r['sigma']:g}, T={r['turns']}: {r['speedup']:.3f}x vs {r['paper_speedup']:.2f}x "
        f"({'meets' if r['speedup'] >= r['paper_speedup'] else 'below'})"
        for r in rows
        if r["paper_speedup"] is not None
    )


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """batch/trajectory step time at every T for each σ the paper gives (all rows if it gives none), beside
    the ideal from the draws; the interval is over the seeds' draws."""
    rows = [r for r in payload["rows"] if r["paper_speedup"] is not None] or payload["rows"]
    return [
        report.headline_row(
            f"step time batch/trajectory, σ={r['sigma']:g}, T={r['turns']}",
            r["speedup"],
            r["ci_low"],
            r["ci_high"],
            paper=r["paper_speedup"],
            ideal=r["ideal_speedup"],
        )
        for r in rows
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = settings(args)
    rows = run_loop(_measure(s), s.clock == "virtual")
    note = (
        f"E={s.envs} envs; env latency N(μ={s.mu} s, σ) truncated at 0; generation {MODEL} on {DEVICE}, "
        f"{ACTION_TOKENS}-token actions; {clock_note(s.clock, s.unit_ms)}\n"
        "Times in modelled seconds. ideal× = ideal batch / ideal trajectory time from the draws alone; "
        "eff = ideal trajectory time / traj_s.\n"
        "Paper (R2, μ=10, T not stated): 1.23x at σ=1, 2.27x at σ=10. "
        f"Ours: {_verdict(rows) or 'no paper point'}."
    )
    config = {
        "group_size": GROUP_SIZE,
        "action_tokens": ACTION_TOKENS,
        "model": MODEL,
        "device": DEVICE,
        "cpus": os.cpu_count(),
    }
    # on the wall clock other processes share the CPUs: the load is part of the result
    load = {"load_1m": os.getloadavg()[0]} if s.clock == "wall" else {}
    return report.publish(
        args,
        "R2: rollout step time, trajectory vs batch granularity",
        s,
        rows,
        note,
        table=_table(rows),
        config=config,
        plot=lambda path: _plot(rows, s, path),
        paper={str(k): v for k, v in PAPER_SPEEDUP.items()},
        draws_checked=True,  # `_measure` raises if any env slept other latencies than precomputed
        **load,
    )
