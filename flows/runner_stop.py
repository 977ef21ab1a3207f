"""A runner's stop, told to the runs it stops where Prefect's control channel does not reach them.

`rollart deploy`'s runner cancels its runs in flight when it is stopped: it sends each one a cancel intent
on Prefect's control channel, waits up to its acknowledgement timeout, then sends SIGTERM. A run whose main
thread holds the GIL for longer than that wait (importing torch or starting Ray on a loaded machine) never
records the intent, takes the SIGTERM for a crash, and its crash hook counts a failure that `--auto-resume`
answers with one more run (a CI run saw it: its runner waited 15 s for the connection and 15 s for the ack).

So the runner also writes the id of each run it stops into a directory its runs inherit by environment
(`STOPPED_RUNS`, set before any run starts), before it cancels them. A crash hook that finds its run's id
there knows the runner stopped the run, and records no failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from uuid import UUID

STOPPED_RUNS = "ROLLART_STOPPED_RUNS"


def share_stop_dir() -> Path:
    """A fresh directory for this runner's stops, named in this process's environment (which the runs it
    starts inherit). Returns it; `release_stop_dir` removes it."""
    path = Path(tempfile.mkdtemp(prefix="rollart-stopped-runs-"))
    os.environ[STOPPED_RUNS] = str(path)
    return path


def mark_stopped(run_ids: Iterable[UUID]) -> None:
    """Record, before cancelling them, that this process's runner stops the runs `run_ids`."""
    path = Path(os.environ[STOPPED_RUNS])
    for run_id in run_ids:
        (path / str(run_id)).touch()


def stopped_by_runner(run_id: UUID | str) -> bool:
    """Whether the runner that started this process stopped the run `run_id` (False outside a runner)."""
    path = os.environ.get(STOPPED_RUNS)
    return bool(path) and (Path(path) / str(run_id)).exists()


def release_stop_dir() -> None:
    """Remove this process's stop directory, once the runs it names have ended."""
    path = os.environ.pop(STOPPED_RUNS, None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
