"""A run that is slow to hear its runner's cancel, served by `rollart deploy`'s runner and cancelled by it.

`python -m tests.integration.flows.held_gil MARKER WHEN` (PREFECT_API_URL set) serves `hold_the_gil` with
`flows.deploy.runner()`, starts one run, and stops the runner as `rollart deploy` does on SIGTERM, at WHEN:
"importing" while the run's process still imports the flow (it cannot listen for a cancel yet), or
"holding" while the run's main thread holds the GIL for HOLD_S (its listener thread cannot answer), or
"deaf" once a run that never connects to the control channel runs (as one whose imports outlast the
runner's wait): that run takes the SIGTERM for a crash, and its crash hook writes whether it learnt from
flows/runner_stop.py that its runner stopped it; or "killed" while a run that never connects still imports:
the SIGTERM ends it before it can report, so the runner reports the crash and runs the crash hook itself,
RUNNER_HOOK_DELAY_S after the process exited (after the runner's stop has returned). It prints one JSON
line: what the runner's control channel returned for its cancel (`acked`) and the run's final state. The
run writes its progress into MARKER, then the cancel intent it saw at the SIGTERM, then what its crash hook
saw.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from prefect import flow

HOLD_S = 4  # longer than Prefect's default wait for an acknowledgement (1 s)
IMPORT_S = 2.0
DEAF_ACK_S = 2.0  # the runner's wait for a connection and an ack, in the "deaf" and "killed" cases
KILLED_IMPORT_S = 30.0  # "killed": the SIGTERM ends the run while it imports, so its runner reports the crash
RUNNER_HOOK_DELAY_S = 5.0  # Prefect's kill looks every 3 s whether the process has gone: past its first look

if os.environ.get("PREFECT__FLOW_RUN_ID") and os.environ.get("HELD_GIL_MARKER"):  # in the run's process
    Path(os.environ["HELD_GIL_MARKER"]).write_text("importing")
    if os.environ.get("HELD_GIL_WHEN") == "killed":  # still importing when the runner gives up waiting
        time.sleep(KILLED_IMPORT_S)
    time.sleep(IMPORT_S)  # as the train flow's imports take seconds before the run can listen
    if os.environ.get("HELD_GIL_WHEN") in ("deaf", "killed"):
        from prefect._internal import control_listener

        control_listener._configured_port = None  # the engine will not connect to the runner's channel


def _note_crash(flow: Any, flow_run: Any, state: Any) -> None:
    from flows.runner_stop import stopped_by_runner

    marker = Path(os.environ["HELD_GIL_MARKER"])
    stopped = stopped_by_runner(flow_run.id)
    marker.write_text(f"{marker.read_text()}; crash hook: stopped by its runner: {stopped}")


@flow(on_crashed=[_note_crash])
def hold_the_gil(marker: str, when: str) -> None:
    """Hold the GIL for HOLD_S in one C call (as an extension loading does), then idle until stopped."""
    from prefect._internal.control_listener import get_intent
    from prefect.exceptions import TerminationSignal

    try:
        Path(marker).write_text("holding" if when != "deaf" else "deaf")
        if when != "deaf":
            ctypes.PyDLL(None).sleep(HOLD_S)  # a PyDLL call keeps the GIL; SIGTERM may end the sleep early
        while True:
            time.sleep(0.1)
    except TerminationSignal:
        Path(marker).write_text(f"intent at SIGTERM: {get_intent()}")
        raise


async def main(marker: Path, when: str) -> dict:
    from prefect.client.orchestration import get_client

    from flows.deploy import runner, stop_runner

    if when == "killed":  # the runner reports the crash itself, as slowly as a loaded machine may
        from prefect.runner._hook_runner import HookRunner

        run_crashed_hooks = HookRunner.run_crashed_hooks

        async def slow(self: HookRunner, flow_run: Any, state: Any) -> None:
            await asyncio.sleep(RUNNER_HOOK_DELAY_S)
            await run_crashed_hooks(self, flow_run, state)

        HookRunner.run_crashed_hooks = slow  # type: ignore[method-assign]
    serving = runner(DEAF_ACK_S) if when in ("deaf", "killed") else runner()
    channel = serving._control_channel
    deliver = channel.signal
    acked: list[bool] = []

    async def recorded(*args: object, **kwargs: object) -> bool:
        acked.append(await deliver(*args, **kwargs))
        return acked[-1]

    channel.signal = recorded  # type: ignore[method-assign]
    dep = await hold_the_gil.ato_deployment(name="held-gil", parameters={"marker": str(marker), "when": when})
    dep_id = await serving.aadd_deployment(dep)
    started = asyncio.create_task(serving.start())
    async with get_client() as client:
        run = await client.create_flow_run_from_deployment(dep_id)
        for _ in range(1200):  # the run's process starts Python and imports Prefect first
            if marker.exists() and marker.read_text() == ("importing" if when == "killed" else when):
                break
            assert not started.done(), "the runner stopped by itself"
            await asyncio.sleep(0.05)
        await stop_runner(serving, started)
        state = (await client.read_flow_run(run.id)).state
        await client.delete_deployment(dep_id)
    return {"acked": acked, "state": state.type.value if state else None}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))))
