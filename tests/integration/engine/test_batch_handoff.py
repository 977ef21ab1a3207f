"""On Ray a step's batch goes from the rollout actor to the trainer as an ObjectRef: the driver, which runs
the iteration protocol, reads the batch's size and never the batch itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from engine.modes import Mode
from engine.protocol import Collaborators, IterationProtocol
from infra.local_ray import init_local_ray

ROOT = Path(__file__).resolve().parents[3]
BATCH_BYTES = 1 << 20  # past Ray's inline limit: it travels through the object store


class Batch:
    """A stand-in for a step's groups that counts, per process, how often it is unpickled."""

    loads = 0

    def __init__(self, n: int) -> None:
        self.data = bytes(n)

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).loads += 1
        self.__dict__.update(state)


@ray.remote
class Rollout:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def take_batch(self, n: int, version: int, timeout_s: float | None) -> tuple[dict[str, int], Batch]:
        if self.fail:
            raise RuntimeError("rollout stopped: the scheduler ended")
        return {"action_tokens": 7 * n}, Batch(BATCH_BYTES)

    def advance(self, version: int) -> int:
        return version


@ray.remote
class Trainer:
    def __init__(self) -> None:
        self.v = 1

    def version(self) -> int:
        return self.v

    def train_step(self, batch: Batch) -> dict[str, float]:
        self.v += 1
        return {"size": len(batch.data), "loads_in_trainer": Batch.loads}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    init_local_ray(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    yield
    ray.shutdown()


def _step(fail: bool) -> tuple[Any, Any]:
    rollout, trainer = Rollout.remote(fail), Trainer.remote()
    c = Collaborators(rollout, None, trainer, [], weights_via_store=False)  # type: ignore[arg-type]
    proto = IterationProtocol(c, Mode.ROLLART, batch_groups=3)
    proto.serving_version = 1  # the workers serve the trainer's version: no update in this step
    return proto, trainer


def test_the_batch_reaches_the_trainer_without_being_unpickled_by_the_driver(local_ray: None) -> None:
    proto, _ = _step(fail=False)
    m = asyncio.run(proto.step())
    assert m["size"] == BATCH_BYTES and m["loads_in_trainer"] == 1  # unpickled once, in the trainer
    assert Batch.loads == 0  # ... and never here, in the driver
    assert m["batch_action_tokens"] == 21 and m["version"] == 2


def test_a_failed_batch_fails_the_get_batch_phase_and_nothing_is_trained(local_ray: None) -> None:
    proto, trainer = _step(fail=True)
    phases: list[str] = []

    async def phase(name: str, fn: Any) -> Any:
        phases.append(name)
        return await fn()

    with pytest.raises(RuntimeError, match="rollout stopped: the scheduler ended"):
        asyncio.run(proto.step(phase))
    assert phases == ["get_batch"] and ray.get(trainer.version.remote()) == 1
