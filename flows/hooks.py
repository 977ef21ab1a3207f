"""What a failed or crashed training run leaves behind, for people and for automations.

The driver flow's `on_failure` and `on_crashed` hooks write the reason into the experiment's metadata store
(`run_events`, beside its steps and checkpoints) and emit a Prefect event, `rollart.run.failed` or
`rollart.run.crashed`, about the resource `rollart.experiment.NAME`, with the reason and the last checkpoint
step in its payload: what a Prefect automation matches on to re-run the experiment with `resume=True`.
A run refused because the experiment already trained (`RunExists`) leaves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect.events import emit_event
from pydantic import ValidationError

from engine.config import ExperimentConfig
from tasks.events import record_run_event


class RunExists(RuntimeError):
    """A fresh run was asked for where this experiment already trained: its results are not overwritten.

    The flow run fails, but the experiment did not: nothing is recorded and no event is emitted (an
    automation that resumes failed runs must not resume one that was refused)."""


def _recorder(kind: str) -> Callable[[Any, Any, Any], None]:
    def hook(flow: Any, flow_run: Any, state: Any) -> None:
        if f"{RunExists.__name__}: " in (state.message or ""):
            return
        try:
            cfg = ExperimentConfig.model_validate(flow_run.parameters["config"])
        except ValidationError:  # the run never started: Prefect's own state names the bad field
            return
        reason = state.message or state.name
        checkpoint = record_run_event(cfg, kind, reason, flow_run_id=str(flow_run.id))
        emit_event(
            event=f"rollart.run.{kind}",
            resource={
                "prefect.resource.id": f"rollart.experiment.{cfg.name}",
                "prefect.resource.name": cfg.name,
            },
            related=[
                {
                    "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                    "prefect.resource.role": "flow-run",
                }
            ],
            payload={"reason": reason, "last_checkpoint": checkpoint},
        )

    hook.__name__ = f"record_{kind}"
    return hook


record_failure = _recorder("failed")
record_crash = _recorder("crashed")
