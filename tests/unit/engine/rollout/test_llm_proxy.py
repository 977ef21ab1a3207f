import asyncio

import pytest

from engine.rollout.proxy import GenSlot, LLMProxy
from engine.types import GenOutput, GenRequest, SamplingParams
from tests.waiting import settled


class Engine:
    """A worker whose requests finish only when the test releases them."""

    def __init__(self, name: str):
        self.name = name
        self.gates: dict[str, asyncio.Event] = {}
        self.aborted: list[str] = []

    async def generate(self, req: GenRequest) -> GenOutput:
        gate = self.gates.setdefault(req.request_id, asyncio.Event())
        await gate.wait()
        return GenOutput(req.request_id, [1], [-0.1], 0, "stop")

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def release_all(self) -> None:
        for g in self.gates.values():
            g.set()


def req(rid: str, profile: str = "decode-heavy", traj: str = "") -> GenRequest:
    return GenRequest(rid, [1, 2, 3], SamplingParams(), profile=profile, trajectory_id=traj)


def proxy(capacity: int = 2):
    engines = {n: Engine(n) for n in ("c0", "b0", "b1")}
    kinds = {"c0": "gpu-compute", "b0": "gpu-bandwidth", "b1": "gpu-bandwidth"}
    slots = [GenSlot(n, kinds[n], e, capacity=capacity) for n, e in engines.items()]
    return LLMProxy(slots), engines


async def test_profile_routing_least_loaded_and_fallback():
    p, engines = proxy(capacity=2)
    tasks = [asyncio.ensure_future(p.generate(req(f"d{i}"))) for i in range(4)]
    tasks.append(asyncio.ensure_future(p.generate(req("p0", profile="prefill-heavy"))))
    await settled()
    assert {n: len(e.gates) for n, e in engines.items()} == {"c0": 1, "b0": 2, "b1": 2}  # spread evenly
    # the bandwidth pool is saturated (2 + 2): the next decode request falls back to the compute worker
    tasks.append(asyncio.ensure_future(p.generate(req("d4"))))
    await settled()
    assert "d4" in engines["c0"].gates and p.stats.fallbacks == 1
    for e in engines.values():
        e.release_all()
    outs = await asyncio.gather(*tasks)
    assert [o.worker for o in outs][-2:] == ["c0", "c0"]
    assert p.summary()["requests"] == 6 and p.summary()["per_worker"] == {"b0": 2, "b1": 2, "c0": 2}
    # every routed call counted by its tag and the pool it went to (no pool given: the kind stands in)
    assert p.summary()["routes"] == [
        ["decode-heavy", "gpu-bandwidth", 4],
        ["decode-heavy", "gpu-compute", 1],
        ["prefill-heavy", "gpu-compute", 1],
    ]


async def test_routes_are_counted_per_pool_and_sticky_turns_are_not_routed_again():
    engines = {n: Engine(n) for n in ("c0", "b0")}
    for e in engines.values():
        e.gates = _Open()
    p = LLMProxy(
        [
            GenSlot("c0", "gpu-compute", engines["c0"], capacity=4, pool="h800"),
            GenSlot("b0", "gpu-bandwidth", engines["b0"], capacity=4, pool="h20"),
        ]
    )
    for k in range(3):
        assert (await p.generate(req(f"a/{k}", profile="prefill-heavy", traj="a"))).worker == "c0"
        assert (await p.generate(req(f"b/{k}", profile="decode-heavy", traj="b"))).worker == "b0"
    assert p.summary()["routes"] == [["decode-heavy", "h20", 1], ["prefill-heavy", "h800", 1]]
    assert p.stats.sticky_hits == 4


def test_a_tag_requests_lack_is_refused():
    with pytest.raises(ValueError, match="requests have no field 'flavour' to route by"):
        LLMProxy([GenSlot("c0", "gpu-compute", Engine("c0"))], tag_name="flavour")


async def test_requests_of_a_trajectory_stick_to_one_worker():
    p, engines = proxy(capacity=8)
    for e in engines.values():
        e.gates = _Open()
    first = await p.generate(req("t/0", traj="t"))
    for k in range(1, 5):
        await p.generate(req(f"x/{k}", traj=f"x{k}"))  # other traffic moves the least-loaded choice around
        assert (await p.generate(req(f"t/{k}", traj="t"))).worker == first.worker
    assert p.stats.sticky_hits == 4
    p.release("t")
    assert "t" not in p._sticky


class _Open(dict):
    def setdefault(self, key, default=None):
        ev = asyncio.Event()
        ev.set()
        return ev


async def test_suspend_waits_for_in_flight_and_holds_new_requests_until_resume():
    p, engines = proxy()
    running = asyncio.ensure_future(p.generate(req("r0")))
    await settled()
    suspending = asyncio.ensure_future(p.suspend())
    await settled()
    assert not suspending.done()  # r0 is still in flight
    held = asyncio.ensure_future(p.generate(req("r1")))
    await settled()
    assert all("r1" not in e.gates for e in engines.values())  # not admitted while suspended
    for e in engines.values():
        e.release_all()
    await running
    assert await asyncio.wait_for(suspending, 1) >= 0 and p.suspended
    await settled()
    assert not held.done()
    p.resume()
    await settled()
    for e in engines.values():
        e.release_all()
    out = await asyncio.wait_for(held, 1)
    assert out.timings["suspended_s"] > 0 and out.timings["worker_s"] >= 0


async def test_cancelled_request_is_aborted_on_its_worker():
    p, engines = proxy()
    t = asyncio.ensure_future(p.generate(req("gone")))
    await settled()
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert sum(e.aborted == ["gone"] for e in engines.values()) == 1
    assert all(w.outstanding == 0 for w in p.workers.values())


async def test_a_retired_proxy_waits_for_its_last_requests_then_routes_only_the_next_runs_workers():
    """Reuse across runs (engine/core/warm.py): `retire` aborts the stopped run's requests still in flight,
    declines while one stays in flight past its bound, waits for the last ones, and `reinit` routes only
    the next run's workers, with no count or sticky route of the last run."""
    p, engines = proxy()
    last = asyncio.ensure_future(p.generate(req("a", traj="t1")))
    await settled()
    assert await p.retire(drain_s=0) is False  # still in flight (this engine ignores an abort)
    assert [e.aborted for e in engines.values() if e.aborted] == [["a"]]
    retiring = asyncio.ensure_future(p.retire(drain_s=60))
    await settled()
    assert not retiring.done()
    for e in engines.values():
        e.release_all()
    assert (await last).request_id == "a" and await retiring is True

    nxt = Engine("n0")
    p.reinit([GenSlot("n0", "gpu-bandwidth", nxt, capacity=1)])
    task = asyncio.ensure_future(p.generate(req("b", traj="t1")))  # the same trajectory id: no stale route
    await settled()
    assert list(nxt.gates) == ["b"]
    nxt.release_all()
    assert (await task).worker == "n0" and p.summary()["requests"] == 1


async def test_retire_aborts_what_the_stopped_rollout_left_in_flight_and_does_not_wait_for_it():
    """An engine's abort ends its request at once (finish_reason "abort"), as vLLM's and HF's do: retire
    returns as soon as every such request has ended, not when they would have finished decoding."""

    class Aborting(Engine):
        async def generate(self, req: GenRequest) -> GenOutput:
            out = await super().generate(req)
            return GenOutput(req.request_id, [], [], 0, "abort") if req.request_id in self.aborted else out

        async def abort(self, request_id: str) -> None:
            await super().abort(request_id)
            self.gates.setdefault(request_id, asyncio.Event()).set()

    engines = [Aborting(n) for n in ("b0", "b1")]
    p = LLMProxy([GenSlot(e.name, "gpu-bandwidth", e, capacity=4) for e in engines])
    left = [asyncio.ensure_future(p.generate(req(f"r{i}"))) for i in range(5)]
    await settled()
    assert await asyncio.wait_for(p.retire(drain_s=60), 5) is True
    assert sorted(r for e in engines for r in e.aborted) == ["r0", "r1", "r2", "r3", "r4"]
    assert {o.finish_reason for o in await asyncio.gather(*left)} == {"abort"}
