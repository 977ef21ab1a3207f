"""The modelled backend: scaled real waiting, continuous batching, prefix cache, abort, accounting."""

from __future__ import annotations

import asyncio
import random

import pytest

from engine.backends.modelled import LOGPROB, ModelledBackend
from engine.devices import (
    DecodeCost,
    ModelProfile,
    attention_pairs,
    decode_step_s,
    get_device,
    get_model,
    prefill_only_s,
)
from engine.types import GenRequest, SamplingParams
from tests.simulated import on_simulated_clock

QWEN7B = get_model("qwen2.5-7b")  # ~4.5 ms per decode step on an H800 (15.2 GB of weights / 3.35 TB/s)
H800, H20 = get_device("H800"), get_device("H20")


def request(rid: str, prompt: list[int] | int, max_tokens: int, trajectory: str = "") -> GenRequest:
    ids = list(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    return GenRequest(rid, ids, SamplingParams(max_tokens=max_tokens), trajectory_id=trajectory)


def modelled_alone(prompt: int, out: int, device: str = "H800", prefilled: int | None = None) -> float:
    """Hand model of one request alone in the engine: a prefill pass over its uncached tokens (attending
    to the cached ones), then `out` decode steps of batch 1."""
    d = get_device(device)
    steps = sum(decode_step_s(QWEN7B, d, prompt + i) for i in range(out))
    new = prompt if prefilled is None else prefilled
    return prefill_only_s(QWEN7B, d, new, pairs=attention_pairs(new, prompt - new)) + steps


async def timed(backend: ModelledBackend, *reqs: GenRequest) -> float:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.gather(*(backend.generate(r) for r in reqs))
    return loop.time() - t0


@on_simulated_clock
async def test_one_request_waits_its_modelled_time_scaled() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.25)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    out = await backend.generate(request("r", 1000, 60))
    wall = loop.time() - t0  # on the simulated clock: only the engine's pacing sleeps pass time
    expected = modelled_alone(1000, 60)  # 15.4 + 0.2 ms (attention) prefill + 60 x 4.56 ms = 0.289 s
    assert out.timings["modelled_s"] == pytest.approx(expected, rel=1e-9)
    assert backend.stats()["busy_s"] == pytest.approx(expected, rel=1e-9)
    assert wall == pytest.approx(expected * 0.25, rel=1e-6)  # ~72 ms
    assert (out.token_ids, out.logprobs) == ([0] * 60, [LOGPROB] * 60)
    assert (out.finish_reason, out.version) == ("length", 0)
    assert out.timings["prefill_tokens"] == 1000 and out.timings["cached_tokens"] == 0


@on_simulated_clock
async def test_concurrent_requests_share_decode_steps() -> None:
    alone = ModelledBackend(QWEN7B, H800, time_scale=0.05)
    batched = ModelledBackend(QWEN7B, H800, time_scale=0.05)
    one = await timed(alone, request("r", 100, 400))
    many = await timed(batched, *(request(f"r{i}", 100, 400) for i in range(32)))
    # All 32 join the first iteration: one prefill of 3200 tokens, then 400 steps reading the weights
    # once and the 32 growing contexts.
    steps = sum(decode_step_s(QWEN7B, H800, 32 * (100 + i), seqs=32) for i in range(400))
    expected = prefill_only_s(QWEN7B, H800, 3200, pairs=32 * attention_pairs(100)) + steps
    assert batched.stats()["busy_s"] == pytest.approx(expected, rel=1e-9)
    assert expected / alone.stats()["busy_s"] == pytest.approx(1.066, abs=0.01)
    assert batched.stats()["decode_steps"] == 400 and batched.stats()["generated_tokens"] == 32 * 400
    assert many < 1.1 * one  # 32 at once take about as long as one alone; serial service would take 32x


async def test_full_batch_queues_the_rest() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.1, max_batch=2)
    outs = await asyncio.gather(*(backend.generate(request(f"r{i}", 10, 20)) for i in range(4)))
    # a 20-token prefill pass is memory-bound: it reads the weights as a decode step does (4.5 ms), plus
    # attention over 2 x 55 (query, key) pairs
    prefill = 2 * 7.61e9 / 3.35e12 + 401_408 * 110 / 989e12
    wave = prefill + sum(decode_step_s(QWEN7B, H800, 2 * (10 + i), seqs=2) for i in range(20))
    assert backend.stats()["busy_s"] == pytest.approx(2 * wave, rel=1e-9)  # two waves of 20 steps
    assert backend.stats()["decode_steps"] == 40
    waited = [o.timings["queue_s"] > 0.5 * outs[0].timings["gen_s"] for o in outs]
    assert waited == [False, False, True, True]


async def test_second_turn_prefills_only_new_tokens() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.01)
    first = await backend.generate(request("t1", 100, 10, trajectory="traj"))
    context = [*range(1, 101), *first.token_ids]
    second = await backend.generate(request("t2", [*context, *range(500, 550)], 10, trajectory="traj"))
    assert (second.timings["prefill_tokens"], second.timings["cached_tokens"]) == (50, 110)
    assert second.timings["modelled_s"] == pytest.approx(modelled_alone(160, 10, prefilled=50), rel=1e-9)
    # another trajectory with the same prompt has no cache; a changed token ends the cached prefix
    other = await backend.generate(request("o1", context, 10, trajectory="other"))
    edited = await backend.generate(
        request("t3", [*context[:60], 9999, *context[61:]], 10, trajectory="traj")
    )
    assert other.timings["cached_tokens"] == 0 and edited.timings["cached_tokens"] == 60
    stats = backend.stats()
    assert (stats["prefill_tokens"], stats["cached_tokens"]) == (100 + 50 + 110 + 50, 110 + 60)


async def test_prefix_cache_is_an_lru_in_the_kv_memory_the_running_batch_leaves() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.01, kv_tokens=150)
    await backend.generate(request("a1", 100, 10, trajectory="a"))  # caches 110 tokens
    await backend.generate(request("b1", 100, 10, trajectory="b"))  # holds 110 of 150 running: evicts a
    a2 = await backend.generate(request("a2", [*range(1, 101), *[0] * 10], 5, trajectory="a"))
    b2 = await backend.generate(request("b2", [*range(1, 101), *[0] * 10], 5, trajectory="b"))
    assert (a2.timings["cached_tokens"], b2.timings["cached_tokens"]) == (0, 0)  # a2 evicted b in turn
    uncached = ModelledBackend(QWEN7B, H800, time_scale=0.01, prefix_cache=False)
    await uncached.generate(request("a1", 100, 10, trajectory="a"))
    a2 = await uncached.generate(request("a2", [*range(1, 101), *[0] * 10], 5, trajectory="a"))
    assert a2.timings["cached_tokens"] == 0


async def test_kv_memory_bounds_the_running_batch() -> None:
    # 500 tokens of KV: a request holds its prompt and all its outputs (200 + 100), so a second one waits
    # for the first to leave, first come first served; one bigger than memory still runs, alone.
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.01, kv_tokens=500)
    outs = await asyncio.gather(*(backend.generate(request(f"r{i}", 200, 100)) for i in range(2)))
    alone = modelled_alone(200, 100)
    assert backend.stats()["busy_s"] == pytest.approx(2 * alone, rel=1e-9)  # one after the other
    assert [o.timings["modelled_s"] for o in outs] == pytest.approx([alone, alone], rel=1e-9)
    assert outs[1].timings["queue_s"] > 0.5 * alone * 0.01  # it waited about the first's time (scaled)
    roomy = ModelledBackend(QWEN7B, H800, time_scale=0.01, kv_tokens=600)
    await asyncio.gather(*(roomy.generate(request(f"r{i}", 200, 100)) for i in range(2)))
    assert roomy.stats()["decode_steps"] == 100  # both in one batch
    big = await backend.generate(request("big", 600, 10))
    assert big.finish_reason == "length" and len(big.token_ids) == 10


async def test_an_moe_engine_over_two_devices_prefills_a_request_on_one() -> None:
    moe = get_model("qwen3-30b-a3b")
    backend = ModelledBackend(moe, H800, tp=2, time_scale=0.01)
    await backend.generate(request("r", 4000, 10))
    pairs = attention_pairs(4000)  # 8.0M pairs, all on one device: 6.4 ms, not 3.2
    steps = sum(decode_step_s(moe, H800, 4000 + i, tp=2) for i in range(10))
    expected = prefill_only_s(moe, H800, 4000, tp=2, pairs=pairs, longest=pairs) + steps
    assert backend.stats()["busy_s"] == pytest.approx(expected, rel=1e-9)
    assert expected - steps > prefill_only_s(moe, H800, 4000, tp=2, pairs=pairs) + 0.003


async def test_abort_running_and_waiting_requests() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.01, max_batch=2)
    short = asyncio.create_task(backend.generate(request("short", 10, 5)))
    tasks = {
        n: asyncio.create_task(backend.generate(request(n, 10, 100_000))) for n in ("long", "next", "last")
    }
    await short  # "next" took the slot "short" freed; "last" still waits for one
    assert (backend.stats()["running"], backend.stats()["waiting"]) == (2, 1)
    for name in ("last", "next", "long", "unknown"):  # unknown: not in flight, nothing to do
        await backend.abort(name)
    outs = {n: await t for n, t in tasks.items()}
    assert {o.finish_reason for o in outs.values()} == {"abort"}
    assert outs["last"].token_ids == []
    assert 5 <= len(outs["long"].token_ids) < 1000 and len(outs["next"].token_ids) < 1000
    stats = backend.stats()
    assert (stats["aborted"], stats["finished"], stats["running"]) == (3, 1, 0)


async def test_cancelled_caller_frees_its_slot() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.01)
    hog = asyncio.create_task(backend.generate(request("hog", 10, 100_000)))
    await backend.generate(request("probe", 10, 5))  # joined with "hog", which is still running
    assert backend.stats()["running"] == 1
    hog.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hog
    assert (backend.stats()["running"], backend.stats()["aborted"]) == (0, 1)
    after = await backend.generate(request("after", 10, 5))
    assert after.finish_reason == "length" and backend.stats()["decode_steps"] < 1000


async def test_output_tokens_are_seeded_per_request() -> None:
    def draw(req: GenRequest, rng: random.Random) -> int:
        return rng.randint(1, 40)

    reqs = [request(f"r{i}", 10, 30) for i in range(12)]
    a = ModelledBackend(QWEN7B, H800, time_scale=0.01, output_tokens=draw, seed=7)
    b = ModelledBackend(QWEN7B, H800, time_scale=0.01, output_tokens=draw, seed=7)
    outs_a = await asyncio.gather(*(a.generate(r) for r in reqs))
    outs_b = await asyncio.gather(*(b.generate(r) for r in reversed(reqs)))
    lengths = {o.request_id: len(o.token_ids) for o in outs_a}
    assert lengths == {o.request_id: len(o.token_ids) for o in outs_b}
    assert len(set(lengths.values())) > 3 and max(lengths.values()) == 30  # varied, capped by max_tokens
    assert all((o.finish_reason == "length") == (len(o.token_ids) == 30) for o in outs_a)
    fixed = ModelledBackend(QWEN7B, H800, time_scale=0.01, output_tokens=8)
    assert (await fixed.generate(request("f", 10, 30))).finish_reason == "stop"
    zero = ModelledBackend(QWEN7B, H800, output_tokens=lambda req, rng: 0)
    with pytest.raises(ValueError, match="output_tokens gave 0 tokens for request 'z'"):
        await zero.generate(request("z", 10, 30))


async def test_new_weights_tag_new_requests_and_recompute_running_kv() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.01)
    first = await backend.generate(request("t1", 100, 10, trajectory="traj"))
    running = asyncio.create_task(backend.generate(request("long", 1000, 2000)))
    await backend.generate(request("probe", 10, 5))  # joined with "long": it is running now
    backend.load_weights([], version=3)
    turn2 = await backend.generate(request("t2", [*range(1, 101), *first.token_ids, 7], 5, trajectory="traj"))
    assert (turn2.version, turn2.timings["cached_tokens"]) == (3, 0)  # new weights emptied the cache
    assert (await running).version == 0
    assert backend.stats()["recomputed_tokens"] >= 1000  # the running context was re-prefilled


async def test_utilisation_accounting() -> None:
    # 0.23 modelled s in real time: long enough that a loaded machine's scheduling delays are small
    backend = ModelledBackend(QWEN7B, H800, time_scale=1.0)
    await backend.generate(request("r", 100, 50))
    busy = backend.stats()
    assert busy["busy_s"] == pytest.approx(modelled_alone(100, 50), rel=1e-9)
    assert 0.5 < busy["utilisation"] <= 1.0  # fresh backend, busy nearly all along
    other = ModelledBackend(QWEN7B, H800, time_scale=1.0)
    await other.generate(request("r", 100, 100))  # `backend` sits idle meanwhile, ~2x as long as it worked
    idle = backend.stats()
    assert idle["busy_s"] == busy["busy_s"]
    assert idle["elapsed_s"] >= busy["elapsed_s"] + other.stats()["busy_s"]
    assert idle["utilisation"] == pytest.approx(idle["busy_s"] / idle["elapsed_s"])
    assert idle["utilisation"] < 0.34  # <= busy / (busy + the other busy) = 0.334


async def test_user_errors_are_explained() -> None:
    big = ModelProfile("dense-70b", 70e9, 70e9, layers=80, kv_heads=8, head_dim=128, heads=64, hidden=8192)
    with pytest.raises(ValueError, match=r"140\.0 GB of weights; 1 x H800 has 80 GB: raise tp"):
        ModelledBackend(big, H800)
    assert ModelledBackend(big, H800, tp=2).stats()["requests"] == 0
    with pytest.raises(ValueError, match="mfu and mbu"):
        ModelledBackend(QWEN7B, H800, mfu=1.5)
    backend = ModelledBackend(QWEN7B, H800, time_scale=0.01)
    with pytest.raises(ValueError, match="empty prompt"):
        await backend.generate(request("e", [], 5))
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        await backend.generate(request("m", 10, 0))
    first = asyncio.create_task(backend.generate(request("dup", 10, 50)))
    await backend.generate(request("probe", 10, 1))  # joined with "dup", which is still running
    with pytest.raises(ValueError, match="'dup' is already in flight"):
        await backend.generate(request("dup", 10, 5))
    assert (await first).finish_reason == "length"


@on_simulated_clock
async def test_an_arrival_or_abort_is_taken_in_at_the_next_decode_step_boundary() -> None:
    backend = ModelledBackend(QWEN7B, H800, time_scale=1.0)
    cost = DecodeCost(QWEN7B, H800)  # (KV tokens of the batch, steps, sequences) -> modelled s

    def prefill(tokens: int) -> float:
        pairs = attention_pairs(tokens)
        return prefill_only_s(QWEN7B, H800, tokens, pairs=pairs, longest=pairs)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = asyncio.create_task(backend.generate(request("a", 100, 50)))
    arrival = prefill(100) + cost(100, 10, 1) + 0.5 * cost(110, 1, 1)  # halfway through "a"'s 11th step
    await asyncio.sleep(arrival)
    second = await backend.generate(request("b", 10, 5))
    joined = prefill(100) + cost(100, 11, 1)  # that step ends; "b" is prefilled, then both decode 5 steps
    assert second.timings["queue_s"] == pytest.approx(joined - arrival, rel=1e-9)
    done = joined + prefill(10) + cost(111 + 10, 5, 2)
    assert loop.time() - t0 == pytest.approx(done, rel=1e-9)
    third = asyncio.create_task(backend.generate(request("c", 10, 30)))  # to join "a" after its next step
    await asyncio.sleep(0.25 * cost(116, 1, 1))  # a quarter into that step
    await backend.abort("a")  # "a" leaves when that step (its 17th token) is done, "c" then runs alone
    out = await first
    assert (len(out.token_ids), out.finish_reason) == (17, "abort")
    alone = await third
    assert alone.timings["modelled_s"] == pytest.approx(prefill(10) + cost(10, 30, 1), rel=1e-9)
    assert loop.time() - t0 == pytest.approx(done + cost(116, 1, 1) + prefill(10) + cost(10, 30, 1), rel=1e-9)
