"""LLMProxy when a generation worker dies: its requests are retried elsewhere, it is routed around."""

import asyncio

import pytest
from ray.exceptions import ActorDiedError

from engine.rollout.proxy import GenSlot, LLMProxy
from engine.types import GenOutput, GenRequest, SamplingParams


class Worker:
    """Serves after a short delay; while `dead`, every call (and the ones it holds) fails as Ray's would."""

    def __init__(self) -> None:
        self.dead = False
        self.served: list[str] = []

    async def generate(self, req: GenRequest) -> GenOutput:
        await asyncio.sleep(0.01)
        if self.dead:
            raise ActorDiedError()
        self.served.append(req.request_id)
        return GenOutput(req.request_id, [1], [-0.1], 0, "stop")


def req(rid: str, traj: str = "") -> GenRequest:
    return GenRequest(rid, [1, 2], SamplingParams(), profile="decode-heavy", trajectory_id=traj)


def setup(max_retries: int = 3):
    w = {"b0": Worker(), "b1": Worker()}
    return LLMProxy(
        [GenSlot(n, "gpu-bandwidth", x, capacity=8) for n, x in w.items()], max_retries=max_retries
    ), w


async def test_requests_held_by_a_dying_worker_are_retried_on_the_other_one():
    proxy, w = setup()
    w["b0"].dead = True
    outs = await asyncio.gather(*(proxy.generate(req(f"r{i}", traj=f"t{i}")) for i in range(6)))
    assert all(o.worker == "b1" for o in outs)  # every request completed, on the live worker
    assert sorted(w["b1"].served) == [f"r{i}" for i in range(6)]
    assert proxy.stats.retried == 3 and proxy.stats.worker_failures == {"b0": 3}  # b0 held half of them
    assert proxy.workers["b0"].down
    await proxy.generate(req("later"))  # routed around the dead worker, no failure
    assert w["b1"].served[-1] == "later" and proxy.stats.worker_failures == {"b0": 3}


async def test_a_restarted_worker_rejoins_after_the_next_weight_update():
    proxy, w = setup()
    w["b0"].dead = True
    await proxy.generate(req("r0"))
    w["b0"].dead = False  # Ray restarted it
    await proxy.suspend()
    proxy.resume()  # the weight update reached every worker
    assert not proxy.workers["b0"].down
    await asyncio.gather(*(proxy.generate(req(f"s{i}")) for i in range(4)))
    assert len(w["b0"].served) == 2  # load spreads over both again


async def test_a_request_fails_once_its_retries_are_spent():
    proxy, w = setup(max_retries=1)
    w["b0"].dead = w["b1"].dead = True
    with pytest.raises(ActorDiedError):
        await proxy.generate(req("r0"))
    assert proxy.stats.retried == 1 and sum(proxy.stats.worker_failures.values()) == 2
    assert proxy.summary()["retried"] == 1
