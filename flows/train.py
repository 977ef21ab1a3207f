"""The training driver: one Prefect flow per run, one async sub-flow per iteration.

    train(config, resume, more_steps)
      provision_pools → warmup_sandboxes → deploy_reward → start_actors → restore_checkpoint
      → baselines → eval (step 0) → iteration × steps (eval every `train.eval_every`) → eval (last
      trained weights) → summary.json, plot → teardown

Each iteration flow runs the six-step protocol (engine.protocol) with every step as a Prefect task, records
the step in the metadata store, writes metrics (jsonl, TensorBoard, a table artifact) and checkpoints every
k steps. The flow machinery's share of each step's time is measured and reported.

Faults: a failing `train_step` task is retried `train.step_retries` times, only while the failed attempt
applied nothing (the trainer's version did not move); past that the run stops with `TrainingStopped`, its
last checkpoint kept, and `--resume` continues from that checkpoint. Retry and drop counters (env, reward,
generation, train step) go into each step's metrics and its metadata-store row.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import ray
from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from engine.config import ExperimentConfig
from engine.experiment import Experiment
from engine.protocol import IterationProtocol
from flows.hooks import RunExists, record_crash, record_failure
from flows.observe import MetricsSink, plot, read_eval
from flows.report import say, slug, start_progress, summary_artifact, update_progress
from tasks.checkpoint import restore_checkpoint, save_checkpoint
from tasks.evaluate import baselines, evaluate_held_out
from tasks.phase import run_phase
from tasks.setup import deploy_reward, prepare_model, provision_pools, start_actors, warmup_sandboxes

_RUNS: dict[str, tuple[Experiment, IterationProtocol, MetricsSink]] = {}  # live objects of running drivers


class TrainingStopped(RuntimeError):
    """A step failed after its retries; the run stopped, its last checkpoint kept for `--resume`."""


def _iteration_name() -> str:
    return f"{flow_run.parameters['run_id']} step {flow_run.parameters['step'] + 1}"


def _train_name() -> str:
    """The experiment's name, plus "(resumed)"."""
    params = flow_run.parameters
    config = params["config"]  # validated (a model), or as the API sent it (a mapping)
    name = config.name if isinstance(config, ExperimentConfig) else config.get("name", "rollart")
    return f"{name} (resumed)" if params.get("resume") else name


@flow(name="rollart-iteration", flow_run_name=_iteration_name, log_prints=False, validate_parameters=False)
async def iteration(run_id: str, step: int, last: int) -> dict[str, Any]:
    exp, proto, sink = _RUNS[run_id]
    t0 = time.perf_counter()
    inside = 0.0

    async def timed(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        nonlocal inside
        t = time.perf_counter()
        try:
            return await fn()
        finally:
            inside += time.perf_counter() - t

    attempts: Counter[str] = Counter()
    before: dict[str, int] = {}

    async def counted(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        attempts[name] += 1
        if name == "train_step":  # a retry is safe only if the failed attempt applied nothing
            version = await exp.trainer.version.remote()
            if before.setdefault(name, version) != version:
                raise RuntimeError(f"train step failed after its optimiser step (v{version}): not retried")
        return await timed(name, fn)

    retries = {"train_step": exp.cfg.train.step_retries}  # a failed step is retried, then the run stops
    metrics = await proto.step(
        phase=lambda name, fn: run_phase(name, lambda: counted(name, fn), retries.get(name, 0))
    )
    metrics["count/train_step_retries"] = attempts["train_step"] - 1
    rollout = await exp.rollout.stats.remote()
    proxy = await exp.proxy.summary.remote()
    metrics["count/gen_requests_retried"] = proxy["retried"]
    metrics["count/gen_requests_failed"] = sum(proxy["worker_failures"].values())  # worker died holding them
    metrics.update({f"count/reward_{k}": v for k, v in rollout["reward"].items()})
    metrics.update({f"count/{k}": v for k, v in rollout["buffer"].items()})  # buffer_evicted_<reason> ...
    metrics["tokens_per_s_rollout"] = rollout["tokens"] / max(metrics["step_s"], 1e-9)
    for name, t in rollout["tasks"].items():
        if t["reward_mean"] is not None:
            metrics[f"rollout/{name}/reward"] = t["reward_mean"]
            metrics[f"rollout/{name}/success"] = t["success_rate"]
    metrics.update({f"count/{k}": v for k, v in rollout["counts"].items()})
    metrics.update(rollout["bias"])  # trained vs started: turns, tokens, success (rollout/selection.py)
    if (step + 1) % exp.cfg.train.checkpoint_every == 0 or step + 1 == last:
        metrics["checkpoint"] = await timed(
            "checkpoint", lambda: asyncio.to_thread(save_checkpoint, exp, step + 1)
        )
    wall = time.perf_counter() - t0
    metrics["flow_overhead_s"] = wall - inside  # Prefect's machinery: everything but the work itself
    metrics["flow_overhead_frac"] = metrics["flow_overhead_s"] / wall
    exp.store.record_step(exp.run_id, step + 1, int(metrics["version"]), _jsonable(metrics), wall)
    await sink.write(step + 1, metrics, artifact_key=f"{slug(exp.run_id)}-metrics")
    return metrics


def _jsonable(m: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(m, default=str))


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


@flow(name="rollart-train", flow_run_name=_train_name, on_failure=[record_failure], on_crashed=[record_crash])
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
        say(
            f"[bold]rollart[/] {cfg.name}: mode {cfg.train.mode}, alpha {cfg.train.alpha}, "
            f"{cfg.train.steps} steps → {exp.run_dir}"
        )
        provision_pools(exp)
        say(f"sandboxes: {await warmup_sandboxes(exp)}")
        deploy_reward(exp)
        if not cfg.model.path and cfg.model.pretrain_steps:
            say(f"building the model: {cfg.model.pretrain_steps} steps of format pretraining")
        say(f"model: {prepare_model(exp)}")
        start_actors(exp)
        restored = restore_checkpoint(exp, resume)
        first = restored["step"]
        if first:
            say(
                f"resumed from step {first}: weights {restored['weights_sha256'][:12]}, optimiser "
                f"{restored['optimizer_sha256'][:12]} as saved; {restored['steps_discarded']} later step "
                "row(s) discarded (redone)"
            )
        last = first + more_steps if more_steps else cfg.train.steps
        proto = exp.protocol()
        await proto.start()
        sink = MetricsSink(exp.run_dir)
        base = await baselines(exp)
        if first == 0:
            await _eval(exp, proto, sink, 0)
        _RUNS[exp.run_id] = (exp, proto, sink)
        progress = await start_progress(exp.run_id, first, last)
        for step in range(first, last):
            try:
                m = await iteration(exp.run_id, step, last)
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
                await _eval(exp, proto, sink, step + 1)
        after = await _eval(exp, proto, sink, last)
        summary = _summary(exp, first, last, base, after, time.perf_counter() - t_start, restored)
        sink.close()
        plot(exp.run_dir)
        await summary_artifact(exp.run_id, exp.run_dir, summary)
        say(f"run directory: {exp.run_dir}")
        return summary
    finally:
        _RUNS.pop(exp.run_id, None)
        exp.teardown()
        if ray.is_initialized():
            ray.shutdown()


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
