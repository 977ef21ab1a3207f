"""R3 on a tiny step, and the modelled scale-to-zero endpoint's billing (keep-alive and minimum billed)."""

import argparse
import asyncio
import json

import pytest

from bench.clock import run as run_loop
from bench.serverless import FULL, QUICK, Endpoint, ServerlessJudge, run
from engine.backends.modelled import ModelledBackend
from engine.devices import get_device, get_model, prefill_s
from engine.types import GenRequest, SamplingParams

QWEN7B, H800 = get_model("qwen2.5-7b"), get_device("H800")
TINY = dict(
    quick=False, gpus=4, reward_gpus=1, groups=2, swe_turns=(6, 10), swe_obs_tokens=1000,
    cot_tokens=(512, 2048), cold_start_s=0.5,
)  # fmt: skip


def _req(i: int, tokens: int) -> GenRequest:
    return GenRequest(f"j{i}", [1] * tokens, SamplingParams(max_tokens=1))


def _judge(endpoint: Endpoint) -> ServerlessJudge:
    return ServerlessJudge(lambda: ModelledBackend(QWEN7B, H800, time_scale=1.0), endpoint, 1.0)


def test_endpoint_cold_starts_reuses_warm_instances_and_bills_the_keep_alive() -> None:
    async def scenario() -> tuple[ServerlessJudge, dict[int, float]]:
        judge = _judge(Endpoint(cold_start_s=2.0, idle_s=5.0, per_instance=2))
        loop = asyncio.get_running_loop()
        ends: dict[int, float] = {}

        async def call(i: int) -> None:
            await judge(_req(i, 10_000))
            ends[i] = loop.time()

        await asyncio.gather(call(0), call(1), call(2))  # 2 fit one instance, the 3rd starts another
        await asyncio.sleep(1.0)
        await call(3)  # warm: no cold start (the first instance)
        await asyncio.sleep(10.0)  # both idle past idle_s: released
        await call(4)  # scaled to zero: a cold start again
        return judge, ends

    judge, ends = run_loop(scenario())
    one = prefill_s(QWEN7B, H800, 10_000)  # 0.154 s: a call is a 10k-token prefill and one decode step
    assert judge.cold_starts == 3
    gathered = max(ends[0], ends[1], ends[2])  # call 2, alone on the second instance, ends first
    assert ends[3] - gathered == pytest.approx(1.0 + one, abs=0.05)  # served at once by a warm instance
    # billed: each instance from its start to idle_s after its last call (cold start and keep-alive in)
    first, second = ends[3] + 5.0, ends[2] + 5.0
    third = ends[4] - (ends[3] + 10.0) + 5.0  # started when call 4 arrived, 10 s after call 3 returned
    assert judge.billed_s() == pytest.approx([first, second, third])
    assert third == pytest.approx(2.0 + one + 5.0, abs=0.05)
    busy, billed = judge.utilisation()
    assert 4 * one < busy < 8 * one  # four 10k-token prefills (two batched) and their decode steps
    assert busy / billed < 0.05  # ~1 s of work in ~26 s billed: the keep-alive dominates


def test_a_billed_minimum_per_instance_start_raises_short_instances_to_it() -> None:
    async def one_call(endpoint: Endpoint) -> list[float]:
        judge = _judge(endpoint)
        await judge(_req(0, 10_000))
        return judge.billed_s()

    short = run_loop(one_call(Endpoint(cold_start_s=2.0, idle_s=1.0)))
    assert short == [pytest.approx(2.0 + prefill_s(QWEN7B, H800, 10_000) + 1.0, abs=0.05)]
    assert run_loop(one_call(Endpoint(cold_start_s=2.0, idle_s=1.0, billed_min_s=60.0))) == [60.0]


def test_rows_account_gpu_seconds_and_the_gain_at_equal_cost(tmp_path) -> None:
    path = tmp_path / "srv.json"
    payload = run(argparse.Namespace(**TINY, json=str(path), idle_s=(10.0, 60.0), seeds=(0,)))
    assert json.loads(path.read_text())["rows"] == payload["rows"]
    assert payload["clock"] == "virtual" and payload["seeds"] == [0]
    reserved, *serverless = payload["rows"]
    assert [r["setup"] for r in payload["rows"]] == ["reserved", "serverless", "serverless", "serverless"]
    assert [r["gen_gpus"] for r in payload["rows"]] == [3, 3, 3, 4]  # same fleet twice, then all 4
    assert [r["judge"] for r in serverless] == ["keep-alive 10 s", "keep-alive 60 s", "keep-alive 10 s"]
    assert all(r["scored"] == 16 for r in payload["rows"])  # every member of 2 groups of 8 judged
    # reserved: all 4 GPUs for the step, the judge billed its whole GPU
    assert reserved["gpu_s_per_step"] == pytest.approx(4 * reserved["step_s"])
    assert reserved["judge_billed_s"] == pytest.approx(reserved["step_s"])
    assert reserved["gain_per_gpu_s"] == reserved["ci_low"] == reserved["ci_high"] == 1.0
    for r in serverless:
        assert r["gpu_s_per_step"] == pytest.approx(r["gen_gpus"] * r["step_s"] + r["judge_billed_s"])
        assert r["gain_per_gpu_s"] == pytest.approx(reserved["gpu_s_per_step"] / r["gpu_s_per_step"])
        assert r["reward_utilization"] == pytest.approx(r["judge_busy_s"] / r["judge_billed_s"])
        idle = float(r["judge"].split()[1])
        assert r["judge_billed_s"] >= r["judge_instances"] * (0.5 + idle)  # cold start + keep-alive each
        assert r["ci_low"] <= r["gain_per_gpu_s"] <= r["ci_high"]
    assert serverless[1]["judge_billed_s"] > serverless[0]["judge_billed_s"]  # the longer keep-alive costs
    assert (tmp_path / "srv.png").stat().st_size > 0


def test_a_long_billed_minimum_makes_serverless_cost_more_per_step() -> None:
    args = argparse.Namespace(**TINY, json=None, idle_s=(10.0,), billed_min_s=2000.0, seeds=(0, 1))
    reserved, same_fleet, _ = run(args)["rows"]
    assert same_fleet["judge_billed_s"] >= 2000.0 > reserved["judge_billed_s"]
    assert same_fleet["reward_utilization"] < 0.01 < reserved["reward_utilization"]
    assert same_fleet["ci_high"] < 1.0  # fewer steps per GPU-second than reserving the judge's GPU


def test_quick_is_the_full_workload_on_fewer_groups_and_seeds() -> None:
    shape = ("swe_turns", "swe_obs_tokens", "cot_tokens", "judge_tokens", "idle_s", "cold_start_s")
    assert all(getattr(QUICK, k) == getattr(FULL, k) for k in shape)
    assert QUICK.groups < FULL.groups and len(QUICK.seeds) == 3 and len(FULL.seeds) >= 5


def test_reserved_gpus_must_leave_some_to_generate() -> None:
    with pytest.raises(SystemExit, match="reward-gpus"):
        run(argparse.Namespace(quick=False, json=None, gpus=2, reward_gpus=2))
