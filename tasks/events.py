"""A run's failure or crash, written where its steps and checkpoints are (the experiment's metadata store).

Called by the driver flow's state hooks once the flow run is over: a plain function, not a Prefect task
(there is no flow run left to attach a task run to)."""

from __future__ import annotations

from engine.config import ExperimentConfig
from infra.metadata import MetadataStore


def record_run_event(cfg: ExperimentConfig, kind: str, reason: str, flow_run_id: str) -> int | None:
    """Record `kind` ("failed", "crashed") with its reason; returns the last checkpoint's step, if any."""
    store = MetadataStore(cfg.metadata_url())
    try:
        store.record_event(cfg.name, kind, reason, flow_run_id=flow_run_id)
        checkpoint = store.latest_checkpoint(cfg.name)
    finally:
        store.close()
    return checkpoint["step"] if checkpoint else None
