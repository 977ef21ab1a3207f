"""The training driver: one Prefect flow per run, one async sub-flow per iteration.

    train(config, resume, more_steps)
      provision_pools → warmup_sandboxes → prepare_model → deploy_reward → start_actors → restore_checkpoint
      → baselines → eval (step 0) → iteration × steps (eval every `train.eval_every`) → eval (last
      trained weights) → summary.json, plot → teardown

The driver owns its live objects (`flows.iteration.LiveRun`); each iteration is a sub-flow on them.

Faults: a step whose `train_step` failed past its retries (flows/iteration.py) stops the run with
`TrainingStopped`, its last checkpoint kept, and `--resume` continues from that checkpoint. Retry and drop
counters (env, reward, generation, train step) go into each step's metrics and its metadata-store row.
A SIGTERM (a runner cancelling the run) ends it as Cancelled, or Crashed, never Failed (tasks/stopping.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

from prefect import flow
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run
from pydantic import Field

from engine.config import ExperimentConfig
from engine.experiment import Experiment
from engine.protocol import IterationProtocol
from flows.hooks import RunExists, record_completion, record_crash, record_failure
from flows.iteration import LiveRun
from flows.observe import MetricsSink, plot, read_eval
from flows.report import say, start_progress, summary_artifact, update_progress
from tasks.checkpoint import restore_checkpoint
from tasks.evaluate import baselines, evaluate_held_out
from tasks.setup import deploy_reward, prepare_model, provision_pools, start_actors, warmup_sandboxes
from tasks.stopping import raise_if_cancelled, stop_signal


class TrainingStopped(RuntimeError):
    """A step failed after its retries; the run stopped, its last checkpoint kept for `--resume`."""


def _train_name() -> str:
    """The experiment's name, plus "(resumed)"."""
    params = flow_run.parameters
    config = params["config"]  # validated (a model), or as the API sent it (a mapping)
    name = config.name if isinstance(config, ExperimentConfig) else config.get("name", "rollart")
    return f"{name} (resumed)" if params.get("resume") else name


async def _eval(exp: Experiment, proto: IterationProtocol, sink: MetricsSink, step: int) -> dict[str, Any]:
    """Held-out evaluation of the newest weights, logged at `step` (eval.jsonl, TensorBoard)."""
    results = await evaluate_held_out(exp, proto)
    if results:
        await sink.write_eval(step, results)
        say(
            f"eval at step {step}: "
            + ", ".join(f"{name} success {r['success']:.3f} (n={r['n_eval']})" for name, r in results.items())
        )
    return results


@flow(
    name="rollart-train",
    flow_run_name=_train_name,
    on_completion=[record_completion],
    on_failure=[record_failure],
    on_crashed=[record_crash],
)
async def train(
    config: ExperimentConfig,
    resume: bool = False,
    more_steps: Annotated[int, Field(ge=1)] | None = None,
) -> dict:
    """Train the experiment `config` (typed: the Prefect UI renders it as a form and validates it).

    `resume`: continue from the latest checkpoint of this experiment name. `more_steps`: train that many
    steps past where it resumed (scheduled retraining) instead of up to `train.steps`.
    """
    cfg = config
    exp = Experiment(cfg)
    if not resume and (done := len(exp.store.steps(exp.run_id))):
        raise RunExists(
            f"{exp.run_dir} already holds {done} trained steps of experiment {cfg.name!r}; continue it with "
            "--resume, or start another with a new name (--set name=...) or run_root"
        )
    t_start = time.perf_counter()
    try:
        restored = await _set_up(exp, resume)
        raise_if_cancelled()
        first = restored["step"]
        last = first + more_steps if more_steps else cfg.train.steps
        proto = exp.protocol()
        await proto.start()
        sink = MetricsSink(exp.run_dir)
        base = await baselines(exp)
        if first == 0:
            await _eval(exp, proto, sink, 0)
        await _iterate(LiveRun(exp, proto, sink), first, last)
        after = await _eval(exp, proto, sink, last)
        raise_if_cancelled()  # not recorded as completed
        summary = _summary(exp, first, last, base, after, time.perf_counter() - t_start, restored)
        sink.close()
        plot(exp.run_dir)
        await summary_artifact(exp.run_id, exp.run_dir, summary)
        say(f"run directory: {exp.run_dir}")
        return summary
    except Exception as e:
        if (stop := stop_signal(e)) is not None:  # SIGTERM surfaced as another error (tasks/stopping.py)
            raise TerminationSignal(signal=stop.signal) from e
        raise
    finally:
        try:
            exp.teardown()
        finally:
            exp.release_ray()


async def _set_up(exp: Experiment, resume: bool) -> dict[str, Any]:
    """Everything before the first step, in order (pools, sandboxes, model, reward, actors), then the
    checkpoint restored when resuming: what `restore_checkpoint` reports (step 0 on a fresh run)."""
    cfg = exp.cfg
    say(
        f"[bold]rollart[/] {cfg.name}: mode {cfg.train.mode}, alpha {cfg.train.alpha}, "
        f"{cfg.train.steps} steps → {exp.run_dir}"
    )
    pools = provision_pools(exp)
    if pools["worker_logs"]:
        say(f"worker logs: {pools['worker_logs']}")
    say(f"sandboxes: {await warmup_sandboxes(exp)}")
    if not cfg.model.path and cfg.model.pretrain_steps:
        say(f"building the model: {cfg.model.pretrain_steps} steps of format pretraining")
    say(f"model: {prepare_model(exp)}")
    say(f"reward: {deploy_reward(exp)['scoring']}")
    start_actors(exp)
    restored = restore_checkpoint(exp, resume)
    if restored["step"]:
        say(
            f"resumed from step {restored['step']}: weights {restored['weights_sha256'][:12]}, optimiser "
            f"{restored['optimizer_sha256'][:12]} as saved; {restored['steps_discarded']} later step "
            "row(s) discarded (redone)"
        )
    return restored


async def _iterate(live: LiveRun, first: int, last: int) -> None:
    """Steps `first + 1` to `last`, each an iteration sub-flow, with the progress artifact and the
    held-out evaluation every `train.eval_every` steps (the last step's is the caller's); a step that failed
    past its retries stops the run (`TrainingStopped`)."""
    exp, cfg = live.exp, live.exp.cfg
    progress = await start_progress(exp.run_id, first, last)
    for step in range(first, last):
        raise_if_cancelled()
        try:
            m = await live.iteration(cfg.name, step + 1, last)
        except Exception as e:
            ck = exp.store.latest_checkpoint(exp.run_id)
            raise TrainingStopped(
                f"step {step + 1} failed after {cfg.train.step_retries} retries: {type(e).__name__}: "
                f"{str(e)[:300]}\nthe last checkpoint (step {ck['step'] if ck else 'none'}) is kept; "
                f"continue with: rollart train CONFIG --resume"
            ) from e
        say(
            f"step {step + 1:>4}/{last}  reward {m['reward_mean']:+.3f}  "
            f"loss {m['loss']:+.4f}  step {m['step_s']:.2f}s  stale≤{m['staleness_max']}  "
            f"flow overhead {100 * m['flow_overhead_frac']:.1f}%"
        )
        await update_progress(progress, step + 1, last)
        every = cfg.train.eval_every
        if every and (step + 1) % every == 0 and step + 1 < last:
            await _eval(exp, live.proto, live.sink, step + 1)


def _summary(
    exp: Experiment, first: int, last: int, base: dict, after: dict, wall_s: float, restored: dict
) -> dict[str, Any]:
    rows = exp.store.steps(exp.run_id)
    timed = [r["metrics"] for r in rows if "flow_overhead_frac" in r["metrics"]]
    overhead = [m["flow_overhead_frac"] for m in timed]
    curve = read_eval(exp.run_dir)
    start = curve[0] if curve and curve[0]["step"] == 0 else {}  # the base model's scores
    summary = {
        "steps": last,
        "steps_this_run": last - first,
        "wall_s": round(wall_s, 1),
        "model": exp.cfg.model.path
        or f"{exp.cfg.model.init_size} ({exp.cfg.model.pretrain_steps} pretrain steps)",
        "eval": {
            name: {
                "before": start.get(name, {}).get("success"),
                "after": res["success"],
                "baseline": base[name]["success"],
                "baseline_answer": base[name]["answer"],
                "n_eval": res["n_eval"],
                "overlap": res["overlap"],
                "lenient_before": start.get(name, {}).get("lenient"),
                "lenient_after": res["lenient"],
                "partial_before": start.get(name, {}).get("partial"),
                "partial_after": res["partial"],
                "version": res["version"],
            }
            for name, res in after.items()
        },
        "eval_curve": [
            {"step": row["step"], **{name: r["success"] for name, r in row.items() if name != "step"}}
            for row in curve
        ],
        "flow_overhead_frac_mean": sum(overhead) / len(overhead) if overhead else None,
        "flow_overhead_s_mean": sum(m["flow_overhead_s"] for m in timed) / len(timed) if timed else None,
        "resumed": restored,  # step 0, or the checkpoint and the state hashes the run restarted from
    }
    Path(exp.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
