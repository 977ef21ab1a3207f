import argparse
import dataclasses

import pytest

from bench import report
from bench import time_to_score as tts
from bench import time_to_score_rows as tsr


def run(
    mode: str,
    alpha: int,
    seed: int,
    successes: list[float],
    setting: str = "waiting",
    layout: str = "split",
    step_s: float = 5.0,
    first_s: float | None = None,
) -> dict:
    """A run with a checkpoint every 2 steps of `step_s` seconds each (the first `first_s`, if given, its time
    added to the clock of every checkpoint), scored `successes`."""
    extra = (first_s - step_s) if first_s is not None else 0.0
    points = [
        {
            "step": 2 * (i + 1),
            "train_wall_s": 2 * step_s * (i + 1) + extra,
            "tokens": 100 * (i + 1),
            "success": s,
        }
        for i, s in enumerate(successes)
    ]
    phases = [{"step_s": step_s + extra}] + [{"step_s": step_s}] * (2 * len(successes) - 1)
    return {
        "setting": setting,
        "layout": layout,
        "mode": mode,
        "alpha": alpha,
        "seed": seed,
        "points": points,
        "phases": phases,
    }


def test_the_first_checkpoint_at_or_above_the_target_sets_time_and_tokens():
    row = tsr.time_to_target(run("rollart", 1, 0, [0.1, 0.45, 0.3, 0.6]), target=0.45)
    assert row == {
        "setting": "waiting",
        "layout": "split",
        "mode": "rollart",
        "alpha": 1,
        "seed": 0,
        "target": 0.45,
        "time_to_target_s": 20.0,
        "tokens_to_target": 200,
        "reached": True,
        "steps_to_target": 4,
        "steps": 8,
        "step_s": 5.0,
        "first_step_s": 5.0,
        "later_step_s": 5.0,
        "budget_s": None,
        "final_success": 0.6,
    }
    missed = tsr.time_to_target(run("areal", 2, 1, [0.1, 0.2]), target=0.45)
    assert not missed["reached"] and missed["time_to_target_s"] is None and missed["tokens_to_target"] is None
    assert missed["steps_to_target"] is None


def test_auto_target_is_a_share_of_sync_plus_median_gain_above_the_untrained_model():
    runs = [run("sync+", 0, s, [0.1, f]) for s, f in enumerate([0.4, 0.6, 0.5])] + [
        run("rollart", 1, 0, [0.9])
    ]
    assert tsr.auto_target(runs, before=0.2) == pytest.approx(0.2 + 0.9 * (0.5 - 0.2))
    with pytest.raises(ValueError, match="pass --target"):
        tsr.auto_target([run("rollart", 1, 0, [0.9])], before=0.2)
    # sync+ no better than the untrained model: 0.9 x its final would lie below where every mode starts
    assert tsr.auto_target(runs, before=0.55) == 0.55


def test_summary_gives_the_median_and_range_counting_a_miss_as_never():
    rows = [
        tsr.time_to_target(run("sync+", 0, s, succ), 0.5)
        for s, succ in enumerate([[0.1, 0.2, 0.5], [0.1, 0.5, 0.6], [0.2, 0.3, 0.5]])
    ]
    rows += [
        tsr.time_to_target(run("rollart", 1, s, succ), 0.5)
        for s, succ in enumerate([[0.5], [0.1, 0.5], [0.6]])
    ]
    rows += [tsr.time_to_target(run("areal", 1, s, succ), 0.5) for s, succ in enumerate([[0.5], [0.1]])]
    rows += [
        tsr.time_to_target(run("one-off", 1, s, succ), 0.5)
        for s, succ in enumerate([[0.1, 0.5], [0.1, 0.1, 0.1], [0.5]])
    ]
    by_mode = {o["mode"]: o for o in tsr.summarize(rows)}
    assert by_mode["sync+"] == {
        "setting": "waiting",
        "layout": "split",
        "mode": "sync+",
        "alpha": 0,
        "reached": "3/3",
        "median_s": 30.0,
        "ci_low": 20.0,  # the bootstrap interval of the median of 20, 30, 30
        "ci_high": 30.0,
        "min_s": 20.0,
        "max_s": 30.0,
        "steps_to_target": 6,  # the median of 6, 4, 6
        "step_s": 5.0,
        "later_step_s": 5.0,
        "speedup_vs_sync_plus": 1.0,
        "step_speedup_vs_sync_plus": 1.0,
        "later_step_speedup_vs_sync_plus": 1.0,
    }
    assert by_mode["rollart"]["median_s"] == 10.0 and by_mode["rollart"]["speedup_vs_sync_plus"] == 3.0
    # 2 of 3 got there (10 s, 20 s; one never): the median is the slower of the two, its interval open above
    one_off = by_mode["one-off"]
    assert [one_off[k] for k in ("reached", "median_s", "min_s", "max_s")] == ["2/3", 20, 10, 20]
    assert one_off["ci_low"] == 10.0 and one_off["ci_high"] is None
    assert one_off["speedup_vs_sync_plus"] == 1.5
    # half got there: the median (between 10 s and never) is never, so none is claimed
    assert by_mode["areal"]["reached"] == "1/2" and by_mode["areal"]["median_s"] is None
    assert by_mode["areal"]["ci_high"] is None and by_mode["areal"]["speedup_vs_sync_plus"] is None


def test_the_summary_splits_a_speedup_into_step_time_and_steps_to_the_target():
    # rollart steps twice as fast but needs twice the steps on two of three seeds: 1.0x, not 2.0x, sooner
    rows = [
        tsr.time_to_target(run("sync+", 0, s, succ, step_s=10.0), 0.5)
        for s, succ in enumerate([[0.1, 0.5], [0.5], [0.2, 0.5]])
    ]  # 4, 2, 4 steps: 40, 20, 40 s
    rows += [
        tsr.time_to_target(run("rollart", 1, s, succ, step_s=5.0), 0.5)
        for s, succ in enumerate([[0.1, 0.2, 0.3, 0.5], [0.1, 0.5], [0.1, 0.2, 0.3, 0.6]])
    ]  # 8, 4, 8 steps: 40, 20, 40 s
    by_mode = {o["mode"]: o for o in tsr.summarize(rows)}
    rollart, sync_plus = by_mode["rollart"], by_mode["sync+"]
    assert (sync_plus["steps_to_target"], sync_plus["step_s"]) == (4, 10.0)
    assert (rollart["steps_to_target"], rollart["step_s"]) == (8, 5.0)
    assert rollart["step_speedup_vs_sync_plus"] == 2.0 and rollart["speedup_vs_sync_plus"] == 1.0
    printed = {r["mode"]: r for r in tsr.table(tsr.summarize(rows))}["rollart"]
    assert (printed["steps"], printed["step s"], printed["step ×sync+"], printed["×sync+"]) == (
        "8",
        "5.0",
        "2.00",
        "1.00",
    )


def test_the_first_step_is_split_off_so_the_later_steps_show_the_speedup_a_longer_run_tends_to():
    # both modes spend 30 s on their first step; after it rollart steps in 5 s, sync+ in 10 s
    rows = [
        tsr.time_to_target(run("sync+", 0, s, [0.1, 0.5], step_s=10.0, first_s=30.0), 0.5) for s in (0, 1)
    ]
    rows += [
        tsr.time_to_target(run("rollart", 1, s, [0.1, 0.5], step_s=5.0, first_s=30.0), 0.5) for s in (0, 1)
    ]
    assert [(r["first_step_s"], r["later_step_s"], r["time_to_target_s"]) for r in rows] == [
        (30.0, 10.0, 60.0),
        (30.0, 10.0, 60.0),
        (30.0, 5.0, 45.0),
        (30.0, 5.0, 45.0),
    ]
    rollart = {o["mode"]: o for o in tsr.summarize(rows)}["rollart"]
    assert rollart["later_step_speedup_vs_sync_plus"] == 2.0  # where a longer run's speedup tends
    assert rollart["step_speedup_vs_sync_plus"] == pytest.approx(
        15.0 / 11.25
    )  # over 4 steps, the first included
    assert rollart["speedup_vs_sync_plus"] == pytest.approx(60.0 / 45.0)
    one_step = tsr.time_to_target(
        run("sync+", 0, 0, [0.5], step_s=10.0)
        | {"points": [{"step": 1, "train_wall_s": 10.0, "tokens": 1, "success": 0.5}]},
        0.5,
    )
    assert one_step["later_step_s"] is None


def test_speedup_is_over_sync_plus_in_the_same_setting_and_layout():
    rows = [
        tsr.time_to_target(run("sync+", 0, 0, [0.1, 0.5], layout="split"), 0.5),  # 20 s
        tsr.time_to_target(run("sync+", 0, 0, [0.5], layout="shared"), 0.5),  # 10 s
        tsr.time_to_target(run("rollart", 1, 0, [0.5], layout="split"), 0.5),  # 10 s
        tsr.time_to_target(run("rollart", 1, 0, [0.1, 0.5], layout="shared"), 0.5),  # 20 s
    ]
    speedup = {(o["mode"], o["layout"]): o["speedup_vs_sync_plus"] for o in tsr.summarize(rows)}
    assert speedup[("rollart", "split")] == 2.0 and speedup[("rollart", "shared")] == 0.5


def test_the_split_layout_gives_generation_and_training_a_core_each_in_a_valid_config():
    from engine.config import load_config

    cfg = load_config(tts.FULL.config, tts._layout("split"))
    pools = {p.name: p.cores for p in cfg.resources.pools}
    roles = cfg.resources.roles
    assert pools[roles["actor_gen"].pool] == [0] and pools[roles["actor_train"].pool] == [1]
    assert pools[roles["environment"].pool] == [0]  # the env loops stay off the training core
    shared = load_config(tts.FULL.config, tts._layout("shared"))
    assert all(p.cores is None for p in shared.resources.pools)


def test_runs_are_parsed_with_each_modes_alpha():
    assert tts._runs("sync+,rollart:2,areal,one-off") == (
        ("sync+", 0),
        ("rollart", 2),
        ("areal", 1),
        ("one-off", 1),
    )
    with pytest.raises(argparse.ArgumentTypeError, match="unknown mode 'fast'"):
        tts._runs("sync+,fast:1")
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")  # as the CLI adds it to every benchmark
    tts.add_arguments(parser)
    args = parser.parse_args(["--quick", "--seeds", "3,4", "--target", "0.4", "--layouts", "shared,split"])
    s = report.pick_settings(args, tts.FULL, tts.QUICK)
    assert s.seeds == (3, 4) and s.target == 0.4 and s.runs == (("sync+", 0), ("rollart", 1))
    assert s.layouts == ("shared", "split")
    with pytest.raises(SystemExit):
        parser.parse_args(["--layouts", "spread"])


def test_set_fields_reach_every_runs_config_and_a_bad_one_is_refused_by_name(tmp_path):
    from engine.config import ConfigError

    parser = argparse.ArgumentParser()
    tts.add_arguments(parser)
    args = parser.parse_args(["--set", "train.drop_uniform_groups=true", "--set", "train.lr=0.00002"])
    s = report.pick_settings(args, tts.FULL, tts.QUICK)
    cfg = tts.run_config(s, "waiting", "split", "rollart", 1, 2, tmp_path, 7)
    assert cfg.train.drop_uniform_groups and cfg.train.lr == 0.00002
    assert (cfg.train.mode, cfg.train.alpha, cfg.train.seed) == ("rollart", 1, 2)
    assert cfg.name == "tts-waiting-split-rollart-a1-s2" and cfg.train.steps == 7
    plain = tts.run_config(tts.FULL, "waiting", "split", "rollart", 1, 2, tmp_path, 7)
    assert not plain.train.drop_uniform_groups and plain.train.lr == 0.00001
    bad = report.pick_settings(parser.parse_args(["--set", "train.drop_uniform=true"]), tts.FULL, tts.QUICK)
    with pytest.raises(ConfigError, match="drop_uniform"):
        tts.run_config(bad, "waiting", "split", "rollart", 1, 2, tmp_path, 7)


def test_every_mode_of_a_seed_gets_sync_pluss_wall_time_for_its_steps():
    done = [run("sync+", 0, seed, [0.1, 0.3]) for seed in (0, 1)]  # each ends 20 s in
    done[1]["points"][-1]["train_wall_s"] = 25.0
    done.append(run("sync+", 0, 0, [0.2], setting="plain"))
    done.append(run("rollart", 1, 0, [0.1]))  # another mode sets no budget
    assert tsr.budgets(done) == {
        ("waiting", "split", 0): 20.0,
        ("waiting", "split", 1): 25.0,
        ("plain", "split", 0): 10.0,
    }


def test_a_run_stops_at_its_budget_or_at_its_step_cap_and_without_a_budget_at_its_steps():
    assert not tsr.should_stop(3, 29.9, 12, 30.0) and tsr.should_stop(3, 30.0, 12, 30.0)
    assert tsr.should_stop(12, 5.0, 12, 30.0)  # the cap, before the budget is spent
    assert not tsr.should_stop(3, 1e6, 4, None) and tsr.should_stop(4, 1.0, 4, None)


def test_fixed_steps_is_off_unless_asked_and_the_row_says_how_long_each_run_trained():
    parser = argparse.ArgumentParser()
    tts.add_arguments(parser)
    assert not report.pick_settings(parser.parse_args([]), tts.FULL, tts.QUICK).fixed_steps
    assert report.pick_settings(parser.parse_args(["--fixed-steps"]), tts.FULL, tts.QUICK).fixed_steps
    r = run("rollart", 1, 0, [0.1, 0.2, 0.3]) | {"budget_s": 25.0}
    row = tsr.time_to_target(r, 0.3)
    assert (row["steps"], row["budget_s"], row["time_to_target_s"]) == (6, 25.0, 30.0)


# -- --pool: earlier calls' runs under one target ----------------------------------------------------------
CURVES = {  # seed -> (sync+'s held-out success at steps 2, 4; rollart's at 2, 4, 6)
    0: ([0.3, 0.5], [0.2, 0.4, 0.6]),
    1: ([0.4, 0.7], [0.3, 0.6, 0.7]),
    2: ([0.2, 0.3], [0.2, 0.5, 0.5]),
}


def _call(monkeypatch, tmp_path, argv: list[str], before: float = 0.1) -> dict:
    """One `bench time-to-score` call whose training is replaced by the seeds' CURVES."""
    from tests.unit.bench.cli import bench_parser

    def train(s):
        runs = [
            run(m, a, seed, CURVES[seed][m != "sync+"], step_s=6.0 if m == "sync+" else 4.0)
            for seed in s.seeds
            for m, a in s.runs
        ]
        return runs, before

    monkeypatch.setattr(tts, "_train_and_score", train)
    monkeypatch.setattr(tts, "plot", lambda runs, target, path: "tts.png")
    return tts.run(bench_parser(tts.add_arguments).parse_args(argv))


def test_pooling_one_seed_calls_gives_what_one_call_over_the_seeds_gives(monkeypatch, tmp_path):
    common = ["--runs", "sync+,rollart:1", "--steps", "4"]
    files = []
    for seed in (0, 1, 2):
        files.append(str(tmp_path / f"s{seed}.json"))
        alone = _call(monkeypatch, tmp_path, [*common, "--seeds", str(seed), "--json", files[-1]])
        assert alone["rows"][0]["target"] == pytest.approx(0.1 + 0.9 * (CURVES[seed][0][-1] - 0.1))
    together = _call(monkeypatch, tmp_path, [*common, "--seeds", "0,1,2"])
    pooled = _call(monkeypatch, tmp_path, ["--pool", *files, "--json", str(tmp_path / "pooled.json")])
    # one target from the three sync+ finals (0.5, 0.7, 0.3: median 0.5), not each call's own
    assert pooled["rows"][0]["target"] == pytest.approx(0.1 + 0.9 * 0.4)
    assert (pooled["rows"], pooled["summary"]) == (together["rows"], together["summary"])
    assert pooled["seeds"] == [0, 1, 2] and pooled["config"]["before"] == 0.1
    given = _call(monkeypatch, tmp_path, ["--pool", *files, "--target", "0.55"])
    assert [r["reached"] for r in given["rows"]] == [False, True, True, True, False, False]


def test_pooling_refuses_files_that_do_not_belong_together_and_options_it_cannot_use(monkeypatch, tmp_path):
    def call(seed: int, *extra: str, before: float = 0.1) -> str:
        path = str(tmp_path / f"s{seed}{''.join(extra)}{before}.json")
        _call(
            monkeypatch,
            tmp_path,
            ["--runs", "sync+,rollart:1", "--seeds", str(seed), *extra, "--json", path],
            before,
        )
        return path

    a = call(0)
    with pytest.raises(SystemExit, match=r"config.eval_problems is 60, the first file's 120"):
        _call(monkeypatch, tmp_path, ["--pool", a, call(1, "--eval-problems", "60")])
    with pytest.raises(SystemExit, match=r"config.before is 0.2"):
        _call(monkeypatch, tmp_path, ["--pool", a, call(1, before=0.2)])
    with pytest.raises(SystemExit, match=r"'seed': 0.* is in .*s00.1.json too"):
        _call(monkeypatch, tmp_path, ["--pool", a, call(0, "--steps", "11")])
    with pytest.raises(SystemExit, match="--seeds, --fixed-steps would change nothing"):
        _call(monkeypatch, tmp_path, ["--pool", a, "--seeds", "3", "--fixed-steps"])
    with pytest.raises(SystemExit, match="--wait-ms would change nothing"):  # a zero is given too
        _call(monkeypatch, tmp_path, ["--pool", a, "--wait-ms", "0"])
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(SystemExit, match=r"other\.json: not a `bench time-to-score --json` file"):
        _call(monkeypatch, tmp_path, ["--pool", str(tmp_path / "other.json")])


def test_batches_to_makes_every_run_save_its_batches_and_a_save_left_in_a_temporary_run_is_refused(
    monkeypatch, tmp_path
):
    parser = argparse.ArgumentParser()
    tts.add_arguments(parser)
    s = report.pick_settings(parser.parse_args(["--batches-to", str(tmp_path)]), tts.FULL, tts.QUICK)
    assert tts.run_config(s, "waiting", "split", "rollart", 1, 2, tmp_path, 7).train.save_batches
    assert not tts.run_config(tts.FULL, "waiting", "split", "rollart", 1, 2, tmp_path, 7).train.save_batches
    (tmp_path / "tts-waiting-split-rollart-a1-s2").mkdir()  # an earlier call's: refused before training
    with pytest.raises(SystemExit, match="tts-waiting-split-rollart-a1-s2 exists"):
        tts._train_and_score(dataclasses.replace(s, seeds=(0, 1, 2), runs=(("sync+", 0), ("rollart", 1))))
    with pytest.raises(SystemExit, match="use --batches-to DIR"):
        _call(monkeypatch, tmp_path, ["--set", "train.save_batches=true"])
    files = [str(tmp_path / f"s{seed}.json") for seed in (0, 1)]
    for seed, path in enumerate(files):  # each call kept its batches somewhere else: they still pool
        _call(monkeypatch, tmp_path, ["--seeds", str(seed), "--batches-to", f"b{seed}", "--json", path])
    assert _call(monkeypatch, tmp_path, ["--pool", *files])["config"]["batches_to"] is None
    with pytest.raises(SystemExit, match="--batches-to would change nothing"):
        _call(monkeypatch, tmp_path, ["--pool", *files, "--batches-to", "b2"])
