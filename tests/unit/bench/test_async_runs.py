import argparse
from dataclasses import replace

import pytest

from bench.async_runs import (
    LatencyEnvs,
    RunSettings,
    add_run_arguments,
    bias_summary,
    experiment_data,
    median_run,
    summarize_steps,
    throughput_se,
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


def test_median_run_is_an_actual_run():
    runs = [{"step_s": 3.0, "id": "a"}, {"step_s": 1.0, "id": "b"}, {"step_s": 2.0, "id": "c"}]
    assert median_run(runs)["id"] == "c"
    assert median_run(runs[:1])["id"] == "a"


def test_throughput_se_pools_every_step_of_every_round():
    def run(*steps: tuple[int, float]) -> dict:
        return {"steps": [{"tokens": t, "step_s": s} for t, s in steps]}

    # per-step throughputs 100, 200 (round 1) and 300 (round 2): stdev 100, n 3 -> 100 / √3
    assert throughput_se([run((100, 1.0), (400, 2.0)), run((300, 1.0))]) == pytest.approx(100 / 3**0.5)
    assert throughput_se([run((100, 1.0))]) == 0.0  # one step: no spread to measure


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
