"""An iteration's training does not wait for the generation workers' weight update (protocol steps 2–5 and
6 run at once): the batch is already taken, and the two run on different hardware."""

import asyncio

import pytest

from engine.protocol import Collaborators, IterationProtocol


class Rollout:
    def __init__(self) -> None:
        self.advanced: list[int] = []

    def take_batch(self, n: int, version: int, timeout_s: float | None) -> tuple[dict[str, int], list[str]]:
        return {"action_tokens": 5 * n}, [f"group-{i}" for i in range(n)]

    def advance(self, version: int) -> None:
        self.advanced.append(version)


class Proxy:
    def __init__(self) -> None:
        self.suspended = False

    def suspend(self) -> float:
        self.suspended = True
        return 0.0

    def resume(self) -> None:
        self.suspended = False


class Worker:
    def __init__(self, updating: asyncio.Event) -> None:
        self.updating, self.done = updating, asyncio.Event()
        self.may_finish = asyncio.Event()  # set by the trainer: the update ends only while training runs

    async def ping(self) -> dict[str, int]:
        return {"pid": 1}

    def prefetch(self, version: int) -> None:
        pass

    async def update(self, version: int) -> dict[str, float]:
        self.updating.set()
        await self.may_finish.wait()
        self.done.set()
        return {"pull_s": 0.1, "exposed_s": 0.0, "load_s": 0.1}


class Trainer:
    def __init__(self, worker: Worker, fail: bool = False) -> None:
        self.worker, self.fail, self.v = worker, fail, 1

    def version(self) -> int:
        return self.v

    async def train_step(self, groups: list[str]) -> dict[str, float]:
        self.trained = groups
        await self.worker.updating.wait()  # the workers' update has begun and not ended ...
        assert not self.worker.done.is_set()
        self.worker.may_finish.set()  # ... and training runs meanwhile
        if self.fail:
            raise RuntimeError("train step failed")
        self.v += 1
        return {"loss": 0.5}

    def publish(self) -> dict[str, float]:
        return {"pack_s": 0.02, "push_wait_s": 0.005, "last_push_s": 0.01, "bytes": 8.0}


def _protocol(fail: bool = False) -> tuple[IterationProtocol, Rollout, Proxy, Worker]:
    worker = Worker(asyncio.Event())
    rollout, proxy = Rollout(), Proxy()
    proto = IterationProtocol(Collaborators(rollout, proxy, Trainer(worker, fail), [worker]), "rollart", 2)
    proto.serving_version = 0  # the trainer is at 1: this step's workers update to it
    return proto, rollout, proxy, worker


async def test_training_runs_while_the_workers_update_and_the_step_reports_both():
    proto, rollout, proxy, worker = _protocol()
    m = await asyncio.wait_for(proto.step(), 10)  # (were training to wait for the update: a deadlock)
    assert m["loss"] == 0.5 and m["version"] == 2 and m["update_s"] > 0 and m["pull_s"] == 0.1
    assert m["train_s"] > 0 and m["step_s"] >= m["train_s"]
    assert worker.done.is_set() and rollout.advanced == [1] and not proxy.suspended
    assert proto.serving_version == 1
    assert proto.c.trainer.trained == ["group-0", "group-1"] and m["batch_action_tokens"] == 10


async def test_a_failed_train_step_still_lets_the_update_end_and_the_proxy_resume():
    proto, rollout, proxy, worker = _protocol(fail=True)
    with pytest.raises(RuntimeError, match="train step failed"):
        await asyncio.wait_for(proto.step(), 10)
    assert worker.done.is_set() and rollout.advanced == [1] and not proxy.suspended
