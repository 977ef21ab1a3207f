"""`rollart bench all`: runs every registered benchmark, one failing does not stop the rest, one report
that opens with every benchmark's headline figures."""

import argparse
import contextlib
import importlib
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import bench
from bench import all as bench_all
from bench.report import headline_row, new_figure, save_figure, write_json

REGISTERED = {n: p for n, p in bench.BENCHMARKS.items() if p != "bench.all"}


def _fake(name: str, fail: bool | BaseException, headline: Any = "rows") -> types.ModuleType:
    """A benchmark module; `headline`: "rows" (one row from the payload), None (no function) or a callable."""
    module = types.ModuleType(name)

    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--size", type=int, default=None)

    def run(args: argparse.Namespace) -> dict:
        if fail:
            raise fail if isinstance(fail, BaseException) else RuntimeError("no GPU here")
        fig, ax = new_figure()
        ax.plot([1, 2], [3, 4])
        payload = {
            "clock": "virtual",
            "seeds": [0, 1],
            "speedup": [1.5, 1.2, 1.8],
            "rows": [{"x": 1, "quick": args.quick, "size": args.size}],
            "note": "Paper: 2x. Ours: 1.5x.",
            "png": save_figure(fig, args.json, "unused.png"),
        }
        write_json(args.json, payload)
        return payload

    module.add_arguments, module.run = add_arguments, run
    if headline == "rows":
        module.headline = lambda p: [headline_row("x speedup", *p["speedup"], paper=(2.0, 2.5), ideal=3.0)]
    elif headline is not None:
        module.headline = headline
    return module


def test_report_has_every_table_and_plot_and_the_failures(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "fake_ok", _fake("fake_ok", fail=False))
    monkeypatch.setitem(sys.modules, "fake_bad", _fake("fake_bad", fail=True))
    monkeypatch.setitem(
        sys.modules, "fake_exits", _fake("fake_exits", fail=SystemExit("a requirement was not met"))
    )
    names = {
        "ok": "fake_ok",
        "bad": "fake_bad",
        "exits": "fake_exits",
        "skipped": "fake_bad",
        "all": "bench.all",
    }
    monkeypatch.setattr(bench, "BENCHMARKS", names)
    out = tmp_path / "report"
    args = argparse.Namespace(quick=True, json=str(tmp_path / "all.json"), out=str(out), skip="skipped")
    summary = bench_all.run(args)
    assert summary["failed"] == ["bad", "exits"] and set(summary["results"]) == {"ok", "bad", "exits"}
    report = (out / "report.md").read_text()
    assert "# rollart benchmarks (quick)" in report
    assert "## ok" in report and "Paper: 2x. Ours: 1.5x." in report
    assert "| x | quick | size |" in report and "| 1 | True | None |" in report
    assert "![ok](ok.png)" in report and (out / "ok.png").stat().st_size > 0
    assert (out / "ok.json").exists()
    assert "## bad" in report and "RuntimeError: no GPU here" in report
    assert "## exits" in report and "SystemExit: a requirement was not met" in report  # e.g. faults' verdict
    assert "## skipped" not in report and "## all" not in report
    assert Path(summary["report"]) == out / "report.md"


def test_unknown_skip_is_refused(tmp_path) -> None:
    import pytest

    with pytest.raises(SystemExit, match="unknown benchmark"):
        bench_all.run(argparse.Namespace(quick=True, json=None, out=str(tmp_path), skip="nope"))


def _run_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modules: dict[str, types.ModuleType]) -> dict:
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, f"fake_{name}", module)
    monkeypatch.setattr(bench, "BENCHMARKS", {n: f"fake_{n}" for n in modules} | {"all": "bench.all"})
    args = argparse.Namespace(quick=True, json=None, out=str(tmp_path / "report"), skip="")
    return bench_all.run(args)


def test_the_headline_table_opens_the_report_with_each_benchmarks_figures(tmp_path, monkeypatch) -> None:
    summary = _run_all(tmp_path, monkeypatch, {"ok": _fake("ok", fail=False), "bad": _fake("bad", fail=True)})
    report = Path(summary["report"]).read_text()
    top = report[: report.index("\n## ")]  # before the first benchmark's section
    assert "| benchmark | metric | ours | 95% interval | paper | ideal | clock | seeds |" in top
    assert "| ok | x speedup | 1.5 | [1.2, 1.8] | 2–2.5 | 3 | virtual | 0, 1 |" in top
    assert "| bad | (benchmark failed: see its section) | — | — | — | — | — | — |" in top
    assert summary["headline"]["ok"] == [
        {
            "metric": "x speedup",
            "value": 1.5,
            "ci_low": 1.2,
            "ci_high": 1.8,
            "paper": (2.0, 2.5),
            "ideal": 3.0,
        }
    ]
    assert summary["no_headline"] == []


def test_a_benchmark_without_a_headline_or_with_a_broken_one_is_named(tmp_path, monkeypatch) -> None:
    def broken(payload: dict) -> list:
        return [headline_row("y", payload["no such field"])]

    fakes = {
        "ok": _fake("fake_ok", fail=False),
        "bare": _fake("fake_bare", fail=False, headline=None),
        "broken": _fake("fake_broken", fail=False, headline=broken),
        "empty": _fake("fake_empty", fail=False, headline=lambda p: []),
    }
    summary = _run_all(tmp_path, monkeypatch, fakes)
    report = Path(summary["report"]).read_text()
    top = report[: report.index("\n## ")]
    assert "| bare | (no headline: fake_bare has no headline(payload) function) | — |" in top
    assert "| broken | (headline failed: KeyError: 'no such field') | — |" in top
    assert "| empty | (headline returned no rows) | — |" in top
    assert "| ok | x speedup | 1.5 |" in top
    assert summary["no_headline"] == ["bare"] and summary["failed"] == []
    assert "## bare" in report and "## broken" in report  # their sections are still there


def test_headline_numbers_are_short() -> None:
    assert [bench_all.number(x) for x in (None, 0, 0.06, 1.23456, 95.04, 1234.5, 12345.6)] == [
        "—", "0", "0.06", "1.235", "95.04", "1234", "12346",
    ]  # fmt: skip
    assert bench_all.number((1.03, 1.05)) == "1.03–1.05" and bench_all.number([0.67, 0.78]) == "0.67–0.78"
    assert bench_all.interval(0.9, 1.1) == "[0.9, 1.1]" and bench_all.interval(None, 1.1) == "—"


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_every_registered_benchmark_has_a_headline(name: str) -> None:
    module = importlib.import_module(REGISTERED[name])
    assert callable(getattr(module, "headline", None)), f"{REGISTERED[name]} has no headline(payload)"


# -- each benchmark's headline(payload), on a minimal payload shaped like its run()'s ----------------------
Case = tuple[dict, list[tuple]]  # the payload; per headline row (value, ci_low, ci_high, paper, ideal)


def _rollout_granularity() -> Case:
    def row(turns: int, sigma: float, x: float, paper: float | None, ideal: float) -> dict:
        ci = {"ci_low": x - 0.01, "ci_high": x + 0.02}
        return {
            "turns": turns,
            "sigma": sigma,
            "speedup": x,
            **ci,
            "paper_speedup": paper,
            "ideal_speedup": ideal,
        }

    rows = [row(25, 1.0, 1.11, 1.23, 1.12), row(25, 2.0, 1.2, None, 1.21), row(50, 10.0, 2.05, 2.27, 2.1)]
    return {"rows": rows}, [(1.11, 1.10, 1.13, 1.23, 1.12), (2.05, 2.04, 2.07, 2.27, 2.1)]


def _proxy_overhead() -> Case:
    from bench.proxy_overhead import summarize

    def tps(values: list[float]) -> list[dict]:
        return [{"tokens": 100, "seconds": 100 / v, "tokens_per_s": v} for v in values]

    rows, ratio = summarize(tps([100.0, 110.0, 90.0]), tps([95.0, 99.0, 90.0]))
    return {"rows": rows, **ratio}, [
        (ratio["ratio"], ratio["ratio_ci_low"], ratio["ratio_ci_high"], None, 1.0)
    ]


def _faults() -> Case:
    def row(r: int, p: float, done: int, lost: int, x: float) -> dict:
        counts = {"steps_done": done, "steps_asked": 12, "lost": lost, "partial_groups_trained": int(r == 0)}
        return {
            "redundancy": r,
            "failure_rate": p,
            **counts,
            "step_s": x,
            "ci_low": x - 0.1,
            "ci_high": x + 0.2,
        }

    rows = [row(0, 0.0, 12, 0, 1.0), row(0, 0.2, 9, 2, 3.0), row(2, 0.0, 12, 0, 1.5), row(2, 0.2, 12, 0, 2.0)]
    totals = [(45 / 48, None, None, None, 1.0), (2, None, None, None, 0), (2, None, None, None, 0)]
    return {"rows": rows}, [*totals, (3.0, 2.9, 3.2, None, None), (2.0, 1.9, 2.2, None, None)]


def _async_modes() -> Case:
    def row(mode: str, x: float, gain: float) -> dict:
        step = {"step_s": x, "ci_low": x - 0.2, "ci_high": x + 0.3}
        return {
            "mode": mode,
            **step,
            "speedup_vs_sync": gain,
            "speedup_ci_low": gain - 0.1,
            "speedup_ci_high": gain + 0.4,
        }

    payload = {"rows": [row("sync", 4.0, 1.0), row("rollart", 2.0, 2.9)], "ideal": {"ideal_step_s": 1.7}}
    return payload, [(2.9, 2.8, 3.3, (2.65, 4.58), None), (2.0, 1.8, 2.3, None, 1.7)]


def _alpha_sweep() -> Case:
    from bench.alpha_sweep import best_alpha

    def row(alpha: int, gain: float) -> dict:
        step = {"step_s": 1 / gain, "ci_low": 0.9 / gain, "ci_high": 1.1 / gain}
        return {
            "alpha": alpha,
            **step,
            "speedup_vs_alpha1": gain,
            "speedup_ci_low": gain - 0.05,
            "speedup_ci_high": gain + 0.1,
        }

    rows = [row(1, 1.0), row(2, 1.15), row(4, 1.08)]
    return {"rows": rows, "best": best_alpha(rows)}, [(1.15, 1.1, 1.25, 1.22, None)]


def _time_to_score() -> Case:
    from bench.time_to_score_rows import summarize

    def run(mode: str, alpha: int, seed: int, t: float, step_s: float) -> dict:
        where = {"setting": "waiting", "layout": "split", "mode": mode, "alpha": alpha, "seed": seed}
        return (
            where
            | {"time_to_target_s": t, "reached": True, "steps_to_target": 4, "step_s": step_s}
            | {"later_step_s": step_s}
        )

    rows = [run("sync+", 0, s, t, 25.0) for s, t in enumerate((100.0, 120.0, 110.0))]
    rows += [run("rollart", 1, s, t, 16.0) for s, t in enumerate((50.0, 60.0, 55.0))]
    rows += [run("rollart", 2, s, t, 12.0) for s, t in enumerate((40.0, 45.0, 44.0))]
    return {"rows": rows, "summary": summarize(rows)}, [
        (110.0 / 55.0, None, None, 2.05, None),
        (25.0 / 16.0, None, None, None, None),
    ]


def _weight_sync() -> Case:
    def row(window: str, mb: int, x: float) -> dict:
        where = {"store": "mooncake", "model_mb": mb, "bucket_mb": 16, "window": window}
        return where | {"hidden_fraction": x, "ci_low": x - 0.1, "ci_high": x + 0.05, "hidden_max": x + 0.2}

    rows = [row("idle", 16, 0.7), row("loaded", 16, 0.5), row("idle", 128, 0.6), row("loaded", 128, 0.55)]
    return {"rows": rows}, [(0.6, 0.5, 0.65, (0.67, 0.78), 0.8), (0.5, 0.4, 0.55, (0.67, 0.78), 0.7)]


def _affinity() -> Case:
    def cell(ratio: float, e: float, x: float) -> dict:
        vs_h800 = {"vs_h800": x, "vs_h800_ci_low": x - 0.1, "vs_h800_ci_high": x + 0.1}
        vs_h20 = {"vs_h20": x + 1, "vs_h20_ci_low": x + 0.8, "vs_h20_ci_high": x + 1.2}
        gain = {"gain": x - 0.5, "ci_low": x - 0.6, "ci_high": x - 0.4}
        return {"ratio": ratio, "efficiency": e, **vs_h800, **vs_h20, **gain}

    cells = [cell(0.3, 1.0, 1.1), cell(0.5, 0.5, 1.2), cell(0.5, 1.0, 1.3), cell(0.7, 1.0, 1.4)]
    vs = [(2.3, 2.1, 2.5, (1.30, 1.68), None), (1.3, 1.2, 1.4, (1.12, 1.37), None)]
    return {"rows": [], "cells": cells}, [*vs, (0.8, 0.7, 0.9, None, None)]


def _pd() -> Case:
    def row(model: str, config: str, x: float) -> dict:
        where = {"model": model, "groups": 8, "config": config}
        return where | {"speedup": x, "ci_low": x - 0.1, "ci_high": x + 0.2}

    runs = (
        ("dense", "colocated", 1.0),
        ("dense", "1P3D", 0.99),
        ("dense", "2P2D", 0.9),
        ("moe", "1P3D", 0.8),
    )
    dense, moe = (1.03, 1.05), (1.11, 1.21)
    expected = [(0.99, 0.89, 1.19, dense, None), (0.9, 0.8, 1.1, dense, None), (0.8, 0.7, 1.0, moe, None)]
    return {"rows": [row(*r) for r in runs]}, expected


def _serverless() -> Case:
    def row(setup: str, gen: int, util: float, gain: float, speedup: float) -> dict:
        where = {"setup": setup, "gen_gpus": gen, "judge": "2 reserved" if gen == 6 else "keep-alive 10 s"}
        util_ci = {"reward_utilization": util, "util_ci_low": util - 0.01, "util_ci_high": util + 0.02}
        return (
            where
            | util_ci
            | {"speedup": speedup, "gain_per_gpu_s": gain, "ci_low": gain - 0.1, "ci_high": gain + 0.1}
        )

    rows = [
        row("reserved", 6, 0.1, 1.0, 1.0),
        row("serverless", 6, 0.7, 1.2, 0.99),
        row("serverless", 8, 0.6, 1.1, 1.5),
    ]
    utilisation = [(0.1, 0.09, 0.12, 0.06, None), (0.7, 0.69, 0.72, 0.88, None)]
    rest = [(1.2, 1.1, 1.3, None, None), (0.6, 0.59, 0.62, 0.88, None), (1.1, 1.0, 1.2, None, None)]
    return {"rows": rows}, [*utilisation, *rest, (1.5, None, None, 158 / 77, None)]


def _redundancy() -> Case:
    def row(r: int, rate: float, x: float, pays: str) -> dict:
        where = {
            "group_size": 8,
            "env_groups": 8,
            "straggler_rate": rate,
            "straggler_factor": 4.0,
            "redundancy": r,
        }
        return where | {"speedup": x, "ci_low": x - 0.1, "ci_high": x + 0.1, "pays": pays}

    rows = [
        row(0, 0.05, 1.0, "base"),
        row(2, 0.05, 0.9, "no"),
        row(0, 0.2, 1.0, "base"),
        row(2, 0.2, 1.4, "yes"),
    ]
    rows += [row(1, 0.2, 1.05, "~")]
    return {"rows": rows}, [
        (1.4, 1.3, 1.5, 1.62, None),
        (0.9, 0.8, 1.0, None, None),
        (1 / 3, None, None, None, None),
    ]


def _scale() -> Case:
    rows = [
        {"concurrency": e, "efficiency": x, "ci_low": x - 0.05, "ci_high": x + 0.01}
        for e, x in ((128, 0.94), (1024, 0.77))
    ]
    return {"rows": rows, "paper": None}, [(0.94, 0.89, 0.95, None, 1.0), (0.77, 0.72, 0.78, None, 1.0)]


def _vs_trl() -> Case:
    vs = [
        {"model": "tiny", "setting": "single-turn", "mode": m, "alpha": a, "vs_trl": x}
        for m, a, x in (("sync", 0, 1.7), ("rollart", 1, 2.4))
    ]
    return {"rows": [], "vs_trl": vs}, [(1.7, None, None, None, None), (2.4, None, None, None, None)]


CASES = {
    "rollout-granularity": _rollout_granularity,
    "proxy-overhead": _proxy_overhead,
    "faults": _faults,
    "async-modes": _async_modes,
    "alpha-sweep": _alpha_sweep,
    "time-to-score": _time_to_score,
    "weight-sync": _weight_sync,
    "affinity": _affinity,
    "pd": _pd,
    "serverless": _serverless,
    "redundancy": _redundancy,
    "scale": _scale,
    "vs-trl": _vs_trl,
}


def test_every_registered_benchmark_has_a_headline_case() -> None:
    assert set(CASES) == set(REGISTERED)


FIELDS = ("value", "ci_low", "ci_high", "paper", "ideal")


def _flat(value: Any, low: Any, high: Any, paper: Any, ideal: Any) -> list:
    """A headline row's numbers in one flat list (pytest.approx takes no nesting): a paper range as 2."""
    return [value, low, high, ideal, *(paper if isinstance(paper, tuple | list) else [paper])]


@pytest.mark.parametrize("name", sorted(CASES))
def test_headline_takes_its_numbers_from_the_right_fields(name: str) -> None:
    payload, expected = CASES[name]()
    rows = importlib.import_module(REGISTERED[name]).headline(payload)
    assert [set(r) for r in rows] == [{"metric", "value", "ci_low", "ci_high", "paper", "ideal"}] * len(rows)
    metrics = [r["metric"] for r in rows]
    assert all(isinstance(m, str) and m for m in metrics) and len(set(metrics)) == len(metrics)
    got = [_flat(*(r[k] for k in FIELDS)) for r in rows]
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(_flat(*e))


def test_headlines_without_what_they_compare_with() -> None:
    from bench import alpha_sweep, async_modes, rollout_granularity

    no_paper = {"turns": 25, "sigma": 1.0, "speedup": 1.1, "ci_low": 1.0, "ci_high": 1.2}
    no_paper |= {"paper_speedup": None, "ideal_speedup": 1.2}
    assert [r["value"] for r in rollout_granularity.headline({"rows": [no_paper]})] == [
        1.1
    ]  # μ ≠ 10: every row
    assert alpha_sweep.headline({"rows": [], "best": None}) == []  # no α = 1, or nothing beside it
    sync = {"mode": "sync", "step_s": 4.0, "ci_low": 3.0, "ci_high": 5.0, "speedup_vs_sync": 1.0}
    assert async_modes.headline({"rows": [sync], "ideal": None}) == []  # no rollart row
    rollart = sync | {
        "mode": "rollart",
        "speedup_vs_sync": None,
        "speedup_ci_low": None,
        "speedup_ci_high": None,
    }
    [step] = async_modes.headline(
        {"rows": [rollart], "ideal": None}
    )  # no sync: no speedup; no sync+: no ideal
    assert (step["value"], step["ideal"]) == (4.0, None)


def test_a_benchmarks_suite_args_sees_the_results_of_those_run_before_it(tmp_path, monkeypatch) -> None:
    first, second = _fake("fake_first", fail=False), _fake("fake_second", fail=False)
    seen: dict[str, Any] = {}

    def suite_args(args: argparse.Namespace, before: dict[str, Any]) -> None:
        seen.update(before)
        args.size = before["first"]["payload"]["rows"][0]["x"] + 1

    second.suite_args = suite_args
    monkeypatch.setitem(sys.modules, "fake_first", first)
    monkeypatch.setitem(sys.modules, "fake_second", second)
    monkeypatch.setattr(bench, "BENCHMARKS", {"first": "fake_first", "second": "fake_second"})
    args = argparse.Namespace(quick=True, json=None, out=str(tmp_path / "r"), skip="")
    summary = bench_all.run(args)
    assert list(seen) == ["first"]
    assert summary["results"]["second"]["payload"]["rows"][0]["size"] == 2


def test_consecutive_benchmarks_naming_one_suite_session_run_inside_one_of_it(tmp_path, monkeypatch) -> None:
    events: list[str] = []

    def session(name: str) -> Any:
        @contextlib.contextmanager
        def opened() -> Any:
            events.append(f"open {name}")
            yield
            events.append(f"close {name}")

        return opened

    one, two = session("one"), session("two")
    plan = {"a": None, "b": one, "c": one, "d": None, "e": two, "f": one}
    names = {}
    for n, s in plan.items():
        module = _fake(f"fake_{n}", fail=n == "c")  # a failing one stays inside its session
        run = module.run
        module.run = lambda args, n=n, run=run: events.append(n) or run(args)
        if s is not None:
            module.SUITE_SESSION = s
        monkeypatch.setitem(sys.modules, f"fake_{n}", module)
        names[n] = f"fake_{n}"
    monkeypatch.setattr(bench, "BENCHMARKS", names)
    summary = bench_all.run(argparse.Namespace(quick=True, json=None, out=str(tmp_path / "r"), skip=""))
    assert events == [
        "a",
        "open one",
        "b",
        "c",
        "close one",
        "d",
        "open two",
        "e",
        "close two",
        "open one",
        "f",
        "close one",
    ]
    assert summary["failed"] == ["c"]
