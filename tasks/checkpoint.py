"""Checkpoint tasks: save every k steps (local directory or s3://), restore the latest on resume.

A checkpoint is the trainer's HF-format weights + optimiser + RNG + step (engine.train.checkpoint)
and the rollout scheduler's RNG and group counter (so a resumed or scheduled run goes on with the
problem sequence instead of replaying it), written atomically; on S3 a `_COMPLETE` marker is uploaded
last. The metadata store records each one with a weights hash; restore checks the weights it reloads
against that record and the optimiser state against the saved file, and discards step rows recorded
after the checkpoint (they are redone).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from engine.experiment import Experiment
from infra.objectstore import S3Dirs, is_s3
from tasks.stopping import retry_unless_stopped


def _root(exp: Experiment) -> str:
    return exp.cfg.backends.checkpoint_uri.replace("{run_dir}", str(exp.run_dir))


@task(
    name="save_checkpoint",
    retries=3,
    retry_condition_fn=retry_unless_stopped,
    retry_delay_seconds=2,
    timeout_seconds=600,
    cache_policy=NO_CACHE,
)
def save_checkpoint(exp: Experiment, step: int) -> str:
    root = _root(exp)
    local_root = exp.run_dir / "checkpoints" if is_s3(root) else Path(root)
    extra = {"step": step, "scheduler": ray.get(exp.rollout.scheduler_state.remote())}
    path = Path(ray.get(exp.trainer.save.remote(str(local_root), extra)))
    sha = ray.get(exp.trainer.weights_sha256.remote())
    uri = str(path)
    if is_s3(root):
        uri = f"{root.rstrip('/')}/{path.name}"
        S3Dirs(exp.cfg.backends.s3_endpoint_url).upload_dir(path, uri)
    exp.store.record_checkpoint(exp.run_id, step, uri, sha)
    return uri


@task(
    name="restore_checkpoint",
    retries=3,
    retry_condition_fn=retry_unless_stopped,
    retry_delay_seconds=2,
    timeout_seconds=600,
    cache_policy=NO_CACHE,
)
def restore_checkpoint(exp: Experiment, resume: bool) -> dict[str, Any]:
    """Load the latest recorded checkpoint of this experiment and prove the trainer holds exactly it.

    Returns {"step": 0} for a fresh start, else the step to continue from, the checkpoint's uri, the
    restored trainer's weights and optimiser hashes (checked against the hash recorded at save time and
    the saved optimiser file) and how many step rows past the checkpoint were discarded: a driver killed
    between checkpoints had recorded steps that the resumed run redoes, so none is repeated or skipped.
    """
    rec = exp.store.latest_checkpoint(exp.run_id) if resume else None
    if rec is None:
        return {"step": 0}
    got, extra = _load(exp, rec)
    if "scheduler" in extra:  # checkpoints written before the scheduler state was saved have none
        ray.get(exp.rollout.restore_scheduler.remote(extra["scheduler"]))
    discarded = exp.store.discard_steps_after(exp.run_id, got["step"])
    return {**got, "steps_discarded": discarded, "scheduler_restored": "scheduler" in extra}


@task(
    name="load_checkpoint",
    retries=3,
    retry_condition_fn=retry_unless_stopped,
    retry_delay_seconds=2,
    timeout_seconds=600,
    cache_policy=NO_CACHE,
)
def load_checkpoint(exp: Experiment, step: int | None = None) -> dict[str, Any]:
    """Load checkpoint `step` (the latest when None) into the trainer, verified, changing no record."""
    return _load(exp, checkpoint_record(exp, step))[0]


def checkpoint_record(exp: Experiment, step: int | None = None) -> dict[str, Any]:
    """The record of checkpoint `step` (the latest when None); FileNotFoundError naming the step if the
    experiment has none (a cheap metadata read: a flow asks before it starts any worker)."""
    rec = exp.store.latest_checkpoint(exp.run_id, step)
    if rec is None:
        which = f"at step {step}" if step is not None else "at all"
        raise FileNotFoundError(f"experiment {exp.run_id!r} has no checkpoint {which} in {exp.run_dir}")
    return rec


def _load(exp: Experiment, rec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load `rec` into the trainer, verified; returns what was loaded and the checkpoint's `extra`."""
    from engine.train.fingerprint import saved_optimizer_sha256, trainer_fingerprint  # torch: on resume only

    uri = rec["uri"]
    if is_s3(uri):
        local = exp.run_dir / "restore" / Path(uri).name
        shutil.rmtree(local, ignore_errors=True)
        S3Dirs(exp.cfg.backends.s3_endpoint_url).download_dir(uri, local)
        uri = str(local)
    extra = ray.get(exp.trainer.load.remote(uri))
    got = ray.get(exp.trainer.__ray_call__.remote(trainer_fingerprint))
    if rec["weights_sha256"] and got["weights_sha256"] != rec["weights_sha256"]:
        raise RuntimeError(
            f"checkpoint {rec['uri']}: weights hash {got['weights_sha256'][:12]} "
            f"!= recorded {rec['weights_sha256'][:12]}"
        )
    saved = saved_optimizer_sha256(uri)
    if got["optimizer_sha256"] != saved:
        raise RuntimeError(
            f"checkpoint {rec['uri']}: optimiser hash {got['optimizer_sha256'][:12]} != saved {saved[:12]}"
        )
    return {"step": int(extra["step"]), "uri": rec["uri"], **got}, extra
