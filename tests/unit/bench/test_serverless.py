"""R3 on a tiny step, and the modelled scale-to-zero endpoint's billing."""

import argparse
import asyncio

import pytest

from bench.clock import run as run_loop
from bench.serverless import QUICK, ServerlessJudge, run
from engine.backends.modelled import ModelledBackend
from engine.devices import get_device, get_model, prefill_s
from engine.types import GenRequest, SamplingParams

QWEN7B, H800 = get_model("qwen2.5-7b"), get_device("H800")


def _req(i: int, tokens: int) -> GenRequest:
    return GenRequest(f"j{i}", [1] * tokens, SamplingParams(max_tokens=1))


def test_endpoint_cold_starts_reuses_warm_instances_and_bills_active_time() -> None:
    s = QUICK.__class__(cold_start_s=2.0, idle_s=5.0, per_instance=2)

    async def scenario() -> tuple[ServerlessJudge, list[float]]:
        judge = ServerlessJudge(
            lambda: ModelledBackend(QWEN7B, H800, time_scale=1.0, min_sleep_s=0.0), s, 1.0
        )
        loop = asyncio.get_running_loop()
        ends = []

        async def call(i: int) -> None:
            await judge(_req(i, 10_000))
            ends.append(loop.time())

        await asyncio.gather(call(0), call(1), call(2))  # 2 fit one instance, the 3rd starts another
        await asyncio.sleep(1.0)
        await call(3)  # warm: no cold start
        await asyncio.sleep(10.0)  # both idle past idle_s: released
        await call(4)  # scaled to zero: a cold start again
        return judge, ends

    judge, ends = run_loop(scenario())
    one = prefill_s(QWEN7B, H800, 10_000)  # 0.154 s: a call is a 10k-token prefill and one decode step
    assert judge.cold_starts == 3
    assert ends[3] - ends[2] == pytest.approx(1.0 + one, abs=0.05)  # served at once by a warm instance
    busy, billed = judge.utilisation()
    assert billed == pytest.approx(3 * 2.0 + (busy), rel=0.1)  # cold starts + active time, not idle time
    assert 0 < busy / billed < 1


def test_serverless_beats_reserved_on_utilisation_and_step_time(tmp_path) -> None:
    args = argparse.Namespace(
        quick=False, json=str(tmp_path / "srv.json"), gpus=4, reward_gpus=1, groups=4, swe_turns=(6, 10),
        swe_obs_tokens=1000, cot_tokens=(512, 2048), cold_start_s=0.5,
    )  # fmt: skip
    payload = run(args)
    reserved, serverless = payload["rows"]
    assert (reserved["setup"], serverless["setup"]) == ("reserved", "serverless")
    assert (reserved["gen_gpus"], serverless["gen_gpus"]) == (3, 4)
    assert reserved["scored"] == serverless["scored"] == 32  # every member of 4 groups of 8 judged
    assert serverless["reward_utilization"] > 2 * reserved["reward_utilization"]
    assert serverless["rollout_s"] < reserved["rollout_s"]
    assert (tmp_path / "srv.png").stat().st_size > 0


def test_reserved_gpus_must_leave_some_to_generate() -> None:
    with pytest.raises(SystemExit, match="reward-gpus"):
        run(argparse.Namespace(quick=False, json=None, gpus=2, reward_gpus=2))
