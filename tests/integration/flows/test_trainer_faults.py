"""A trainer exception at a step: retried once (Prefect task retry); failing again, the run stops cleanly.

Also: the counters of injected env and reward faults reach each step's metadata-store row.
"""

import asyncio

import pytest

from infra.metadata import MetadataStore
from tests.integration.runs import ray_for, tiny_config


@pytest.fixture(scope="module", autouse=True)
def local_ray(tmp_path_factory):
    """One Ray for the module's runs: each run leaves it up."""
    with ray_for(config(tmp_path_factory.mktemp("ray"), 1, {})):
        yield


def config(tmp_path, steps: int, faults: dict) -> dict:
    cfg = tiny_config(tmp_path, "trainfault", train={"steps": steps, "step_retries": 1}, faults=faults)
    cfg["resources"]["roles"]["actor_gen"]["count"] = 1
    return cfg


async def test_a_failed_step_is_retried_and_a_repeated_failure_stops_the_run_keeping_its_checkpoint(
    prefect_home,
    tmp_path,
):
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from flows.train import TrainingStopped, train

    faults = {"seed": 2, "trainer_error_at_step": 2, "env_step_crash": 0.2, "reward_error": 0.2}
    summary = await train(config(tmp_path, 3, faults))
    assert summary["steps_this_run"] == 3
    store = MetadataStore(f"sqlite:///{tmp_path}/runs/trainfault/metadata.db")
    rows = store.steps("trainfault")
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["version"] for r in rows] == [1, 2, 3]
    assert [r["metrics"]["count/train_step_retries"] for r in rows] == [0, 1, 0]  # step 2 failed once
    last = rows[-1]["metrics"]  # counters since the start, as recorded with the step
    assert last["count/member_failed_InjectedEnvCrash"] >= 1 and last["count/reward_retries"] >= 1
    assert last["count/gen_requests_retried"] == 0 and last["count/trajectories_failed"] >= 1

    # step 4 fails twice: one retry is not enough, the run stops; the checkpoint of step 3 is kept
    faults = {"trainer_error_at_step": 4, "trainer_error_times": 2}
    with pytest.raises(TrainingStopped, match=r"step 4 failed after 1 retries: .*InjectedTrainerError"):
        await train(config(tmp_path, 5, faults), resume=True)
    assert [r["step"] for r in store.steps("trainfault")] == [1, 2, 3]
    assert store.latest_checkpoint("trainfault")["step"] == 3

    # the failure is on record beside the steps, and as a Prefect event an automation can match
    completed, ended = store.events("trainfault")  # the first run completed, the resumed one failed
    assert completed["kind"] == "completed"
    assert ended["kind"] == "failed" and "step 4 failed after 1 retries" in ended["reason"]
    async with get_client() as client:
        for _ in range(100):  # events reach the server through a background worker
            page = await client.read_events(
                EventFilter(
                    event=EventNameFilter(name=["rollart.run.failed"]),
                    resource=EventResourceFilter(id=["rollart.experiment.trainfault"]),
                ),
                limit=50,
            )
            if page.events:
                break
            await asyncio.sleep(0.1)
    (event,) = page.events
    assert event.resource.id == "rollart.experiment.trainfault" and event.payload["last_checkpoint"] == 3
    assert event.resource["rollart.failures"] == "1"  # the first failure since the last completed run
    assert "step 4 failed" in event.payload["reason"]
