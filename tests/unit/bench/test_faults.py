"""`bench faults` without Ray: its settings, run order, rows and JSON on runs faked with known numbers."""

import argparse
import json
from dataclasses import replace

import pytest

from bench import faults
from bench.async_runs import SEED_STRIDE
from bench.faults import FULL, QUICK, Settings, add_arguments, requirements_met, run_plan, summarize
from bench.report import pick_settings
from tests.unit.bench.cli import bench_parser


def parser() -> argparse.ArgumentParser:
    return bench_parser(add_arguments)


def test_full_runs_five_seeds_quick_three_of_the_same_workload_scaled_down():
    assert pick_settings(parser().parse_args([]), FULL, QUICK) == FULL
    assert pick_settings(parser().parse_args(["--quick"]), FULL, QUICK) == QUICK
    assert (FULL.rounds, QUICK.rounds) == (5, 3)
    assert QUICK.steps < FULL.steps and QUICK.batch_groups < FULL.batch_groups
    assert QUICK.kill_after < FULL.kill_after  # a shorter run: gen-0 dies sooner, inside its one step
    # the same G, turns, faults and timings; one batch of envs in both
    assert QUICK.rates == (FULL.rates[0], FULL.rates[-1]) == (0.0, 0.2)  # the rates between are left out
    scaled = {"steps": FULL.steps, "batch_groups": FULL.batch_groups, "concurrency": FULL.concurrency,
              "kill_after": FULL.kill_after}  # fmt: skip
    same = replace(QUICK, **scaled, rates=FULL.rates)
    assert replace(same, rounds=FULL.rounds) == FULL
    assert FULL.concurrency == FULL.batch_groups * FULL.group_size
    assert QUICK.concurrency == QUICK.batch_groups * QUICK.group_size
    got = pick_settings(
        parser().parse_args(["--quick", "--steps", "2", "--rounds", "4", "--seed", "3"]), FULL, QUICK
    )
    assert (got.steps, got.rounds, got.seeds) == (2, 4, [3 + k * SEED_STRIDE for k in range(4)])


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--rounds", "0"], ["--seed", "-1"], ["--steps", "x"]])
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
    assert "error: argument" in capsys.readouterr().err


def fake_run(s: Settings, redundancy: int, rate: float, **kw: object) -> dict:
    """A run that did all its steps; step time grows with the rate and shrinks with redundancy."""
    return {
        "redundancy": redundancy,
        "failure_rate": rate,
        "seed": s.seed,
        "steps_done": s.steps,
        "steps_asked": s.steps,
        "step_s": 1.0 + 10 * rate - 0.1 * redundancy + s.seed / SEED_STRIDE / 100,
        "partial_groups_trained": 0,
        "lost": 0,
        **dict.fromkeys(faults.MEDIANS, 1),
        "gen0_restarted": True,
        "error": "",
    } | kw


async def test_every_configuration_runs_once_per_seed_rotated_each_round():
    s = Settings(redundancies=(0, 2), rates=(0.0, 0.2), rounds=3, seed=5)
    calls: list[tuple[int, int, float]] = []

    async def one(s_k: Settings, redundancy: int, rate: float) -> dict:
        calls.append((s_k.seed, redundancy, rate))
        return fake_run(s_k, redundancy, rate)

    out = await run_plan(s, one)
    seeds = [5, 5 + SEED_STRIDE, 5 + 2 * SEED_STRIDE]
    assert s.configs == [(0, 0.0), (0, 0.2), (2, 0.0), (2, 0.2)]
    assert calls[:4] == [(seeds[0], *c) for c in s.configs]
    assert calls[4:8] == [(seeds[1], *c) for c in s.configs[1:] + s.configs[:1]]  # rotated by one
    assert [[r["seed"] for r in rs] for rs in out] == [seeds] * 4  # per configuration, in round order
    assert [(rs[0]["redundancy"], rs[0]["failure_rate"]) for rs in out] == s.configs
    assert all(r["wall_s"] >= 0 for rs in out for r in rs)


def test_a_row_sums_the_requirements_and_takes_medians_with_an_interval_over_seeds():
    s = Settings(steps=4)
    runs = [
        fake_run(replace(s, seed=0), 2, 0.2, step_s=3.0, retries=10, dropped=4),
        fake_run(replace(s, seed=1), 2, 0.2, step_s=1.0, retries=20, dropped=2, lost=1),
        fake_run(replace(s, seed=2), 2, 0.2, step_s=2.0, retries=30, dropped=6, gen0_restarted=False),
        fake_run(replace(s, seed=3), 2, 0.2, step_s=6.0, retries=40, dropped=8, partial_groups_trained=2),
        fake_run(replace(s, seed=4), 2, 0.2, step_s=5.0, steps_done=3, error="TimeoutError: get_batch"),
    ]
    row = summarize(runs)
    assert (row["redundancy"], row["failure_rate"], row["runs"]) == (2, 0.2, 5)
    assert (row["steps_done"], row["steps_asked"], row["lost"], row["partial_groups_trained"]) == (
        19,
        20,
        1,
        2,
    )
    # five run-level step times: a resample's median is the smallest one about 6% of the time (> 2.5%)
    assert (row["step_s"], row["ci_low"], row["ci_high"]) == (3.0, 1.0, 6.0)
    assert (row["retries"], row["dropped"]) == (20, 4)  # medians per run (seed 4 retried 1, dropped 1)
    assert row["gen0_restarts"] == 4 and row["errors"] == ["seed 4: TimeoutError: get_batch"]
    assert not requirements_met([row])
    stuck = summarize([fake_run(s, 0, 0.0, step_s=None, steps_done=0)])
    assert (stuck["step_s"], stuck["ci_low"], stuck["ci_high"]) == (None, None, None)


@pytest.mark.parametrize(
    ("broken", "met"),
    [({}, True), ({"lost": 1}, False), ({"partial_groups_trained": 1}, False), ({"steps_done": 3}, False)],
)
def test_requirements_hold_only_when_every_run_met_them(broken, met):
    s = Settings(steps=4)
    rows = [summarize([fake_run(s, 0, 0.0), fake_run(s, 0, 0.0, **broken)]), summarize([fake_run(s, 2, 0.0)])]
    assert requirements_met(rows) is met


def fake_measure(**broken: object):
    async def measure(s: Settings) -> list[list[dict]]:
        async def one(s_k: Settings, redundancy: int, rate: float) -> dict:
            return fake_run(s_k, redundancy, rate, **(broken if (redundancy, rate) == (2, 0.2) else {}))

        return await run_plan(s, one)

    return measure


def test_the_json_carries_clock_seeds_and_medians_with_intervals(monkeypatch, tmp_path):
    monkeypatch.setattr(faults, "_measure", fake_measure())
    out = tmp_path / "faults.json"
    payload = faults.run(parser().parse_args(["--quick", "--json", str(out)]))
    assert payload["clock"] == "wall" and payload["seeds"] == [0, SEED_STRIDE, 2 * SEED_STRIDE]
    rows = payload["rows"]
    assert [(r["redundancy"], r["failure_rate"]) for r in rows] == QUICK.configs
    assert all(r["runs"] == 3 and r["steps_done"] == r["steps_asked"] == 3 * QUICK.steps for r in rows)
    assert all(r["ci_low"] <= r["step_s"] <= r["ci_high"] and r["ci_low"] < r["ci_high"] for r in rows)
    assert [r["step_s"] for r in rows] == pytest.approx([1.01, 3.01, 0.81, 2.81])  # the middle seed
    assert payload["requirements_met"] is True and "in every run: MET" in payload["note"]
    assert [len(rs) for rs in payload["runs"]] == [3] * 4 and payload["config"]["rounds"] == 3
    assert json.loads(out.read_text()) == payload
    assert (tmp_path / "faults.png").stat().st_size > 0


def test_a_lost_member_fails_the_benchmark(monkeypatch, tmp_path):
    monkeypatch.setattr(faults, "_measure", fake_measure(lost=1))
    with pytest.raises(SystemExit, match="requirement was not met"):
        faults.run(parser().parse_args(["--quick", "--json", str(tmp_path / "f.json")]))
    payload = json.loads((tmp_path / "f.json").read_text())
    assert payload["requirements_met"] is False and [r["lost"] for r in payload["rows"]] == [0] * 3 + [3]


def test_registered_with_the_cli():
    from flows.cli import _parser

    args = _parser().parse_args(["bench", "faults", "--quick", "--rounds", "2"])
    assert (args.name, args.quick, args.rounds, args.steps) == ("faults", True, 2, None)
