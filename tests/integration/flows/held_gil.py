"""A run whose main thread holds the GIL for seconds, served by `rollart deploy`'s runner and cancelled by it.

`python -m tests.integration.flows.held_gil MARKER HOLD_S` (PREFECT_API_URL set) serves `hold_the_gil`
with `flows.deploy.runner()`, starts one run, and once the run holds the GIL stops the runner as
`rollart deploy` does on SIGTERM. It prints one JSON line: whether the run acknowledged the runner's cancel
(`acked`, what the runner's control channel returned) and the run's final state. The run writes, into
MARKER, "holding" while it holds the GIL and then the cancel intent it saw when the SIGTERM reached it.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
import time
from pathlib import Path

from prefect import flow


@flow
def hold_the_gil(marker: str, seconds: int) -> None:
    """Hold the GIL for `seconds` in one C call (as an extension loading does), then idle until stopped."""
    from prefect._internal.control_listener import get_intent
    from prefect.exceptions import TerminationSignal

    try:
        Path(marker).write_text("holding")
        ctypes.PyDLL(None).sleep(seconds)  # a PyDLL call keeps the GIL; SIGTERM may end the sleep early
        while True:
            time.sleep(0.1)
    except TerminationSignal:
        Path(marker).write_text(f"intent at SIGTERM: {get_intent()}")
        raise


async def main(marker: Path, seconds: int) -> dict:
    from prefect.client.orchestration import get_client

    from flows.deploy import runner

    serving = runner()
    channel = serving._control_channel
    deliver = channel.signal
    acked: list[bool] = []

    async def recorded(*args: object, **kwargs: object) -> bool:
        acked.append(await deliver(*args, **kwargs))
        return acked[-1]

    channel.signal = recorded  # type: ignore[method-assign]
    dep = await hold_the_gil.ato_deployment(
        name="held-gil", parameters={"marker": str(marker), "seconds": seconds}
    )
    dep_id = await serving.aadd_deployment(dep)
    started = asyncio.create_task(serving.start())
    async with get_client() as client:
        run = await client.create_flow_run_from_deployment(dep_id)
        for _ in range(1200):  # the run's process imports Prefect and the flow first
            if marker.exists() and marker.read_text() == "holding":
                break
            assert not started.done(), "the runner stopped by itself"
            await asyncio.sleep(0.1)
        await serving.astop()
        state = (await client.read_flow_run(run.id)).state
        await client.delete_deployment(dep_id)
    started.cancel()
    return {"acked": acked, "state": state.type.value if state else None}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))))
