import argparse
import asyncio

import pytest

from bench.trl_peer import PeerRun, dataset_rows, env_reward, train
from bench.vs_trl import (
    FULL,
    QUICK,
    ROLLART_MODES,
    _task_args,
    add_arguments,
    headline,
    model_dir,
    ratios,
    rollart_modes,
    row,
)


def _steps(seconds: list[float], rewards: list[float | None]) -> list[dict]:
    return [
        {"step_s": t, "rollout_s": t / 4, "train_s": 3 * t / 4, "tokens": 100, "reward_mean": r}
        for t, r in zip(seconds, rewards, strict=True)
    ]


def test_a_row_measures_the_steps_after_warmup_and_when_the_reward_level_was_first_reached():
    s = FULL.__class__(steps=3, warmup=1, reward_level=0.3)
    run = {"startup_s": 7.0, "warm_start": True, "steps": _steps([9.0, 1.0, 2.0, 3.0], [0.0, 0.1, 0.4, 0.2])}
    r = row("rollart", "sync", "tiny", "single-turn", run, s)
    assert r["step_s"] == 2.0 and r["ci_low"] <= 2.0 <= r["ci_high"]
    assert r["gen_tokens_per_s"] == pytest.approx(300 / 6.0)  # warm-up step left out
    assert (r["rollout_s"], r["train_s"]) == (0.5, 1.5)
    assert r["time_to_reward_s"] == 12.0  # the clock runs from the first step, warm-up included
    assert (r["reward_first"], r["reward_last"], r["steps"], r["startup_s"]) == (0.0, 0.2, 3, 7.0)
    assert r["warm_start"] is True
    trl = {"startup_s": 1.0, "warm_start": False, "steps": _steps([1, 1, 1, 1], [0] * 4)}
    never = row("trl", "grpo", "tiny", "single-turn", trl, s)
    assert never["time_to_reward_s"] is None


def test_ratios_are_each_rollart_mode_over_trl_in_the_same_model_and_setting():
    base = {"model": "tiny", "setting": "s"}
    rows = [
        base | {"system": "trl", "mode": "grpo", "alpha": 0, "gen_tokens_per_s": 100.0},
        base | {"system": "rollart", "mode": "sync", "alpha": 0, "gen_tokens_per_s": 50.0},
        base | {"system": "rollart", "mode": "rollart", "alpha": 1, "gen_tokens_per_s": 250.0},
        base | {"system": "rollart", "mode": "rollart", "alpha": 2, "gen_tokens_per_s": 300.0},
    ]
    vs = ratios(rows)
    assert [(r["mode"], r["alpha"], r["vs_trl"]) for r in vs] == [
        ("sync", 0, 0.5),
        ("rollart", 1, 2.5),
        ("rollart", 2, 3.0),
    ]
    # the headline names each rollart mode with its bound
    assert [h["metric"] for h in headline({"vs_trl": vs})] == [
        "gen tokens/s, rollart sync / TRL (tiny, s)",
        "gen tokens/s, rollart rollart α=1 / TRL (tiny, s)",
        "gen tokens/s, rollart rollart α=2 / TRL (tiny, s)",
    ]


def test_waiting_envs_add_rollart_at_alpha_2_where_rollout_is_the_longer_phase():
    assert rollart_modes("single-turn") == ROLLART_MODES == (("sync", 0), ("rollart", 1))
    assert rollart_modes("waiting-env") == (("sync", 0), ("rollart", 1), ("rollart", 2))


def test_options_quick_and_refusals(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--models", "tiny", "--settings", "waiting-env"]).models == ("tiny",)
    assert QUICK.models == ("tiny",) and QUICK.settings == FULL.settings and QUICK.steps < FULL.steps
    for argv in (["--models", "gpt5"], ["--settings", "multi"], ["--steps", "1"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    assert "error: argument" in capsys.readouterr().err


def _peer(tmp_path, wait_ms=None, steps=2) -> PeerRun:
    return PeerRun(
        model_dir=model_dir("tiny", tmp_path), env_args=_task_args(), prompts=2, group_size=4,
        completion_tokens=8, lr=1e-5, temperature=0.7, threads=1, steps=steps, seed=0, wait_ms=wait_ms,
    )  # fmt: skip


def test_trls_prompts_are_the_envs_first_turn_and_its_reward_is_the_envs_score(tmp_path):
    peer = _peer(tmp_path)
    rows = dataset_rows(peer)
    assert len(rows) == 4 and len({r["problem"] for r in rows}) == 4
    system, user = rows[0]["prompt"]
    assert system["role"] == "system" and "The answer is N." in system["content"]
    assert user["role"] == "user" and user["content"].endswith(system["content"].split(". ", 1)[1])
    from engine.envs.registry import make_env

    env = make_env("reasoning_gym", **peer.env_args)
    question = asyncio.run(env.reset(rows[0]["problem"]))
    right = env.format_answer(str(env._entry["answer"]))
    completions = [[{"role": "assistant", "content": right}], [{"role": "assistant", "content": "no idea"}]]
    got = asyncio.run(env_reward(peer)(completions=completions, problem=[rows[0]["problem"]] * 2))
    assert question == user["content"] and got == [1.0, 0.0]


def test_in_the_waiting_setting_each_reward_env_waits_and_they_wait_at_once(tmp_path):
    peer = _peer(tmp_path, wait_ms=(50.0, 0.0))
    reward = env_reward(peer)
    completions = [[{"role": "assistant", "content": "7"}]] * 8

    async def timed() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await reward(completions=completions, problem=[0] * 8)
        return loop.time() - t0

    from bench import clock

    assert clock.run(timed()) == pytest.approx(0.1)  # reset + step, 50 ms each, all 8 envs at once


def test_trl_trains_the_tiny_model_and_reports_each_steps_phases(tmp_path, monkeypatch):
    """At its own thread count, also after a vLLM engine in this process (as in `bench all`) made
    torch.set_num_threads a no-op."""
    import torch

    from bench import trl_peer

    threads = torch.get_num_threads()
    seen = []  # the thread count while TRL scores its completions
    real = trl_peer.env_reward

    def spy(run):
        inner = real(run)

        async def reward(**kw):
            seen.append(torch.get_num_threads())
            return await inner(**kw)

        return reward

    monkeypatch.setattr(trl_peer, "env_reward", spy)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # what vLLM's CPU worker leaves
    torch._C.set_num_threads(2)
    try:
        out = train(_peer(tmp_path, steps=2), str(tmp_path / "trl"))  # at 1 thread
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2  # the caller's setting is back
    finally:
        torch._C.set_num_threads(threads)
    assert out["startup_s"] > 0 and len(out["steps"]) == 2 and out["warm_start"] is False
    for step in out["steps"]:
        assert (
            0 < step["rollout_s"] < step["step_s"] and step["train_s"] == step["step_s"] - step["rollout_s"]
        )
        assert 2 * 4 <= step["tokens"] <= 2 * 4 * 8  # prompts x G completions of at most 8 tokens
        assert 0.0 <= step["reward_mean"] <= 1.0
