"""Checkpoint tasks: save every k steps (local directory or s3://), restore the latest on resume.

A checkpoint is the trainer's HF-format weights + optimiser + RNG + step (engine.train.checkpoint),
written atomically; on S3 a `_COMPLETE` marker is uploaded last. The metadata store records each one
with a weights hash, and restore checks the hash it reloads against the record.
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


def _root(exp: Experiment) -> str:
    return exp.cfg.backends.checkpoint_uri.replace("{run_dir}", str(exp.run_dir))


@task(name="save_checkpoint", retries=3, retry_delay_seconds=2, timeout_seconds=600, cache_policy=NO_CACHE)
def save_checkpoint(exp: Experiment, step: int, extra: dict[str, Any] | None = None) -> str:
    root = _root(exp)
    local_root = exp.run_dir / "checkpoints" if is_s3(root) else Path(root)
    path = Path(ray.get(exp.trainer.save.remote(str(local_root), {"step": step, **(extra or {})})))
    sha = ray.get(exp.trainer.weights_sha256.remote())
    uri = str(path)
    if is_s3(root):
        uri = f"{root.rstrip('/')}/{path.name}"
        S3Dirs(exp.cfg.backends.s3_endpoint_url).upload_dir(path, uri)
    exp.store.record_checkpoint(exp.run_id, step, uri, sha)
    return uri


@task(name="restore_checkpoint", retries=3, retry_delay_seconds=2, timeout_seconds=600, cache_policy=NO_CACHE)
def restore_checkpoint(exp: Experiment, resume: bool) -> int:
    """Load the latest recorded checkpoint of this experiment; returns the step to continue from."""
    rec = exp.store.latest_checkpoint(exp.run_id) if resume else None
    if rec is None:
        return 0
    uri = rec["uri"]
    if is_s3(uri):
        local = exp.run_dir / "restore" / Path(uri).name
        shutil.rmtree(local, ignore_errors=True)
        S3Dirs(exp.cfg.backends.s3_endpoint_url).download_dir(uri, local)
        uri = str(local)
    extra = ray.get(exp.trainer.load.remote(uri))
    sha = ray.get(exp.trainer.weights_sha256.remote())
    if rec["weights_sha256"] and sha != rec["weights_sha256"]:
        raise RuntimeError(
            f"checkpoint {rec['uri']}: weights hash {sha[:12]} != recorded {rec['weights_sha256'][:12]}"
        )
    return int(extra["step"])
