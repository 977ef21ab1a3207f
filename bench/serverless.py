"""`rollart bench serverless` (paper R3): an LLM-judge reward on reserved GPUs vs a serverless endpoint.

Every setup runs the same agentic step (`bench.harness.agentic_mix`, `groups` GRPO groups of 8) on modelled
H800s through the real control plane; every finished trajectory is scored by an LLM judge (Qwen2.5-7B
reading the trajectory, up to `judge_tokens` tokens, and answering in 4) through the real `RewardScorer`.
The setups, fixed before the run (`configs`):

- reserved: of `gpus` GPUs, `reward_gpus` are judge engines behind their own LLMProxy for the whole step,
  the rest generate. Billed: every GPU for the whole step. Utilisation = the judges' busy time /
  (reward_gpus x step time).
- serverless, one row per keep-alive in `idle_s`: the same `gpus - reward_gpus` GPUs generate (the
  reserved setup's generation fleet) and the judge runs on a scale-to-zero endpoint (`ServerlessJudge`): an
  instance (one judge engine on one GPU) starts on demand with a `cold_start_s` delay, serves up to
  `per_instance` calls at once and is released `idle_s` after its last call. Billed, as platforms that
  keep an instance warm bill it: each instance from its start to its release (cold start, serving and the
  keep-alive idle time), at least `billed_min_s` per instance start. Utilisation = the instances' busy time
  / billed time, so a long keep-alive or minimum makes it low: the calls come as trajectories finish,
  spread over the step, and an instance is billed through every gap shorter than its keep-alive.
- serverless with all `gpus` generating (keep-alive `idle_s[0]`): the earlier comparison at equal reserved
  GPUs, with the judge billed on top; its step-time gain mixes in what `reward_gpus` more generation GPUs do
  to the step (with KV memory short, a long-context step can speed up by far more than the GPU ratio).

Cost and the equal-cost comparison: a setup's GPU-seconds per step = generation GPUs x step time + judge
GPU-seconds billed (reserved: reward_gpus x step time; serverless: billed instance time). Every setup does
the same work per step (the same groups, scored), so work per GPU-second is 1 / GPU-seconds per step, and a
budget of B GPU-seconds buys B / (GPU-seconds per step) steps. The gain at equal cost, `gain_per_gpu_s`,
is the reserved setup's GPU-seconds per step / the row's: how many more steps the same GPU-seconds buy.
It is taken per seed (paired: same seed, same episodes) and given as the median over `seeds` with a
bootstrap 95% interval (`ci_low`, `ci_high`, `median_ci`); utilisation likewise (`util_ci_*`), step time,
`speedup` (reserved step time / the row's) and the judge's busy and billed seconds as medians. The
same-fleet serverless rows isolate the judge's placement: their step time is the reserved one's plus any
wait for cold starts, and their gain is the reserved judges' GPU-seconds less the instances' billed ones.
`--quick` runs the same workload on 4 GPUs (1 reserved) with 8 groups and 3 seeds (full: 8, 2, 32, 5).

Modelled and assumed: the devices (roofline `ModelledBackend`), env latencies and episode shapes (our
assumptions, `agentic_mix`), one step (the reserved judges also idle while the trainer trains, and an
instance's keep-alive after the step's last call is billed in full: between steps that either happens or
a next call comes sooner), the cold start, keep-alive and billing minimum (options), and an instance is a
whole GPU for the judge. `infra.serve` deploys the same judge on Ray Serve with `min_replicas=0`; here its
instances are modelled so the step runs at paper scale on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bench import report
from bench.clock import run as run_loop
from bench.harness import (
    add_clock_arguments,
    agentic_mix,
    clock_note,
    clock_unit_s,
    modelled_slots,
    rollout_step,
)

if TYPE_CHECKING:
    from engine.backends.modelled import ModelledBackend
    from engine.types import GenOutput, GenRequest, Trajectory

PAPER = {
    "reward_utilization": {"reserved": 0.06, "serverless": 0.88},
    "rollout_s": {"reserved": 158, "serverless": 77},
}
JUDGE_MODEL, DEVICE = "qwen2.5-7b", "H800"


@dataclass(frozen=True)
class Settings:
    gpus: int = 8
    reward_gpus: int = 2
    groups: int = 32
    swe_turns: tuple[int, int] = (30, 100)
    swe_obs_tokens: int = 1000
    cot_tokens: tuple[int, int] = (2048, 8192)
    judge_tokens: int = 16_384
    cold_start_s: float = 5.0
    idle_s: tuple[float, ...] = (10.0, 60.0)
    billed_min_s: float = 0.0
    per_instance: int = 8
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    clock: str = "virtual"
    unit_ms: float = 40.0


FULL = Settings()
QUICK = replace(FULL, gpus=4, reward_gpus=1, groups=8, seeds=(0, 1, 2))  # the full workload, fewer groups


@dataclass(frozen=True)
class Endpoint:
    """A serverless judge endpoint's scaling and billing (module doc), in modelled seconds."""

    cold_start_s: float = 5.0
    idle_s: float = 10.0
    per_instance: int = 8
    billed_min_s: float = 0.0


@dataclass
class _Instance:
    engine: ModelledBackend
    started: float  # loop clock: when the call that started it arrived
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    inflight: int = 0
    last_used: float = 0.0
    released: float | None = None


class ServerlessJudge:
    """A modelled scale-to-zero endpoint of judge instances (module doc); call it with a `GenRequest`."""

    def __init__(self, make_engine: Callable[[], ModelledBackend], endpoint: Endpoint, unit_s: float) -> None:
        self.make_engine, self.endpoint, self.unit_s = make_engine, endpoint, unit_s
        self.instances: list[_Instance] = []

    @property
    def cold_starts(self) -> int:
        return len(self.instances)  # every instance started cold

    async def __call__(self, request: GenRequest) -> GenOutput:
        loop, e = asyncio.get_running_loop(), self.endpoint
        live = [i for i in self.instances if i.released is None and i.inflight < e.per_instance]
        inst = min(live, key=lambda i: i.inflight) if live else None
        if inst is None:
            inst = _Instance(self.make_engine(), loop.time())
            self.instances.append(inst)
            loop.call_later(e.cold_start_s * self.unit_s, inst.ready.set)
        inst.inflight += 1
        try:
            await inst.ready.wait()
            return await inst.engine.generate(request)
        finally:
            inst.inflight -= 1
            inst.last_used = loop.time()
            if not inst.inflight:
                loop.call_later(e.idle_s * self.unit_s, self._reap, inst)

    def _reap(self, inst: _Instance) -> None:
        now = asyncio.get_running_loop().time()
        idle = self.endpoint.idle_s * self.unit_s
        if not inst.inflight and inst.released is None and now - inst.last_used >= idle * 0.999:
            inst.released = now

    def billed_s(self) -> list[float]:
        """Each instance's billed modelled seconds once its calls are done: from its start to its release
        `idle_s` after its last call (cold start, serving, keep-alive), at least `billed_min_s`."""
        e = self.endpoint
        return [
            max(e.billed_min_s, (i.last_used - i.started) / self.unit_s + e.idle_s) for i in self.instances
        ]

    def utilisation(self) -> tuple[float, float]:
        """(busy, billed) modelled seconds: the engines' work; the instances' billed time (module doc)."""
        busy = sum(i.engine.stats()["busy_s"] for i in self.instances)
        return busy, sum(self.billed_s())


def judge_score(call: Callable[[GenRequest], Any], judge_tokens: int) -> Callable[[Trajectory], Any]:
    """A `RewardScorer` score function: the judge reads the trajectory (capped) and answers in 4 tokens."""
    from engine.types import GenRequest, SamplingParams

    ids = itertools.count()

    async def score(traj: Trajectory) -> float:
        tokens = sum(len(t.obs_ids) + len(t.action_ids) for t in traj.turns)
        req = GenRequest(
            f"judge-{next(ids)}",
            [1] * max(1, min(tokens, judge_tokens)),
            SamplingParams(max_tokens=4),
            task="judge",
        )
        await call(req)
        return traj.env_return

    return score


@dataclass(frozen=True)
class Config:
    """One setup: `gen_gpus` generate; the judge has `reserved` GPUs, or (0) an endpoint kept `idle_s`."""

    setup: str
    gen_gpus: int
    reserved: int = 0
    idle_s: float = 0.0


def configs(s: Settings) -> list[Config]:
    """The setups of the module doc, the reserved one first (the base of every gain)."""
    fleet = s.gpus - s.reward_gpus
    return [
        Config("reserved", fleet, reserved=s.reward_gpus),
        *(Config("serverless", fleet, idle_s=k) for k in s.idle_s),
        Config("serverless", s.gpus, idle_s=s.idle_s[0]),
    ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=report.at_least(int, 2), help=f"H800s of the reserved setup ({FULL.gpus})")
    p.add_argument(
        "--reward-gpus",
        type=report.at_least(int, 1),
        help=f"of them reserved for the judge ({FULL.reward_gpus})",
    )
    p.add_argument(
        "--groups", type=report.at_least(int, 1), help=f"groups of 8 per step (default {FULL.groups})"
    )
    p.add_argument(
        "--cold-start-s", type=report.at_least(float, 0), help=f"instance start time ({FULL.cold_start_s})"
    )
    p.add_argument(
        "--idle-s",
        type=report.numbers(float, 0),
        help="keep-alive after an instance's last call, billed; one serverless row each (default 10,60)",
    )
    p.add_argument(
        "--billed-min-s",
        type=report.at_least(float, 0),
        help=f"billed minimum per instance start ({FULL.billed_min_s})",
    )
    p.add_argument("--seeds", type=report.numbers(int, 0), help="seeds of every setup (default 0,1,2,3,4)")
    add_clock_arguments(p, FULL.unit_ms)


async def _measure(s: Settings, c: Config, seed: int, unit_s: float) -> dict[str, float]:
    """One step of setup `c`: its modelled time, GPU-seconds and the judge's busy and billed seconds."""
    from engine.backends.modelled import ModelledBackend
    from engine.devices import get_device, get_model
    from engine.rollout.proxy import GenSlot, LLMProxy
    from engine.rollout.reward import RewardScorer

    w = agentic_mix(s.swe_turns, s.swe_obs_tokens, s.cot_tokens)
    gen = modelled_slots(JUDGE_MODEL, {DEVICE: c.gen_gpus}, w, unit_s=unit_s, capacity=1 << 20, seed=seed)

    def judge_engine() -> ModelledBackend:
        return ModelledBackend(get_model(JUDGE_MODEL), get_device(DEVICE), time_scale=unit_s)

    judges = [
        GenSlot(f"judge-{i}", "gpu-compute", judge_engine(), capacity=1 << 20) for i in range(c.reserved)
    ]
    endpoint = ServerlessJudge(
        judge_engine, Endpoint(s.cold_start_s, c.idle_s, s.per_instance, s.billed_min_s), unit_s
    )
    call: Any = LLMProxy(judges).generate if judges else endpoint
    reward = RewardScorer(judge_score(call, s.judge_tokens), timeout_s=1e6)
    step = await rollout_step(w, gen, groups=s.groups, unit_s=unit_s, seed=seed, reward=reward)
    if judges:
        busy, billed = sum(j.target.stats()["busy_s"] for j in judges), c.reserved * step.modelled_s
    else:
        busy, billed = endpoint.utilisation()
    return {
        "step_s": step.modelled_s,
        "gpu_s": c.gen_gpus * step.modelled_s + billed,
        "busy_s": busy,
        "billed_s": billed,
        "instances": c.reserved or endpoint.cold_starts,
        "scored": reward.counts["scored"],
    }


def _row(c: Config, runs: list[dict[str, float]], base: list[dict[str, float]], seed: int) -> dict[str, Any]:
    """One setup over the seeds: medians; the gain per GPU-second and utilisation with 95% intervals."""
    pairs = list(zip(base, runs, strict=True))
    gain, low, high = report.median_ci([b["gpu_s"] / r["gpu_s"] for b, r in pairs], seed)
    util, util_low, util_high = report.median_ci([r["busy_s"] / r["billed_s"] for r in runs], seed)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {
        "setup": c.setup,
        "gen_gpus": c.gen_gpus,
        "judge": f"{c.reserved} reserved" if c.reserved else f"keep-alive {c.idle_s:g} s",
        "step_s": med("step_s"),
        "gpu_s_per_step": med("gpu_s"),
        "speedup": statistics.median(b["step_s"] / r["step_s"] for b, r in pairs),
        "gain_per_gpu_s": gain,
        "ci_low": low,
        "ci_high": high,
        "reward_utilization": util,
        "util_ci_low": util_low,
        "util_ci_high": util_high,
        "judge_busy_s": med("busy_s"),
        "judge_billed_s": med("billed_s"),
        "judge_instances": med("instances"),
        "scored": med("scored"),
    }


async def _all(s: Settings, unit_s: float) -> list[dict[str, Any]]:
    setups = configs(s)
    runs = [[await _measure(s, c, seed, unit_s) for seed in s.seeds] for c in setups]
    return [_row(c, r, runs[0], s.seeds[0]) for c, r in zip(setups, runs, strict=True)]


def _label(r: dict[str, Any]) -> str:
    return f"{r['setup']}\n{r['gen_gpus']} gen GPUs\n{r['judge']}"


def _plot(rows: list[dict[str, Any]], json_path: str | None) -> str:
    fig, axes = report.new_figure(14, 4.5, cols=3)
    at = range(len(rows))
    for ax, key, ci, paper, label in (
        (axes[0], "reward_utilization", "util_ci", "reward_utilization", "judge utilisation (busy / billed)"),
        (axes[1], "step_s", None, "rollout_s", "rollout step (modelled s)"),
        (axes[2], "gain_per_gpu_s", "ci", None, "steps per GPU-second, x reserved"),
    ):
        values = [r[key] for r in rows]
        err = [[v - r[f"{ci}_low"] for v, r in zip(values, rows, strict=True)],
               [r[f"{ci}_high"] - v for v, r in zip(values, rows, strict=True)]] if ci else None  # fmt: skip
        ours = "ours (median, 95% interval)" if ci else "ours (median)"
        ax.bar(at, values, 0.6, yerr=err, capsize=4, label=ours)
        if paper:
            marks = [PAPER[paper]["reserved"], PAPER[paper]["serverless"]]
            ax.scatter([0, 1], marks, marker="x", color="red", zorder=3, label="paper (R3)")
        ax.set_xticks(at, [_label(r) for r in rows], fontsize=7)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    axes[2].axhline(1.0, color="grey", lw=0.8)
    fig.suptitle("R3: LLM-judge reward on reserved GPUs vs serverless (billed keep-alive, equal-cost gain)")
    return report.save_figure(fig, json_path, "serverless.png")


def _note(rows: list[dict[str, Any]], s: Settings) -> str:
    res = rows[0]
    ours = "; ".join(
        f"{r['setup']} ({r['gen_gpus']} gen, {r['judge']}): {r['reward_utilization']:.0%}, "
        f"{r['step_s']:.0f} s ({r['speedup']:.2f}x), {r['gpu_s_per_step']:.0f} GPU-s, "
        f"{r['gain_per_gpu_s']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}] per GPU-s"
        for r in rows[1:]
    )
    return (
        f"Paper (R3): judge utilisation 6% -> 88%, rollout 158 s -> 77 s per step (2.05x). Ours (median of "
        f"{len(s.seeds)} seeds): reserved ({res['gen_gpus']} gen, {res['judge']}): "
        f"{res['reward_utilization']:.0%}, {res['step_s']:.0f} s, {res['gpu_s_per_step']:.0f} GPU-s/step; "
        f"{ours}.\nGain per GPU-s = reserved GPU-s per step / the row's (equal-cost comparison, module doc). "
        f"Serverless: cold start {s.cold_start_s:g} s, keep-alive billed, billed minimum "
        f"{s.billed_min_s:g} s per instance, {s.per_instance} calls per instance; "
        f"{clock_note(s.clock, s.unit_ms)}"
    )


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Each setup's judge utilisation (paper 6% reserved, 88% serverless), each serverless setup's steps per
    GPU-second over reserved, and the all-GPU serverless setup's step speedup (paper 158 s -> 77 s)."""
    rows, out = payload["rows"], []
    for r in rows:
        where = f"{r['setup']}, {r['gen_gpus']} gen GPUs, {r['judge']}"
        util = (r["reward_utilization"], r["util_ci_low"], r["util_ci_high"])
        out.append(
            report.headline_row(
                f"judge utilisation ({where})", *util, PAPER["reward_utilization"][r["setup"]]
            )
        )
        if r["setup"] == "serverless":
            out.append(report.headline_row(f"GPU-s per step, reserved / this ({where})", r["gain_per_gpu_s"],
                                    r["ci_low"], r["ci_high"]))  # fmt: skip
        if r["setup"] == "serverless" and r["gen_gpus"] > rows[0]["gen_gpus"]:
            paper = PAPER["rollout_s"]["reserved"] / PAPER["rollout_s"]["serverless"]
            out.append(report.headline_row(f"step, reserved / this ({where})", r["speedup"], paper=paper))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    if not 0 < s.reward_gpus < s.gpus:
        raise SystemExit(f"need 0 < --reward-gpus < --gpus, got {s.reward_gpus} of {s.gpus}")
    if not s.idle_s or not s.seeds:
        raise SystemExit("need at least one --idle-s and one --seeds")
    rows = run_loop(_all(s, clock_unit_s(s.clock, s.unit_ms)), s.clock == "virtual")
    note = _note(rows, s)
    return report.publish(
        args,
        "R3: reward on reserved GPUs vs serverless, cost in GPU-seconds per step",
        s,
        rows,
        note,
        config={"judge_model": JUDGE_MODEL},
        plot=lambda path: _plot(rows, path),
        paper=PAPER,
    )
