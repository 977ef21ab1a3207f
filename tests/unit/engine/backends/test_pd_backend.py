"""PD disaggregation: a prefill stage prefills and ships KV; decode elsewhere."""

from __future__ import annotations

import asyncio

import pytest

from engine.backends.pd import PDBackend, PrefillStage
from engine.devices import (
    attention_pairs,
    decode_step_s,
    get_device,
    get_model,
    kv_transfer_s,
    prefill_only_s,
    prefill_s,
)
from engine.types import GenRequest, SamplingParams
from tests.simulated import on_simulated_clock
from tests.waiting import settled

QWEN7B, MOE = get_model("qwen2.5-7b"), get_model("qwen3-30b-a3b")
H800, H20 = get_device("H800"), get_device("H20")


def request(rid: str, prompt: list[int] | int, max_tokens: int, trajectory: str = "") -> GenRequest:
    ids = list(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    return GenRequest(rid, ids, SamplingParams(max_tokens=max_tokens), trajectory_id=trajectory)


@on_simulated_clock
async def test_prefills_on_one_device_ships_kv_and_decodes_on_another() -> None:
    stage = PrefillStage(QWEN7B, H800, time_scale=0.1)
    backend = PDBackend(QWEN7B, stage, H20, time_scale=0.1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    out = await backend.generate(request("r", 2000, 40, trajectory="traj"))
    wall = loop.time() - t0  # on the simulated clock: only the modelled waits pass time
    # 30.8 ms of GEMMs (compute-bound: above the 4.5 ms weight read) + 0.8 ms of attention over 2.0M pairs
    prefill = prefill_s(QWEN7B, H800, 2000, pairs=attention_pairs(2000))
    assert prefill == pytest.approx(prefill_only_s(QWEN7B, H800, 2000, pairs=2001000))
    transfer = kv_transfer_s(QWEN7B, 2000, 50e9)  # 2.29 ms over one 400 Gb/s NIC
    decode = sum(decode_step_s(QWEN7B, H20, 2000 + i) for i in range(40))  # 40 x 3.83 ms
    stats = backend.stats()
    assert stats["prefill_busy_s"] == pytest.approx(prefill, rel=1e-9)
    assert stats["kv_transfer_s"] == pytest.approx(transfer, rel=1e-9)
    assert stats["busy_s"] == pytest.approx(decode, rel=1e-9)
    assert out.timings["modelled_s"] == pytest.approx(decode, rel=1e-9)
    total = (prefill + transfer + decode) * 0.1
    assert wall == pytest.approx(total, rel=1e-6)
    turn2 = await backend.generate(
        request("r2", [*range(1, 2001), *out.token_ids, 5, 6], 4, trajectory="traj")
    )
    assert turn2.timings["prefill_tokens"] == 2  # the decode side kept the first turn's KV
    assert backend.stats()["kv_transfer_s"] == pytest.approx(kv_transfer_s(QWEN7B, 2002, 50e9), rel=1e-9)


async def test_one_stage_feeds_several_decode_engines_in_shared_batches() -> None:
    stage = PrefillStage(MOE, H800, time_scale=0.05)
    engines = [PDBackend(MOE, stage, H800, time_scale=0.05) for _ in range(3)]  # 1P3D
    reqs = [request(f"r{i}", 300, 20) for i in range(6)]
    outs = await asyncio.gather(*(engines[i % 3].generate(r) for i, r in enumerate(reqs)))
    assert all(o.finish_reason == "length" and len(o.token_ids) == 20 for o in outs)
    # All six arrive before the stage's first round: one batch of 1800 tokens. An MoE prefill batch that
    # small reads ~all experts (61 GB) and is memory-bound: 18.2 ms, not its 12 ms of compute.
    assert stage.batches == 1
    expected = prefill_only_s(MOE, H800, 1800, pairs=6 * attention_pairs(300))
    assert stage.busy_s == pytest.approx(expected, rel=1e-9)
    assert stage.busy_s > prefill_s(MOE, H800, 1800) * 1.4
    for engine in engines:  # each decode engine ran its two sequences for 20 steps
        two = sum(decode_step_s(MOE, H800, 2 * (300 + i), seqs=2) for i in range(20))
        assert engine.stats()["busy_s"] == pytest.approx(two, rel=1e-9)
        assert engine.stats()["prefill_batches"] == 1  # the shared stage's counters
    await asyncio.gather(*(e.close() for e in engines))


async def test_the_decode_engine_reserves_kv_memory_before_the_stage_prefills() -> None:
    # 500 tokens of decode KV, requests of 200 + 100: the second is prefilled only once the first left
    stage = PrefillStage(QWEN7B, H800, time_scale=0.01)
    backend = PDBackend(QWEN7B, stage, H800, time_scale=0.01, kv_tokens=500)
    outs = await asyncio.gather(*(backend.generate(request(f"r{i}", 200, 100)) for i in range(2)))
    assert stage.batches == 2 and backend.stats()["decode_steps"] == 200
    alone = sum(decode_step_s(QWEN7B, H800, 200 + i) for i in range(100))
    assert [o.timings["modelled_s"] for o in outs] == pytest.approx([alone, alone], rel=1e-9)
    assert stage.busy_s == pytest.approx(2 * prefill_only_s(QWEN7B, H800, 200, pairs=attention_pairs(200)))


@on_simulated_clock
async def test_abort_while_being_prefilled_never_reaches_decode() -> None:
    stage = PrefillStage(QWEN7B, H20, time_scale=0.2)  # 100k tokens on an H20: 24 s modelled, 4.8 s here
    backend = PDBackend(QWEN7B, stage, H20, time_scale=0.2)
    task = asyncio.create_task(backend.generate(request("big", 100_000, 10)))
    await settled()
    assert stage.batches == 1 and not task.done()  # the stage took it and is prefilling it
    await backend.abort("big")
    out = await task
    assert (out.finish_reason, out.token_ids) == ("abort", [])
    await backend.close()  # the stage has finished its round: the prefilled request went nowhere
    assert (backend.stats()["decode_steps"], backend.stats()["running"]) == (0, 0)


def test_stage_and_engine_must_agree() -> None:
    stage = PrefillStage(QWEN7B, H800, time_scale=0.1)
    with pytest.raises(ValueError, match="must match"):
        PDBackend(MOE, stage, H20, time_scale=0.1)
    with pytest.raises(ValueError, match="must match"):
        PDBackend(QWEN7B, stage, H20, time_scale=0.2)
    with pytest.raises(ValueError, match="need tp >= 1"):
        PrefillStage(QWEN7B, H800, tp=0)


async def test_a_long_prefill_stalls_colocated_decode_but_not_disaggregated_decode() -> None:
    from engine.backends.modelled import ModelledBackend

    async def running_then_prefill(backend: ModelledBackend) -> float:
        """Modelled seconds of a 300-token decode while a 30k-token prompt arrives."""
        running = asyncio.create_task(backend.generate(request("run", 100, 300)))
        await backend.generate(request("probe", 10, 1))  # joined with "run": it is decoding now
        await backend.generate(request("big", 30_000, 1))
        return (await running).timings["modelled_s"]

    stall = prefill_s(QWEN7B, H800, 30_000)  # 0.46 s, vs ~1.4 s of decode steps
    colocated = await running_then_prefill(ModelledBackend(QWEN7B, H800, time_scale=0.05))
    disaggregated = await running_then_prefill(
        PDBackend(QWEN7B, PrefillStage(QWEN7B, H800, time_scale=0.05), H800, time_scale=0.05)
    )
    assert colocated >= disaggregated + 0.95 * stall
