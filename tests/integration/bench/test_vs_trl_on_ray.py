"""`vs-trl`'s rollart side end to end: the quickstart task on the tiny model through `Experiment` on local
Ray, shaped as TRL's run is (TRL's side is in tests/unit/bench/test_vs_trl.py)."""

from dataclasses import replace

import ray

from bench.vs_trl import GROUP_SIZE, MODELS, QUICK, ROLLART_MODES, _rollart_runs, row


def test_rollart_runs_share_one_ray_and_report_each_steps_phases_tokens_and_reward(tmp_path):
    s = replace(QUICK, settings=("single-turn",), steps=1, warmup=0)  # a run's first step: vLLM's warm-up too
    runs = _rollart_runs(s, "tiny", tmp_path)
    assert not ray.is_initialized()  # the runs' Ray is gone with them: the next module starts its own

    # one run per mode; the first starts every process, the second rebuilds the first one's
    assert list(runs) == [("single-turn", mode, alpha) for mode, alpha in ROLLART_MODES]
    assert [r["warm_start"] for r in runs.values()] == [False, True]
    prompts, tokens = MODELS["tiny"]
    for (_, mode, alpha), run in runs.items():
        assert run["startup_s"] > 0 and len(run["steps"]) == 1
        for step in run["steps"]:
            assert 0 < step["rollout_s"] < step["step_s"]
            assert step["train_s"] == step["step_s"] - step["rollout_s"]
            # every step trains prompts x G completions of at most `tokens` tokens
            assert prompts * GROUP_SIZE <= step["tokens"] <= prompts * GROUP_SIZE * tokens
            assert 0.0 <= step["reward_mean"] <= 1.0
        r = row("rollart", mode, "tiny", "single-turn", run, s, alpha)
        assert r["alpha"] == alpha and r["steps"] == 1 and r["gen_tokens_per_s"] > 0
        assert r["ci_low"] <= r["step_s"] <= r["ci_high"]
