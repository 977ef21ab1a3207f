"""The shared rollout step: real control plane, modelled envs and devices, on the simulated clock."""

import pytest

from bench.clock import run
from bench.harness import (
    Workload,
    WorkloadEnv,
    _MemberNames,
    chat_format,
    filler,
    modelled_slots,
    rollout_step,
)
from engine.devices import decode_step_s, get_device, get_model, prefill_s


def test_members_are_named_in_launch_order_then_refills() -> None:
    names = _MemberNames(groups=2, redundancy=1)
    assert [names.next(2) for _ in range(7)] == [
        "g0.m0",
        "g0.m1",
        "g0.m2",
        "g1.m0",
        "g1.m1",
        "g1.m2",
        "refill1",
    ]


async def test_workload_env_plays_its_turns_and_may_die() -> None:
    w = Workload("t", "prefill-heavy", (3, 3), 10, (1, 1), fail_rate=0.0)
    env = WorkloadEnv(w, "obs", salt=1)
    await env.reset(seed=5)
    steps = [await env.step("a") for _ in range(3)]
    assert [s.done for s in steps] == [False, False, True] and steps[-1].reward == 1.0
    dying = WorkloadEnv(Workload("t", "prefill-heavy", (4, 4), 10, (1, 1), fail_rate=1.0), "obs", salt=2)
    await dying.reset(seed=5)
    with pytest.raises(RuntimeError, match="sandbox died"):
        for _ in range(4):
            await dying.step("a")


def test_filler_has_about_the_asked_tokens() -> None:
    n = len(chat_format()._enc(filler(500)))
    assert 450 <= n <= 550


def test_one_step_waits_env_and_device_time_exactly() -> None:
    # One group of 2 on one H800: 3 turns, every reset/step sleeps exactly 1.0 s, 8 tokens per turn.
    w = [Workload("t", "prefill-heavy", (3, 3), 50, (8, 8), group_size=2, env_latency=(1.0, 0.0))]

    async def step():
        slots = modelled_slots("qwen2.5-7b", {"H800": 1}, w, unit_s=1.0, capacity=8)
        return await rollout_step(w, slots, groups=1, unit_s=1.0), slots[0].target.stats()

    result, stats = run(step())
    assert result.counts["groups_complete"] == 1 and len(result.trajectories) == 2
    assert result.proxy["requests"] == 6
    # Both members run in lockstep: 4 env sleeps + 3 turns, each a prefill and 8 decode steps of 2 sequences.
    model, h800 = get_model("qwen2.5-7b"), get_device("H800")
    assert stats["generated_tokens"] == 48
    device = stats["busy_s"]
    assert device > 3 * 8 * decode_step_s(model, h800, 0, seqs=2) + prefill_s(model, h800, 100)
    assert result.modelled_s >= 4.0 + device * 0.99
    assert result.modelled_s <= 4.0 + device + 0.1  # pacing granularity: 10 ms per engine wait
