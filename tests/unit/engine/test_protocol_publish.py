"""The weight publish of an iteration does not wait for a generation worker that does not answer yet."""

import asyncio

from engine.protocol import Collaborators, IterationProtocol


class Worker:
    def __init__(self) -> None:
        self.back = asyncio.Event()  # set: the worker answers (Ray keeps calls pending while it restarts)
        self.prefetched: list[int] = []

    async def ping(self) -> dict[str, int]:
        await self.back.wait()
        return {"pid": 1}

    def prefetch(self, version: int) -> None:
        self.prefetched.append(version)


class Trainer:
    def __init__(self, restarting: Worker) -> None:
        self.restarting = restarting

    def version(self) -> int:
        return 1

    def publish(self) -> dict[str, float]:
        self.restarting.back.set()  # the restarting worker is back only once the publish has begun
        return {"pack_s": 0.02, "push_wait_s": 0.005, "last_push_s": 0.01, "bytes": 8.0}


async def test_the_publish_does_not_wait_for_the_prefetch_of_a_worker_being_restarted():
    """Were the publish to wait for every prefetch call, it would wait here for the restarting worker,
    which comes back only once the publish has begun: that worker would be left out after
    `restart_wait_s` (and a live worker's pull, polling for the version meanwhile, could time out)."""
    live, restarting = Worker(), Worker()
    live.back.set()
    proto = IterationProtocol(
        Collaborators(None, None, Trainer(restarting), [live, restarting]),
        "rollart",
        batch_groups=1,
        restart_wait_s=2.0,
    )
    out = await proto._publish_and_prefetch()
    assert out == {"publish_s": 0.025, "push_s": 0.01, "weight_bytes": 8.0}
    assert live.prefetched == restarting.prefetched == [1] and proto.unavailable == set()
