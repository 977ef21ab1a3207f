"""What a training run leaves behind when it ends, for people and for automations.

The driver flow's `on_completion`, `on_failure` and `on_crashed` hooks write how the run ended into the
experiment's metadata store (`run_events`, beside its steps and checkpoints) and emit a Prefect event,
`rollart.run.completed`, `rollart.run.failed` or `rollart.run.crashed`, about the resource
`rollart.experiment.NAME`. The resource carries `rollart.failures`: the failed or crashed runs of the
experiment since its last completed one, this one included ("0" after a completion); the payload the reason
and the last checkpoint's step. `rollart deploy --auto-resume N` matches on them (flows/deploy.py).
A run refused because the experiment already trained (`RunExists`) leaves nothing, and so does a run its
`rollart deploy` runner stopped, whose SIGTERM it took for a crash (flows/runner_stop.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect.events import emit_event
from pydantic import ValidationError

from engine.config import ExperimentConfig
from flows.runner_stop import stopped_by_runner
from tasks.events import record_run_end


class RunExists(RuntimeError):
    """A fresh run was asked for where this experiment already trained: its results are not overwritten.

    The flow run fails, but the experiment did not: nothing is recorded and no event is emitted (an
    automation that resumes failed runs must not resume one that was refused)."""


def _recorder(kind: str) -> Callable[[Any, Any, Any], None]:
    def hook(flow: Any, flow_run: Any, state: Any) -> None:
        if f"{RunExists.__name__}: " in (state.message or ""):
            return
        if kind == "crashed" and stopped_by_runner(flow_run.id):  # a cancel the run could not hear in time
            return
        try:
            cfg = ExperimentConfig.model_validate(flow_run.parameters["config"])
        except ValidationError:  # the run never started: Prefect's own state names the bad field
            return
        reason = state.message or state.name
        end = record_run_end(cfg, kind, reason, flow_run_id=str(flow_run.id))
        emit_event(
            event=f"rollart.run.{kind}",
            resource={
                "prefect.resource.id": f"rollart.experiment.{cfg.name}",
                "prefect.resource.name": cfg.name,
                "rollart.failures": str(end.failures_in_a_row),
            },
            related=[
                {
                    "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                    "prefect.resource.role": "flow-run",
                }
            ],
            payload={"reason": reason, "last_checkpoint": end.last_checkpoint},
        )

    hook.__name__ = f"record_{kind}"
    return hook


record_completion = _recorder("completed")
record_failure = _recorder("failed")
record_crash = _recorder("crashed")
