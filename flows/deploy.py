"""Schedules and the UI: `rollart deploy` serves the train flow with a cron/interval schedule; every
scheduled run resumes the experiment from its latest checkpoint and trains `train.steps` more steps.
`rollart ui` runs a Prefect server on 127.0.0.1 (runs can be started there with parameters)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from engine.config import load_config


def deployment(
    config: str, overrides: list[str], cron: str | None = None, interval: float | None = None
) -> Any:
    """The train flow as a scheduled deployment named after the experiment (not yet applied/served); its
    default parameters are the resolved config, which a run started from the UI may change field by field."""
    from flows.train import train

    cfg = load_config(config, overrides)
    if not cron and not interval:
        raise ValueError("a schedule needs --cron or --interval")
    return train.to_deployment(
        name=cfg.name,
        cron=cron,
        interval=interval,
        parameters={"config": cfg.model_dump(mode="json"), "resume": True, "more_steps": cfg.train.steps},
        description=f"scheduled retraining of {cfg.name}: resume from the latest checkpoint, "
        f"then {cfg.train.steps} more steps",
        enforce_parameter_schema=True,  # a run started from the UI with a bad field is refused, naming it
        _sync=True,  # a RunnerDeployment even when called from async code
    )


def serve_deployment(config: str, overrides: list[str], cron: str | None, interval: float | None) -> None:
    from prefect import serve

    serve(deployment(config, overrides, cron, interval))


def ui(port: int = 4200) -> int:
    """Start a Prefect server on 127.0.0.1 (foreground) and print its URL."""
    prefect = shutil.which("prefect", path=os.path.dirname(sys.executable)) or "prefect"
    print(f"Prefect UI: http://127.0.0.1:{port}  (set PREFECT_API_URL=http://127.0.0.1:{port}/api to use it)")
    return subprocess.call([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)])
