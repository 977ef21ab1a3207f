"""How a run ended, written where its steps and checkpoints are (the experiment's metadata store).

Called by the driver flow's state hooks once the flow run is over: a plain function, not a Prefect task
(there is no flow run left to attach a task run to)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ExperimentConfig
from infra.metadata import MetadataStore

ENDS = ("completed", "failed", "crashed")


@dataclass(frozen=True)
class RunEnd:
    last_checkpoint: int | None  # step of the newest checkpoint, if any
    failures_in_a_row: int  # failed or crashed runs of this experiment since its last completed one


def record_run_end(cfg: ExperimentConfig, kind: str, reason: str, flow_run_id: str) -> RunEnd:
    """Record that a run of `cfg` ended as `kind` (one of ENDS), with its reason."""
    if kind not in ENDS:
        raise ValueError(f"a run ends {', '.join(ENDS)}; got {kind!r}")
    store = MetadataStore(cfg.metadata_url())
    try:
        store.record_event(cfg.name, kind, reason, flow_run_id=flow_run_id)
        checkpoint = store.latest_checkpoint(cfg.name)
        kinds = [e["kind"] for e in store.events(cfg.name)]
    finally:
        store.close()
    since = kinds[::-1].index("completed") if "completed" in kinds else len(kinds)
    return RunEnd(checkpoint["step"] if checkpoint else None, since)
