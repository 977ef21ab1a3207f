"""`vs-trl`'s rollart side end to end: the quickstart task on the tiny model through `Experiment` on local
Ray, shaped as TRL's run is (TRL's side is in tests/unit/bench/test_vs_trl.py)."""

from dataclasses import replace

import ray

from bench.vs_trl import GROUP_SIZE, MODELS, QUICK, _rollart, row


def test_a_rollart_run_reports_each_steps_phases_tokens_and_reward(tmp_path):
    s = replace(QUICK, steps=2, warmup=1)
    run = _rollart(s, "tiny", "single-turn", "sync", 0, tmp_path)
    assert not ray.is_initialized()  # the Ray the run started is gone with it: the next module starts its own

    prompts, tokens = MODELS["tiny"]
    assert run["startup_s"] > 0 and len(run["steps"]) == 3
    for step in run["steps"]:
        assert 0 < step["rollout_s"] < step["step_s"]
        assert step["train_s"] == step["step_s"] - step["rollout_s"]
        # every step trains prompts x G completions of at most `tokens` tokens
        assert prompts * GROUP_SIZE <= step["tokens"] <= prompts * GROUP_SIZE * tokens
        assert 0.0 <= step["reward_mean"] <= 1.0
    r = row("rollart", "sync", "tiny", "single-turn", run, s)
    assert r["steps"] == 2 and r["ci_low"] <= r["step_s"] <= r["ci_high"] and r["gen_tokens_per_s"] > 0
