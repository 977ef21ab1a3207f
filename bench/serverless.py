"""`rollart bench serverless` (paper R3): an LLM-judge reward on reserved GPUs vs a serverless endpoint.

Both setups have the same `gpus` H800s and run the same agentic step (`bench.harness.agentic_mix`); every
finished trajectory is scored by an LLM judge (Qwen2.5-7B reading the trajectory, up to `judge_tokens`
tokens, and answering in 4) through the real `RewardScorer`.

- reserved: `reward_gpus` of the GPUs are judge engines behind their own LLMProxy, the rest generate.
  Utilisation = the judges' busy time / (reward_gpus x step time).
- serverless: all GPUs generate; the judge runs on a scale-to-zero endpoint (`ServerlessJudge`): an
  instance (one judge engine) starts on demand with a `cold_start_s` delay, serves up to `per_instance`
  calls at once, and is released after `idle_s` without calls. Billing is by active time, as function
  platforms bill: the cold start plus every interval with a call in flight; a warm idle instance costs
  nothing (the platform lends its GPU to other tenants). Utilisation = the instances' busy time / billed.

`infra.serve` deploys the same judge on Ray Serve with `min_replicas=0`; here its instances are modelled so
the step runs at paper scale on this machine. Cold start and keep-alive are our assumptions. The step-time
gain is bounded by the GPUs the reservation gives back to generation (gpus / (gpus - reward_gpus): 1.33x for 2
of 8); the paper's 2.05x implies a larger reservation, which it does not state.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bench.clock import run as run_loop
from bench.harness import (
    add_clock_arguments,
    agentic_mix,
    clock_note,
    clock_unit_s,
    min_sleep_s,
    modelled_slots,
    rollout_step,
)
from bench.report import new_figure, pick_settings, print_table, save_figure, write_json

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
    idle_s: float = 10.0
    per_instance: int = 8
    clock: str = "virtual"
    unit_ms: float = 40.0
    seed: int = 0


FULL = Settings()
QUICK = Settings(
    gpus=4, reward_gpus=1, groups=16, swe_turns=(30, 50), swe_obs_tokens=1500, cot_tokens=(1024, 4096)
)


@dataclass
class _Instance:
    engine: ModelledBackend
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    inflight: int = 0
    last_used: float = 0.0
    active_since: float | None = None  # start of the current interval with a call in flight
    active_s: float = 0.0  # loop-clock seconds with a call in flight
    released: float | None = None


class ServerlessJudge:
    """A modelled scale-to-zero endpoint of judge instances (module doc); call it with a `GenRequest`."""

    def __init__(self, make_engine: Callable[[], ModelledBackend], s: Settings, unit_s: float) -> None:
        self.make_engine, self.s, self.unit_s = make_engine, s, unit_s
        self.instances: list[_Instance] = []
        self.cold_starts = 0

    async def __call__(self, request: GenRequest) -> GenOutput:
        loop = asyncio.get_running_loop()
        live = [i for i in self.instances if i.released is None and i.inflight < self.s.per_instance]
        inst = min(live, key=lambda i: i.inflight) if live else None
        if inst is None:
            inst = _Instance(self.make_engine())
            self.instances.append(inst)
            self.cold_starts += 1
            loop.call_later(self.s.cold_start_s * self.unit_s, inst.ready.set)
        inst.inflight += 1
        try:
            await inst.ready.wait()
            if inst.active_since is None:
                inst.active_since = loop.time()
            return await inst.engine.generate(request)
        finally:
            inst.inflight -= 1
            inst.last_used = loop.time()
            if not inst.inflight and inst.active_since is not None:
                inst.active_s += inst.last_used - inst.active_since
                inst.active_since = None
            if not inst.inflight:
                loop.call_later(self.s.idle_s * self.unit_s, self._reap, inst)

    def _reap(self, inst: _Instance) -> None:
        now = asyncio.get_running_loop().time()
        if (
            not inst.inflight
            and inst.released is None
            and now - inst.last_used >= self.s.idle_s * self.unit_s * 0.999
        ):
            inst.released = now

    def utilisation(self) -> tuple[float, float]:
        """(busy, billed) modelled seconds: the engines' work; cold starts plus active time (module doc)."""
        busy = sum(i.engine.stats()["busy_s"] for i in self.instances)
        billed = (
            self.cold_starts * self.s.cold_start_s + sum(i.active_s for i in self.instances) / self.unit_s
        )
        return busy, billed


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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, help=f"H800s in either setup (default {FULL.gpus})")
    p.add_argument(
        "--reward-gpus", type=int, help=f"of them reserved for the judge (default {FULL.reward_gpus})"
    )
    p.add_argument("--groups", type=int, help=f"groups of 8 per step (default {FULL.groups})")
    p.add_argument(
        "--cold-start-s", type=float, help=f"modelled instance start time (default {FULL.cold_start_s})"
    )
    p.add_argument("--idle-s", type=float, help=f"idle time before an instance is released ({FULL.idle_s})")
    add_clock_arguments(p, FULL.unit_ms)
    p.add_argument("--seed", type=int)


async def _setup(s: Settings, setup: str, unit_s: float) -> dict[str, Any]:
    from engine.backends.modelled import ModelledBackend
    from engine.devices import get_device, get_model
    from engine.rollout.proxy import GenSlot, LLMProxy
    from engine.rollout.reward import RewardScorer

    w = agentic_mix(s.swe_turns, s.swe_obs_tokens, s.cot_tokens)
    reserved = s.reward_gpus if setup == "reserved" else 0
    gen = modelled_slots(
        JUDGE_MODEL, {DEVICE: s.gpus - reserved}, w, unit_s=unit_s, capacity=1 << 20, seed=s.seed
    )

    def judge_engine() -> ModelledBackend:
        return ModelledBackend(
            get_model(JUDGE_MODEL), get_device(DEVICE), time_scale=unit_s, min_sleep_s=min_sleep_s(unit_s)
        )

    if reserved:
        judges = [
            GenSlot(f"judge-{i}", "gpu-compute", judge_engine(), capacity=1 << 20) for i in range(reserved)
        ]
        call: Any = LLMProxy(judges).generate
    else:
        call = endpoint = ServerlessJudge(judge_engine, s, unit_s)
    reward = RewardScorer(judge_score(call, s.judge_tokens), timeout_s=1e6)
    step = await rollout_step(w, gen, groups=s.groups, unit_s=unit_s, seed=s.seed, reward=reward)
    if reserved:
        busy, billed = sum(j.target.stats()["busy_s"] for j in judges), reserved * step.modelled_s
        instances = reserved
    else:
        busy, billed = endpoint.utilisation()
        instances = endpoint.cold_starts
    return {
        "setup": setup,
        "reward_utilization": busy / billed,
        "rollout_s": step.modelled_s,
        "paper_utilization": PAPER["reward_utilization"][setup],
        "paper_rollout_s": PAPER["rollout_s"][setup],
        "gen_gpus": s.gpus - reserved,
        "judge_instances": instances,
        "judge_busy_s": busy,
        "judge_billed_s": billed,
        "scored": reward.counts["scored"],
    }


def _plot(rows: list[dict[str, Any]], json_path: str | None) -> str:
    fig, (left, right) = new_figure(9, 4, cols=2)
    names = [r["setup"] for r in rows]
    for ax, key, paper, label in (
        (left, "reward_utilization", "paper_utilization", "reward GPU utilisation"),
        (right, "rollout_s", "paper_rollout_s", "rollout step (modelled s)"),
    ):
        ax.bar([k - 0.2 for k in range(2)], [r[key] for r in rows], 0.4, label="ours")
        ax.bar([k + 0.2 for k in range(2)], [r[paper] for r in rows], 0.4, label="paper (R3)", alpha=0.6)
        ax.set_xticks(range(2), names)
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("R3: LLM-judge reward on reserved GPUs vs serverless")
    return save_figure(fig, json_path, "serverless.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = pick_settings(args, FULL, QUICK)
    if not 0 < s.reward_gpus < s.gpus:
        raise SystemExit(f"need 0 < --reward-gpus < --gpus, got {s.reward_gpus} of {s.gpus}")
    unit_s = clock_unit_s(s.clock, s.unit_ms)

    async def both() -> list[dict[str, Any]]:
        return [await _setup(s, setup, unit_s) for setup in ("reserved", "serverless")]

    rows = run_loop(both(), s.clock == "virtual")
    res, srv = rows
    note = (
        f"Paper (R3): utilisation 6% -> 88%, rollout 158 s -> 77 s per step (2.05x). Ours: "
        f"{res['reward_utilization']:.0%} -> {srv['reward_utilization']:.0%}, {res['rollout_s']:.0f} s -> "
        f"{srv['rollout_s']:.0f} s ({res['rollout_s'] / srv['rollout_s']:.2f}x).\n"
        f"{s.gpus} x {DEVICE}, {s.reward_gpus} reserved for the judge; serverless cold start "
        f"{s.cold_start_s} s, release after {s.idle_s} s idle, {s.per_instance} calls per instance; "
        f"{clock_note(s.clock, s.unit_ms)}"
    )
    print_table("R3: reward on reserved GPUs vs serverless", rows, note)
    payload: dict[str, Any] = {
        "rows": rows,
        "config": asdict(s) | {"quick": bool(getattr(args, "quick", False)), "judge_model": JUDGE_MODEL},
        "paper": PAPER,
        "note": note,
        "png": _plot(rows, getattr(args, "json", None)),
    }
    write_json(getattr(args, "json", None), payload)
    return payload
