"""A run that is slow to hear its runner's cancel, served by `rollart deploy`'s runner and cancelled by it.

`python -m tests.integration.flows.held_gil MARKER WHEN` (PREFECT_API_URL set) serves `hold_the_gil` with
`flows.deploy.runner()`, starts one run, and stops the runner as `rollart deploy` does on SIGTERM, at WHEN:
"importing" while the run's process still imports the flow (it cannot listen for a cancel yet), or
"holding" while the run's main thread holds the GIL for HOLD_S (its listener thread cannot answer). It
prints one JSON line: what the runner's control channel returned for its cancel (`acked`) and the run's
final state. The run writes its progress into MARKER, and then the cancel intent it saw at the SIGTERM.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import sys
import time
from pathlib import Path

from prefect import flow

HOLD_S = 4  # longer than Prefect's default wait for an acknowledgement (1 s)
IMPORT_S = 2.0

if os.environ.get("PREFECT__FLOW_RUN_ID") and os.environ.get("HELD_GIL_MARKER"):  # in the run's process
    Path(os.environ["HELD_GIL_MARKER"]).write_text("importing")
    time.sleep(IMPORT_S)  # as the train flow's imports take seconds before the run can listen


@flow
def hold_the_gil(marker: str) -> None:
    """Hold the GIL for HOLD_S in one C call (as an extension loading does), then idle until stopped."""
    from prefect._internal.control_listener import get_intent
    from prefect.exceptions import TerminationSignal

    try:
        Path(marker).write_text("holding")
        ctypes.PyDLL(None).sleep(HOLD_S)  # a PyDLL call keeps the GIL; SIGTERM may end the sleep early
        while True:
            time.sleep(0.1)
    except TerminationSignal:
        Path(marker).write_text(f"intent at SIGTERM: {get_intent()}")
        raise


async def main(marker: Path, when: str) -> dict:
    from prefect.client.orchestration import get_client

    from flows.deploy import runner, stop_runner

    serving = runner()
    channel = serving._control_channel
    deliver = channel.signal
    acked: list[bool] = []

    async def recorded(*args: object, **kwargs: object) -> bool:
        acked.append(await deliver(*args, **kwargs))
        return acked[-1]

    channel.signal = recorded  # type: ignore[method-assign]
    dep = await hold_the_gil.ato_deployment(name="held-gil", parameters={"marker": str(marker)})
    dep_id = await serving.aadd_deployment(dep)
    started = asyncio.create_task(serving.start())
    async with get_client() as client:
        run = await client.create_flow_run_from_deployment(dep_id)
        for _ in range(1200):  # the run's process starts Python and imports Prefect first
            if marker.exists() and marker.read_text() == when:
                break
            assert not started.done(), "the runner stopped by itself"
            await asyncio.sleep(0.05)
        await stop_runner(serving)
        state = (await client.read_flow_run(run.id)).state
        await client.delete_deployment(dep_id)
    started.cancel()
    return {"acked": acked, "state": state.type.value if state else None}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))))
