"""R2 of the paper: trajectory-level against batch-level rollout as env latency variance grows (§6.1).

E environments each play one trajectory of T turns. Every reset and step first sleeps a draw from a
Gaussian (μ, σ) truncated at 0 (`LatencyEnv` around a fixed-length `SyntheticEnv`), in time units of
`--unit-ms` wall milliseconds. One unit stands for one modelled second, and the generation backend
(`ModelledBackend`: Qwen2.5-7B on one H800, 16-token actions) is paced on the same scale, so LLM time and
env time keep their real proportion — generation is about 1% of a 10 s env step.

For each σ the same draws run through the real control plane twice (LLMProxy → ModelledBackend,
EnvManager, RolloutScheduler, RewardScorer, SampleBuffer): (a) trajectory granularity, and (b) batch
granularity, where every turn's generation waits for the slowest env (`LockstepGenerator`). Env i is
seeded `seed + i` in both modes, and the latencies each env slept are checked against the precomputed
draws after every run. One rollout step = all E trajectories scored and in the buffer (E/8 GRPO groups
of 8, no redundancy).

Ideal times from the draws alone (no generation, no scheduling overhead): trajectory mode ends when the
env with the largest total latency ends (max over envs of the sum); batch mode pays each turn's slowest
env (sum over turns of the max). efficiency = ideal_traj_s / traj_s.

Why T is large: at σ = 1 the batch/trajectory ratio is about (T+1)(μ + zσ) / ((T+1)μ + zσ√(T+1)) with
z ≈ 2.6 for the max of 128 normals; it tends to 1.26 and reaches the paper's 1.23 only from T ≈ 150 on.
The full run uses T = 200 turns (the paper's prefill-heavy tasks have 30–100; the paper does not state
the T of R2); `--quick` runs T = 50, where the ideal σ = 1 ratio is ~1.22, at 5 ms per unit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from bench.harness import steady_gc
from bench.report import new_figure, print_table, save_figure, write_json
from engine.envs.base import Env, EnvStep

if TYPE_CHECKING:
    from engine.envs.latency import LatencyEnv
    from engine.rollout.chat import ChatFormat

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
    turns: int = 200
    unit_ms: float = 10.0
    seed: int = 0


FULL = Settings()
QUICK = Settings(turns=50, unit_ms=5.0)


# -- arguments ---------------------------------------------------------------------------------------
def _sigmas(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, e.g. 1,2,5,10; got {text!r}"
        ) from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"sigmas must be >= 0, got {text!r}")
    return values


def _envs(text: str) -> int:
    n = int(text)
    if n < GROUP_SIZE or n % GROUP_SIZE:
        raise argparse.ArgumentTypeError(
            f"envs must be a positive multiple of {GROUP_SIZE} (GRPO groups of {GROUP_SIZE}), got {text}"
        )
    return n


def _at_least(kind: type, low: float, strict: bool) -> Any:
    """An argparse type: `kind(text)`, which must be > low (strict) or >= low."""

    def parse(text: str) -> Any:
        value = kind(text)
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got {text}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d, q = FULL, QUICK
    parser.add_argument(
        "--mu", type=_at_least(float, 0, True), help=f"mean env latency in units (default {d.mu})"
    )
    parser.add_argument("--sigmas", type=_sigmas, help="env latency std devs in units (default 1,2,5,10)")
    parser.add_argument("--envs", type=_envs, help=f"concurrent environments E (default {d.envs})")
    parser.add_argument(
        "--turns", type=_at_least(int, 1, False), help=f"turns T per trajectory ({d.turns}; quick {q.turns})"
    )
    parser.add_argument(
        "--unit-ms",
        type=_at_least(float, 0, True),
        help=f"wall ms per time unit ({d.unit_ms}; quick {q.unit_ms})",
    )
    parser.add_argument(
        "--seed", type=_at_least(int, 0, False), help="env i's latencies are seeded seed + i (default 0)"
    )


def settings(args: argparse.Namespace) -> Settings:
    """`--quick` picks the base; every option given explicitly overrides it."""
    given = {
        f.name: getattr(args, f.name) for f in fields(Settings) if getattr(args, f.name, None) is not None
    }
    return replace(QUICK if getattr(args, "quick", False) else FULL, **given)


# -- the draws and the ideal schedule ----------------------------------------------------------------
def latency_draws(s: Settings, sigma: float) -> list[list[float]]:
    """Per env, in units: its reset latency, then its T step latencies (what `LatencyEnv` sleeps)."""
    from engine.envs.latency import LatencyModel  # numpy: not at CLI start

    out = []
    for i in range(s.envs):
        reset = LatencyModel(s.mu, sigma, seed=s.seed + i, stream=0).draws(1)
        out.append(reset + LatencyModel(s.mu, sigma, seed=s.seed + i, stream=1).draws(s.turns))
    return out


def ideal_times(draws: Sequence[Sequence[float]], unit_s: float) -> tuple[float, float]:
    """(trajectory, batch) step seconds with zero generation and scheduling time.

    Trajectory: the env with the largest total ends last. Batch: every stage (reset, then each turn)
    waits for its slowest env.
    """
    traj = max(sum(env) for env in draws)
    batch = sum(max(stage) for stage in zip(*draws, strict=True))
    return traj * unit_s, batch * unit_s


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
    s: Settings, sigma: float, granularity: str, chat: ChatFormat, timeout_s: float
) -> dict[str, Any]:
    """Run E trajectories to the buffer once; return the wall time, what each env slept, device time.

    Env i (in the order the scheduler builds them) is seeded `s.seed + i`.
    """
    from engine.backends.modelled import ModelledBackend
    from engine.devices import get_device, get_model
    from engine.envs.latency import LatencyEnv
    from engine.envs.registry import make_env
    from engine.rollout.buffer import SampleBuffer
    from engine.rollout.env_manager import TurnLimits
    from engine.rollout.proxy import GenSlot, LLMProxy
    from engine.rollout.reward import RewardScorer
    from engine.rollout.scheduler import RolloutScheduler, TaskSpec
    from engine.rollout.staleness import StalenessPolicy
    from engine.types import Profile, TrajStatus

    unit_s = s.unit_ms / 1000
    envs: list[_Recorded] = []

    def factory(task: TaskSpec) -> Env:
        latency = (s.mu, sigma)
        inner = make_env(task.env, **task.env_args)
        envs.append(
            _Recorded(LatencyEnv(inner, latency, latency, seed=s.seed + len(envs), time_scale=unit_s))
        )
        return envs[-1]

    backend = ModelledBackend(get_model(MODEL), get_device(DEVICE), time_scale=unit_s, max_batch=s.envs)
    proxy = LLMProxy([GenSlot("gen0", "gpu-compute", backend, capacity=s.envs)])
    buffer = SampleBuffer(alpha=0)
    groups = s.envs // GROUP_SIZE
    limits = TurnLimits(s.turns, ACTION_TOKENS, MAX_CONTEXT, env_timeout_s=ENV_TIMEOUT_S)
    task = TaskSpec(
        "synthetic", "synthetic", {"turns": s.turns}, 1.0, GROUP_SIZE, limits, Profile.PREFILL_HEAVY.value
    )
    # AReaL admission with α = 0 starts exactly one step's groups in trajectory mode: nothing beyond the
    # E measured envs competes for the CPU. (Batch granularity starts its waves itself.)
    scheduler = RolloutScheduler(
        [task], chat, proxy, buffer, RewardScorer(), factory, StalenessPolicy("areal", 0),
        concurrency=s.envs, batch_groups=groups, seed=s.seed, granularity=granularity,
    )  # fmt: skip
    with steady_gc():
        t0 = time.perf_counter()
        runner = asyncio.ensure_future(scheduler.run())
        try:
            batch = await buffer.get_batch(groups, current_version=0, timeout_s=timeout_s)
            elapsed = time.perf_counter() - t0
        except TimeoutError:
            raise RuntimeError(f"{granularity} rollout (σ={sigma}) unfinished after {timeout_s:.0f} s: "
                               f"{dict(scheduler.counts)}") from None  # fmt: skip
        finally:
            scheduler.stop()
            await runner
            await backend.close()
    members = [m for g in batch for m in g.members]
    if any(m.status != TrajStatus.DONE or len(m.turns) != s.turns or m.reward != 1.0 for m in members):
        raise RuntimeError(f"{granularity} rollout: a trajectory did not play {s.turns} turns to reward 1")
    return {
        "seconds": elapsed,
        "slept": [e.slept for e in envs[: s.envs]],
        "busy_s": backend.stats()["busy_s"] * unit_s,  # wall seconds the modelled device worked
    }


async def _measure(s: Settings) -> list[dict[str, Any]]:
    from engine.models.tokenizer import train_tokenizer
    from engine.rollout.chat import ChatFormat

    chat = ChatFormat(train_tokenizer(vocab_size=512, seed=0))
    unit_s = s.unit_ms / 1000
    rows = []
    for sigma in s.sigmas:
        draws = latency_draws(s, sigma)
        ideal_traj, ideal_batch = ideal_times(draws, unit_s)
        timeout_s = 3 * ideal_batch + 60  # a hung run fails with the scheduler's counts
        traj = await rollout_step(s, sigma, "trajectory", chat, timeout_s)
        batch = await rollout_step(s, sigma, "batch", chat, timeout_s)
        for mode, got in (("trajectory", traj), ("batch", batch)):
            if got["slept"] != draws:
                raise RuntimeError(f"σ={sigma}: the {mode} run's envs slept other latencies than precomputed")
        rows.append(
            {
                "sigma": sigma,
                "traj_s": traj["seconds"],
                "batch_s": batch["seconds"],
                "speedup": batch["seconds"] / traj["seconds"],
                "paper_speedup": PAPER_SPEEDUP.get(sigma) if s.mu == 10.0 else None,
                "ideal_traj_s": ideal_traj,
                "ideal_batch_s": ideal_batch,
                "ideal_speedup": ideal_batch / ideal_traj,
                "efficiency": ideal_traj / traj["seconds"],
                "batch_efficiency": ideal_batch / batch["seconds"],
                "device_busy_traj": traj["busy_s"] / traj["seconds"],  # the modelled H800's share
                "device_busy_batch": batch["busy_s"] / batch["seconds"],
                "load_1m": os.getloadavg()[0],  # other processes share the CPUs: read eff against this
            }
        )
    return rows


# -- output ------------------------------------------------------------------------------------------
def _plot(rows: list[dict[str, Any]], s: Settings, path: str | None) -> str:
    fig, ax = new_figure()
    sig = [r["sigma"] for r in rows]
    ax.plot(sig, [r["speedup"] for r in rows], "o-", label="ours (measured)")
    ax.plot(sig, [r["ideal_speedup"] for r in rows], "s--", alpha=0.6, label="ours (ideal, from the draws)")
    if s.mu == 10.0:
        ax.plot(list(PAPER_SPEEDUP), list(PAPER_SPEEDUP.values()), "x", ms=10, mew=2, label="paper (R2)")
    ax.set(xlabel="env latency σ (units)", ylabel="speedup (batch / trajectory step time)")
    ax.set_title(f"Trajectory vs batch rollout: E={s.envs}, T={s.turns}, μ={s.mu}")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path, "rollout_granularity.png")


def _table(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The printed columns, short enough for 80 characters; the JSON keeps every field."""
    return [
        {
            "σ": f"{r['sigma']:g}",
            "traj_s": f"{r['traj_s']:.2f}",
            "batch_s": f"{r['batch_s']:.2f}",
            "speedup": f"{r['speedup']:.2f}",
            "paper": "—" if r["paper_speedup"] is None else f"{r['paper_speedup']:.2f}",
            "ideal_t": f"{r['ideal_traj_s']:.2f}",
            "ideal_b": f"{r['ideal_batch_s']:.2f}",
            "ideal×": f"{r['ideal_speedup']:.2f}",
            "eff": f"{r['efficiency']:.3f}",
        }
        for r in rows
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = settings(args)
    rows = asyncio.run(_measure(s))
    paper_rows = [r for r in rows if r["paper_speedup"] is not None]
    verdict = ", ".join(
        f"σ={r['sigma']:g}: {r['speedup']:.2f}x vs {r['paper_speedup']:.2f}x "
        f"({'>=' if r['speedup'] >= r['paper_speedup'] else 'BELOW'} paper)"
        for r in paper_rows
    )
    note = (
        f"E={s.envs} envs x T={s.turns} turns; env latency N(μ={s.mu}, σ) truncated at 0 units, "
        f"1 unit = {s.unit_ms} ms; generation {MODEL} on {DEVICE}, {ACTION_TOKENS}-token actions.\n"
        "ideal_t / ideal_b: step time from the draws alone; ideal× = ideal_b / ideal_t; "
        "eff = ideal_t / traj_s.\n"
        f"Paper (R2, μ=10): 1.23x at σ=1 rising to 2.27x at σ=10. Ours: {verdict or 'no paper point'}.\n"
        f"1-min load average after each σ: {', '.join(format(r['load_1m'], '.1f') for r in rows)} "
        f"on {os.cpu_count()} CPUs."
    )
    print_table("R2: rollout step time, trajectory vs batch granularity", _table(rows), note)
    config = asdict(s) | {
        "sigmas": list(s.sigmas),  # as JSON reads it back
        "quick": bool(getattr(args, "quick", False)),
        "group_size": GROUP_SIZE,
        "action_tokens": ACTION_TOKENS,
        "model": MODEL,
        "device": DEVICE,
        "cpus": os.cpu_count(),
    }
    payload: dict[str, Any] = {
        "rows": rows,
        "config": config,
        "paper": {str(k): v for k, v in PAPER_SPEEDUP.items()},
        "draws_checked": True,  # `_measure` raises if any env slept other latencies than precomputed
        "png": _plot(rows, s, getattr(args, "json", None)),
    }
    write_json(getattr(args, "json", None), payload)
    return payload
