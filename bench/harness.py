"""One rollout step through the real control plane with modelled devices and envs.

Shared by the paper-scale benchmarks (affinity, pd, serverless, redundancy, scale). What is real: the
LLMProxy (affinity routing, fallback, sticky prefix-cache reuse), one EnvManager loop per env, the
RolloutScheduler (groups, redundancy, refills), the RewardScorer and the SampleBuffer. What is modelled: the
model call (a `ModelledBackend`/`PDBackend` per generation slot, sleeping its roofline time) and the env step
(`WorkloadEnv` inside a `LatencyEnv`, sleeping a seeded latency). Both are paced on the event loop's clock,
`unit_s` clock seconds per modelled second, so a step's duration on that clock / `unit_s` is its modelled
duration. The clock is simulated (`bench.clock`, `unit_s` = 1: exact and load-independent, the default) or
the wall clock (`--clock wall`, `unit_s` = `--unit-ms` / 1000: the control plane feels real waiting, and its
CPU time, on a loaded machine, counts too).

A *step* is one batch: `groups` GRPO groups start at once (AReaL admission with α = 0 lets exactly that
many start), and the step ends when all of them are complete in the buffer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from bench.clock import VirtualClockLoop
from bench.report import at_least
from engine.envs.base import Env, EnvStep

if TYPE_CHECKING:
    from engine.rollout.buffer import SampleBuffer
    from engine.rollout.chat import ChatFormat
    from engine.rollout.proxy import GenSlot
    from engine.rollout.reward import RewardFn
    from engine.rollout.scheduler import RolloutScheduler, TaskSpec
    from engine.types import GenRequest, Group, Trajectory

FILLER = "the agent reads the file and the test output "  # observation padding, ~1 token a word


@dataclass(frozen=True)
class Workload:
    """One task of the mix: episode shape, env latency and how many tokens a turn generates."""

    name: str
    profile: str  # "prefill-heavy" | "decode-heavy": the LLMProxy's affinity tag
    turns: tuple[int, int]  # episode length, drawn per group (members of a group share it)
    obs_tokens: int  # tokens of each observation
    action_tokens: tuple[int, int]  # generated per turn, drawn per request; the upper end is max_tokens
    weight: float = 1.0
    group_size: int = 8
    env_latency: tuple[float, float] = (0.0, 0.0)  # (mu, sigma) modelled seconds per reset and step
    fail_rate: float = 0.0  # chance an env dies mid-episode (a crashed sandbox)
    straggler_rate: float = 0.0  # chance an env is a straggler ...
    straggler_factor: float = 1.0  # ... whose latencies are this many times longer


def agentic_mix(
    swe_turns: tuple[int, int], obs_tokens: int, cot_tokens: tuple[int, int], env_latency_s: float = 0.5
) -> list[Workload]:
    """The paper's two-task mix, each group one of the two with equal weight (lengths are our assumptions):
    a prefill-heavy SWE-like task (`swe_turns` turns of `obs_tokens`-token observations, 16–96-token actions)
    and a decode-heavy long-CoT task (1–5 turns of 300-token prompts, `cot_tokens` tokens per answer)."""
    lat = (env_latency_s, 0.4 * env_latency_s)
    return [
        Workload("swe", "prefill-heavy", swe_turns, obs_tokens, (16, 96), env_latency=lat),
        Workload("math", "decode-heavy", (1, 5), 300, cot_tokens, env_latency=(0.4 * lat[0], 0.1 * lat[0])),
    ]


def output_tokens(workloads: Sequence[Workload]) -> Callable[[GenRequest, random.Random], int]:
    """The backends' `output_tokens`: a uniform draw from the request's task's action range."""
    spans = {w.name: w.action_tokens for w in workloads}

    def draw(request: GenRequest, rng: random.Random) -> int:
        low, high = spans[request.task]
        return rng.randint(low, high)

    return draw


class WorkloadEnv(Env):
    """Plays `turns` steps (drawn from the seed), observations of `obs_tokens` tokens; reward 1 at the end.

    With probability `fail_rate` (drawn from the env's `salt`) the env raises at a random step, as a
    crashed sandbox does; the scheduler then refills or drops the group.
    """

    name = "workload"
    instructions = "Solve the task."

    def __init__(self, w: Workload, filler: str, salt: int) -> None:
        self.w, self.filler = w, filler
        self.fail_rng = random.Random(f"fail:{salt}")
        self.turns, self.steps, self.fail_at = 0, 0, -1

    async def reset(self, seed: int) -> str:
        self.turns = random.Random(seed).randint(*self.w.turns)
        self.steps = 0
        failing = self.fail_rng.random() < self.w.fail_rate
        self.fail_at = self.fail_rng.randint(1, self.turns) if failing else -1
        return self.filler

    async def step(self, action: str) -> EnvStep:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError(f"sandbox died at step {self.steps}")
        done = self.steps >= self.turns
        return EnvStep(self.filler, 1.0 if done else 0.0, done)


@cache
def chat_format() -> ChatFormat:
    """The small local tokenizer's chat framing (trained once per process), remembering what it encoded.

    The modelled envs repeat one observation text, and on 2 CPU cores the byte-level BPE (~4 µs a token)
    would be the bottleneck of a paper-scale step: a cost a deployment spreads over its env CPU pool. So
    `ChatFormat._enc` answers repeated texts from a dict; decoding and everything else run as they are.
    """
    from engine.models.tokenizer import train_tokenizer
    from engine.rollout.chat import ChatFormat

    class _Remembering(ChatFormat):
        def __init__(self, tokenizer: Any) -> None:
            self._known: dict[str, list[int]] = {}
            super().__init__(tokenizer)

        def _enc(self, text: str) -> list[int]:
            ids = self._known.get(text)
            if ids is None:
                ids = self._known[text] = super()._enc(text)
            return list(ids)

    return _Remembering(train_tokenizer(vocab_size=512, seed=0))


@cache
def filler(tokens: int) -> str:
    """An observation text that is `tokens` tokens long, give or take one word."""
    per_word = len(chat_format()._enc(FILLER * 64)) / (64 * len(FILLER.split()))
    words = FILLER.split()
    return " ".join(words[i % len(words)] for i in range(max(1, round(tokens / per_word))))


class _MemberNames:
    """Names each env the scheduler builds, in launch order: "g<i>.m<j>" for the members every group starts
    with (the scheduler starts a group's G + r members one after the other, all groups at once), then
    "refill<n>". An env's straggling, failure and latencies are drawn from its name, so a run with more
    redundancy has the same first G members per group as one with less, plus extra ones."""

    def __init__(self, groups: int, redundancy: int) -> None:
        self.groups, self.redundancy = groups, redundancy
        self.group = self.member = self.refills = 0

    def next(self, group_size: int) -> str:
        if self.group >= self.groups:
            self.refills += 1
            return f"refill{self.refills}"
        name = f"g{self.group}.m{self.member}"
        self.member += 1
        if self.member == group_size + self.redundancy:
            self.group, self.member = self.group + 1, 0
        return name


@dataclass
class StepResult:
    modelled_s: float  # the step's duration / unit_s
    clock_s: float  # the step's duration on the loop's clock
    trajectories: list[Trajectory]  # every member that ended (kept, cancelled, failed)
    counts: dict[str, int]
    proxy: dict[str, Any]  # LLMProxy.summary()
    mean_gen_modelled_s: float  # a request's modelled time in its engine, mean over the last 20k requests


@contextlib.contextmanager
def rare_gc() -> Iterator[None]:
    """Collect the young generation every 10,000 allocations, not CPython's default 700 (as long-lived servers
    do); restore the thresholds afterwards. Reference counting still frees acyclic garbage at once."""
    threshold = gc.get_threshold()
    gc.set_threshold(10_000, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


@contextlib.contextmanager
def steady_gc() -> Iterator[None]:
    """Keep the garbage collector's pauses out of a wall-clock measurement; restore its settings afterwards.

    Measured: with torch and transformers loaded, CPython's default thresholds collect every few hundred
    allocations and a full pass walks every loaded object: 5–10% of the event loop's time (a 0.1-s pause
    stalls every env loop at once). Freezing what exists before the run and collecting rarely (`rare_gc`)
    leaves the control plane's own cost.
    """
    gc.collect()
    gc.freeze()
    try:
        with rare_gc():
            yield
    finally:
        gc.unfreeze()


def measured_gc() -> contextlib.AbstractContextManager[None]:
    """`steady_gc` on the wall clock; under the simulated clock (`bench.clock`), where a collector's pause
    costs no time, only `rare_gc`: `steady_gc`'s own full collection would cost more CPU than it saves, while
    collecting rarely saves some (measured: the collector's 0.95 s in a 12-s `bench affinity` run: 0.32 s)."""
    simulated = isinstance(asyncio.get_running_loop(), VirtualClockLoop)
    return rare_gc() if simulated else steady_gc()


async def rollout_step(
    workloads: Sequence[Workload],
    slots: Sequence[GenSlot],
    *,
    groups: int,
    unit_s: float,
    seed: int = 0,
    redundancy: int = 0,
    reward: RewardFn | None = None,
    timeout_s: float = 36_000.0,
) -> StepResult:
    """Run one step of `groups` groups through LLMProxy(slots) → envs → reward → buffer (module doc).

    `timeout_s` (loop-clock seconds) turns a hung step into an error carrying the scheduler's counts.
    """
    from engine.rollout.assembly import RolloutSpec, build_rollout
    from engine.rollout.proxy import LLMProxy

    factory = _workload_envs(workloads, groups, redundancy, seed, unit_s)
    proxy = LLMProxy(list(slots))
    members = groups * (max(w.group_size for w in workloads) + redundancy)
    spec = RolloutSpec(
        tasks=tuple(_task_specs(workloads)),
        concurrency=members,
        redundancy=redundancy,
        batch_groups=groups,
        seed=seed,
    )
    buffer, scheduler = build_rollout(spec, chat_format(), proxy, factory, reward)
    with measured_gc():
        _, elapsed = await run_to_batch(scheduler, buffer, groups, timeout_s, "rollout step")
    timings = proxy.stats.timings
    mean_gen = sum(t.get("modelled_s", 0.0) for t in timings) / max(len(timings), 1)
    return StepResult(
        elapsed / unit_s,
        elapsed,
        scheduler.ledger.drain_finished(),
        dict(scheduler.ledger.counts),
        proxy.summary(),
        mean_gen,
    )


def _workload_envs(
    workloads: Sequence[Workload], groups: int, redundancy: int, seed: int, unit_s: float
) -> Callable[[TaskSpec], Env]:
    """The scheduler's env factory: a `WorkloadEnv` in a `LatencyEnv`, its straggling and latencies drawn
    from the env's name (`_MemberNames`) under `seed`."""
    from engine.envs.latency import LatencyEnv

    by_name = {w.name: w for w in workloads}
    names = _MemberNames(groups, redundancy)

    def factory(task: TaskSpec) -> Env:
        w, name = by_name[task.name], names.next(task.group_size)
        key = zlib.crc32(f"{seed}:{name}".encode())
        slow = w.straggler_factor if random.Random(f"straggle:{key}").random() < w.straggler_rate else 1.0
        latency = (w.env_latency[0] * slow, w.env_latency[1] * slow)
        return LatencyEnv(
            WorkloadEnv(w, filler(w.obs_tokens), key), latency, latency, seed=key, time_scale=unit_s
        )

    return factory


def _task_specs(workloads: Sequence[Workload]) -> list[TaskSpec]:
    """One scheduler task per workload, with room for its longest episode and action."""
    from engine.rollout.env_manager import TurnLimits
    from engine.rollout.scheduler import TaskSpec

    return [
        TaskSpec(
            w.name, "workload", {}, w.weight, w.group_size,
            TurnLimits(w.turns[1], w.action_tokens[1], 1 << 24, env_timeout_s=1e6),
            w.profile,
        )
        for w in workloads
    ]  # fmt: skip


async def run_to_batch(
    scheduler: RolloutScheduler, buffer: SampleBuffer, groups: int, timeout_s: float, what: str
) -> tuple[list[Group], float]:
    """Run `scheduler` until `groups` groups are complete in `buffer`: those groups, and the loop-clock
    seconds that took. The scheduler is stopped and awaited either way; past `timeout_s` (loop-clock
    seconds) a RuntimeError names `what` and carries the scheduler's counts."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    runner = asyncio.ensure_future(scheduler.run())
    try:
        batch = await buffer.get_batch(groups, current_version=0, timeout_s=timeout_s)
        elapsed = loop.time() - t0
    except TimeoutError:
        raise RuntimeError(
            f"{what} unfinished after {timeout_s:.0f} s: {dict(scheduler.ledger.counts)}"
        ) from None
    finally:
        scheduler.stop()
        await runner
    return batch, elapsed


# The pool kind each device profile serves as (paper §4): the compute-optimised one takes prefill-heavy work.
POOL_KIND = {"H800": "gpu-compute", "H20": "gpu-bandwidth", "H200": "gpu-bandwidth"}


def modelled_slots(
    model: str,
    fleet: dict[str, int],
    workloads: Sequence[Workload],
    *,
    unit_s: float,
    capacity: int,
    max_batch: int = 256,
    seed: int = 0,
    mfu: float = 1.0,
    mbu: float = 1.0,
) -> list[GenSlot]:
    """One `ModelledBackend` engine (TP = 1) per device of `fleet` ({device name: count}), as proxy slots;
    `mfu`/`mbu`: the achieved fraction of the devices' peak FLOP/s / bandwidth (1.0: datasheet peaks)."""
    from engine.backends.modelled import ModelledBackend
    from engine.devices import get_device, get_model
    from engine.rollout.proxy import GenSlot

    lengths = output_tokens(workloads)
    return [
        GenSlot(
            f"{name.lower()}-{i}",
            POOL_KIND[name],
            ModelledBackend(
                get_model(model), get_device(name), time_scale=unit_s, max_batch=max_batch,
                output_tokens=lengths, seed=seed, mfu=mfu, mbu=mbu,
            ),
            capacity=capacity,
        )
        for name, count in fleet.items()
        for i in range(count)
    ]  # fmt: skip


def busy_share(slots: Sequence[GenSlot], modelled_s: float) -> float:
    """Mean fraction of the step each slot's modelled device was busy."""
    return sum(s.target.stats()["busy_s"] / modelled_s for s in slots) / len(slots)


def add_clock_arguments(p: argparse.ArgumentParser, unit_ms: float) -> None:
    p.add_argument(
        "--clock", choices=["virtual", "wall"], help="simulated clock (default) or real, scaled waiting"
    )
    p.add_argument(
        "--unit-ms",
        type=at_least(float, 0, strict=True),
        help=f"with --clock wall: wall ms per modelled second ({unit_ms})",
    )


def clock_unit_s(clock: str, unit_ms: float) -> float:
    """Loop-clock seconds per modelled second (module doc)."""
    if clock not in ("virtual", "wall") or unit_ms <= 0:
        raise ValueError(f"need --clock virtual|wall and --unit-ms > 0, got {clock!r}, {unit_ms}")
    return 1.0 if clock == "virtual" else unit_ms / 1000


def clock_note(clock: str, unit_ms: float) -> str:
    if clock == "virtual":
        return "simulated clock (control-plane CPU time not counted)."
    return (
        f"wall clock, 1 modelled s = {unit_ms} ms on {os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f})."
    )
