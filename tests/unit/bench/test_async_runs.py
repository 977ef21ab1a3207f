import argparse
from dataclasses import replace

import pytest

from bench.async_runs import (
    MEDIAN_KEYS,
    SEED_STRIDE,
    LatencyEnvs,
    RunSettings,
    add_run_arguments,
    bias_summary,
    experiment_data,
    round_seeds,
    run_all,
    run_order,
    summarize_runs,
    summarize_steps,
)
from bench.report import pick_settings
from engine.config import load_config
from engine.envs.latency import LatencyModel
from engine.rollout.env_manager import TurnLimits
from engine.rollout.scheduler import TaskSpec

FULL = RunSettings(batch_groups=4, steps=5, rounds=2)
QUICK = RunSettings(batch_groups=4, steps=2, rounds=1)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    add_run_arguments(p, FULL, QUICK)
    return p


def test_quick_picks_the_base_and_explicit_options_override_it():
    assert pick_settings(parser().parse_args([]), FULL, QUICK) == FULL
    assert pick_settings(parser().parse_args(["--quick"]), FULL, QUICK) == QUICK
    got = pick_settings(
        parser().parse_args(["--quick", "--env-ms", "20", "--store", "ray", "--concurrency", "32"]),
        FULL,
        QUICK,
    )
    assert got == RunSettings(batch_groups=4, steps=2, rounds=1, env_ms=20.0, store="ray", concurrency=32)
    assert got.envs == 32 and QUICK.envs == 4 * 4  # default: one batch of B·G envs


@pytest.mark.parametrize(
    "argv",
    [["--group-size", "1"], ["--env-ms", "-1"], ["--steps", "0"], ["--store", "s3"], ["--size", "huge"]],
)
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
    assert "error: argument" in capsys.readouterr().err


def test_experiment_data_is_a_valid_config_with_one_batch_of_envs():
    s = RunSettings(group_size=4, batch_groups=3, turns=5, max_tokens=6, warmup=2, steps=3, store="ray")
    cfg = load_config(data=experiment_data(s, "sync+", 0, "/m", "/runs"))
    assert cfg.name == "bench-syncplus-a0" and cfg.model.path == "/m"
    assert cfg.rollout.concurrency == 12 and cfg.rollout.redundancy == 0
    assert (cfg.train.mode, cfg.train.alpha, cfg.train.batch_groups, cfg.train.steps) == ("sync+", 0, 3, 5)
    task = cfg.tasks[0]
    assert (task.env, task.env_args, task.max_turns, task.max_tokens) == ("synthetic", {"turns": 5}, 5, 6)
    assert (cfg.backends.generation, cfg.backends.weight_store) == ("hf", "ray")
    mixed = load_config(data=experiment_data(replace(s, turns=1, max_turns=10), "rollart", 1, "/m", "/runs"))
    assert mixed.tasks[0].env_args == {"turns": 1, "max_turns": 10} and mixed.tasks[0].max_turns == 10


async def test_env_k_sleeps_the_draws_of_seed_plus_k():
    spec = TaskSpec("synthetic", "synthetic", {"turns": 2}, 1.0, 4, TurnLimits(2, 4, 512), "prefill-heavy")
    factory = LatencyEnvs(mu_ms=3.0, sigma_ms=1.0, seed=7)
    envs = [factory(spec) for _ in range(3)]
    for k, env in enumerate(envs):
        assert env.time_scale == 1e-3 and env.step_model == LatencyModel(3.0, 1.0, seed=7 + k, stream=1)
        await env.reset(0)
        first, last = await env.step("a"), await env.step("b")
        assert [first.info["latency"], last.info["latency"]] == env.step_model.draws(2)
        assert last.done and last.reward == 1.0


def test_summarize_steps_by_hand():
    first = {"step_s": 2.0, "wait_batch_s": 1.0, "train_s": 0.5, "tokens": 100, "push_s": 0.1}
    second = {"step_s": 3.0, "wait_batch_s": 2.0, "train_s": 0.7, "tokens": 200, "push_s": 0.3}
    steps = [
        first | {"staleness_max": 0},
        second | {"staleness_max": 1, "pull_s": 0.2, "exposed_pull_s": 0.05},
    ]
    got = summarize_steps(steps)
    assert got["step_s"] == 2.5 and got["tokens_per_s"] == 300 / 5.0
    assert got["wait_batch_s"] == 1.5 and got["train_s"] == pytest.approx(0.6)
    assert got["sync_s"] == pytest.approx((0.5 + 0.3) / 2)  # neither waiting nor training
    assert got["push_s"] == pytest.approx(0.2)
    assert got["pull_s"] == 0.2 and got["exposed_pull_s"] == 0.05  # only the step that pulled
    assert got["staleness_max"] == 1


def test_each_round_has_its_own_seed_far_enough_apart_that_no_env_draw_is_shared():
    assert round_seeds(RunSettings(seed=7, rounds=3)) == [7, 7 + SEED_STRIDE, 7 + 2 * SEED_STRIDE]
    s = RunSettings()  # a run builds one env per trajectory: far fewer than the stride
    assert (s.warmup + s.steps + 2) * s.batch_groups * s.group_size + s.envs < SEED_STRIDE


def test_run_order_rotates_the_configurations_every_round():
    assert run_order(2, 3) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    order = run_order(5, 5)
    rounds = [[i for r, i in order if r == k] for k in range(5)]
    assert all(sorted(r) == [0, 1, 2, 3, 4] for r in rounds)  # every configuration once a round
    assert all(sorted(r[pos] for r in rounds) == [0, 1, 2, 3, 4] for pos in range(5))  # ... in every slot


def test_run_all_runs_every_configuration_once_per_round_on_that_rounds_seed(monkeypatch, tmp_path):
    import engine.models.tiny

    calls: list[tuple[int, str]] = []
    pools: set[int] = set()

    def fake_run(s: RunSettings, mode: str, alpha: int, model_dir: str, run_root: str, warm: object) -> dict:
        calls.append((s.seed, mode))
        pools.add(id(warm))  # one WarmWorkers: each run takes the last one's processes
        return {
            "mode": mode,
            "alpha": alpha,
            "seed": s.seed,
            "step_s": 1.0,
            "tokens_per_s": 1.0,
            "aborted": 0,
        }

    monkeypatch.setattr(engine.models.tiny, "init_model", lambda size, path, seed: tmp_path)
    monkeypatch.setattr("bench.async_runs._run_one", fake_run)
    out = run_all(RunSettings(seed=1, rounds=3), [("sync", 0), ("rollart", 1)])
    seeds = [1, 1 + SEED_STRIDE, 1 + 2 * SEED_STRIDE]
    assert calls == [
        (seeds[0], "sync"),
        (seeds[0], "rollart"),
        (seeds[1], "rollart"),  # rotated: rollart goes first in round 1
        (seeds[1], "sync"),
        (seeds[2], "sync"),
        (seeds[2], "rollart"),
    ]
    assert [[r["seed"] for r in rs] for rs in out] == [seeds, seeds]  # per entry, in round order
    assert [[r["mode"] for r in rs] for rs in out] == [["sync"] * 3, ["rollart"] * 3]
    assert len(pools) == 1


def run_with(step_s: float, tokens_per_s: float, **kw: float) -> dict:
    """A run's fields (every `MEDIAN_KEYS` one), 50 steps of it all alike."""
    fields = dict.fromkeys(MEDIAN_KEYS, 1.0) | {"step_s": step_s, "tokens_per_s": tokens_per_s} | kw
    steps = [{"step_s": step_s, "tokens": tokens_per_s * step_s}] * 50
    return {"mode": "rollart", "alpha": 1, "staleness_max": 0, **fields, "steps": steps}


def test_summarize_runs_takes_honest_medians_over_runs_with_intervals_over_run_level_values():
    runs = [
        run_with(3.0, 100.0, sync_s=0.4, aborted=2, staleness_max=1),
        run_with(1.0, 300.0, sync_s=0.1, aborted=0),
        run_with(2.0, 150.0, sync_s=0.2, aborted=1),
        run_with(4.0, 75.0, sync_s=0.3, aborted=5),
    ]
    got = summarize_runs(runs)
    assert (got["mode"], got["alpha"], got["runs"]) == ("rollart", 1, 4)
    # four runs: the mean of the middle two, not the slower (or faster) of them
    assert got["step_s"] == 2.5 and got["tokens_per_s"] == 125.0
    assert got["sync_s"] == pytest.approx(0.25) and got["aborted"] == 1.5
    assert got["staleness_max"] == 1  # the largest
    # bootstrap over 4 run-level values: a resample's median is the smallest (or largest) one about 5%
    # of the time, so the 95% interval reaches from the smallest run to the largest (over the 200
    # steps pooled, it would shrink to about the middle runs)
    assert (got["step_s_ci_low"], got["step_s_ci_high"]) == (1.0, 4.0)
    assert (got["tokens_per_s_ci_low"], got["tokens_per_s_ci_high"]) == (75.0, 300.0)
    three = summarize_runs(runs[1:])
    assert (three["step_s"], three["step_s_ci_low"], three["step_s_ci_high"]) == (2.0, 1.0, 4.0)
    one = summarize_runs(runs[:1])
    assert (one["step_s"], one["step_s_ci_low"], one["step_s_ci_high"]) == (3.0, 3.0, 3.0)  # one run


def test_bias_summary_reads_the_one_tasks_turns_and_the_aborted_share():
    bias = {
        "bias/aborted_token_frac": 0.25,
        "bias/lake/trained_mean_turns": 2.0,
        "bias/lake/started_mean_turns": 3.0,
        "bias/lake/trained_mean_tokens": 9.0,
    }
    assert bias_summary(bias) == {
        "trained_mean_turns": 2.0,
        "started_mean_turns": 3.0,
        "aborted_token_frac": 0.25,
    }
