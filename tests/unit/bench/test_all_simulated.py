"""`rollart bench all` runs the simulated-clock benchmarks side by side, each in its own process with its
output in DIR/NAME.log, then the wall-clock ones in this process, one at a time; the report keeps the
registry's order whichever ran first."""

import argparse
import json
import os
import textwrap
import time
from pathlib import Path

import pytest

import bench
from bench import all as bench_all

# A benchmark module as a file (a spawned process imports it by name): it records where and when it ran.
# Given `meet`, it waits for that benchmark to have started too: two that run one after the other never meet,
# and the first one fails after a minute, however fast or slow the machine is.
BENCH = textwrap.dedent(
    """
    import os, sys, time
    from dataclasses import dataclass
    from pathlib import Path

    from bench.report import write_json

    @dataclass(frozen=True)
    class Settings:
        clock: str = "{clock}"

    FULL = Settings()
    BESIDE_SIMULATED = "{beside}"

    def add_arguments(p):
        pass

    def run(args):
        t0 = time.time()
        print("{name} says hello")
        print("{name} warns", file=sys.stderr)
        if {fail}:
            raise RuntimeError("{name} broke")
        Path(__file__).with_name("started-{name}").touch()
        deadline = time.time() + 60
        while "{meet}" and not Path(__file__).with_name("started-{meet}").exists():
            if time.time() > deadline:
                raise RuntimeError("{name} never ran beside {meet}")
            time.sleep(0.05)
        payload = {{"clock": FULL.clock, "seeds": [0], "rows": [{{"pid": os.getpid(), "quick": args.quick}}],
                   "start": t0, "end": time.time()}}
        write_json(args.json, payload)
        return payload
    """
)


@pytest.fixture
def mods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path for the fake benchmark modules (a spawned process imports them by name)."""
    root = tmp_path / "mods"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def _module(root: Path, name: str, clock: str, fail: bool = False, meet: str = "", beside: str = "") -> str:
    (root / f"{name}.py").write_text(
        BENCH.format(name=name, clock=clock, fail=fail, meet=meet, beside=beside)
    )
    return name


def test_simulated_benchmarks_run_side_by_side_in_their_own_processes(tmp_path, monkeypatch, mods) -> None:
    names = {
        "wall_a": _module(mods, "fake_wall_a", "wall"),
        "sim_a": _module(mods, "fake_sim_a", "virtual", meet="fake_sim_b"),  # each ends only once the
        "sim_b": _module(mods, "fake_sim_b", "virtual", meet="fake_sim_a"),  # other has started
        "sim_bad": _module(mods, "fake_sim_bad", "virtual", fail=True),
        "all": "bench.all",
    }
    monkeypatch.setattr(bench, "BENCHMARKS", names)
    out = tmp_path / "report"
    t0 = time.time()
    summary = bench_all.run(argparse.Namespace(quick=True, json=None, out=str(out), skip=""))

    results = summary["results"]
    assert list(results) == ["wall_a", "sim_a", "sim_b", "sim_bad"]  # the registry's order
    assert (
        summary["failed"] == ["sim_bad"] and "RuntimeError: fake_sim_bad broke" in results["sim_bad"]["error"]
    )
    pids = {n: results[n]["payload"]["rows"][0]["pid"] for n in ("wall_a", "sim_a", "sim_b")}
    assert pids["wall_a"] == os.getpid()  # wall clock: here, alone
    assert len({pids["sim_a"], pids["sim_b"], os.getpid()}) == 3  # each simulated one: a fresh process
    a, b = results["sim_a"]["payload"], results["sim_b"]["payload"]
    assert max(a["start"], b["start"]) < min(a["end"], b["end"])  # they met: they ran at the same time
    assert results["wall_a"]["payload"]["start"] > max(a["end"], b["end"])  # the wall clock one ran after
    assert t0 < a["start"] and results["sim_a"]["seconds"] > 0
    assert json.loads((out / "sim_a.json").read_text())["rows"][0]["quick"] is True
    for n in ("sim_a", "sim_bad"):  # a simulated one's stdout and stderr are in its log, failed or not
        log = (out / f"{n}.log").read_text()
        assert f"fake_{n} says hello" in log and f"fake_{n} warns" in log
    assert not (out / "wall_a.log").exists()
    report = (out / "report.md").read_text()
    assert (
        report.index("## wall_a")
        < report.index("## sim_a")
        < report.index("## sim_b")
        < report.index("## sim_bad")
    )


def test_a_simulated_benchmark_whose_process_dies_is_reported_and_the_wall_clock_ones_still_run(
    tmp_path, monkeypatch, mods
) -> None:
    (mods / "fake_sim_dies.py").write_text(
        BENCH.format(name="fake_sim_dies", clock="virtual", fail=False, meet="", beside="").replace(
            "    t0 = time.time()", "    os._exit(3)"
        )
    )
    names = {"dies": "fake_sim_dies", "wall_a": _module(mods, "fake_wall_a", "wall"), "all": "bench.all"}
    monkeypatch.setattr(bench, "BENCHMARKS", names)
    summary = bench_all.run(argparse.Namespace(quick=True, json=None, out=str(tmp_path / "r"), skip=""))
    assert summary["failed"] == ["dies"] and "BrokenProcessPool" in summary["results"]["dies"]["error"]
    assert summary["results"]["wall_a"]["payload"]["rows"][0]["pid"] == os.getpid()


def test_quick_runs_a_wall_clock_benchmark_that_may_beside_the_simulated_ones_and_says_so(
    tmp_path, monkeypatch, mods
) -> None:
    names = {
        "counts": _module(mods, "fake_counts", "wall", meet="fake_sim_c", beside="its verdict is counts"),
        "sim_c": _module(mods, "fake_sim_c", "virtual", meet="fake_counts"),  # ends once counts has started
        "timed": _module(mods, "fake_timed", "wall"),
        "all": "bench.all",
    }
    monkeypatch.setattr(bench, "BENCHMARKS", names)
    out = tmp_path / "report"
    summary = bench_all.run(argparse.Namespace(quick=True, json=None, out=str(out), skip=""))

    results = summary["results"]
    assert summary["failed"] == []
    counts, sim, timed = (results[n]["payload"] for n in ("counts", "sim_c", "timed"))
    assert counts["rows"][0]["pid"] == os.getpid() != sim["rows"][0]["pid"]  # here, the simulated one apart
    assert max(counts["start"], sim["start"]) < min(counts["end"], sim["end"])  # at the same time
    assert timed["start"] > max(counts["end"], sim["end"])  # a wall-clock one without the attribute: alone
    assert results["counts"]["beside"] == ["sim_c"] and "beside" not in results["timed"]
    report = (out / "report.md").read_text()
    section = report[report.index("## counts") : report.index("## sim_c")]
    assert "Ran beside the simulated-clock benchmarks (sim_c; quick suite)" in section
    assert "| wall (beside the simulated) |" in report and "| wall |" in report  # the headline's clock column


def test_the_full_suite_runs_every_wall_clock_benchmark_alone(tmp_path, monkeypatch, mods) -> None:
    names = {
        "counts": _module(mods, "fake_counts_full", "wall", beside="its verdict is counts"),
        "sim_d": _module(mods, "fake_sim_d", "virtual"),
        "all": "bench.all",
    }
    monkeypatch.setattr(bench, "BENCHMARKS", names)
    summary = bench_all.run(argparse.Namespace(quick=False, json=None, out=str(tmp_path / "r"), skip=""))
    counts, sim = (summary["results"][n] for n in ("counts", "sim_d"))
    assert counts["payload"]["start"] > sim["payload"]["end"] and "beside" not in counts


@pytest.mark.parametrize(("module", "clock"), [("bench.pd", "virtual"), ("bench.faults", "wall")])
def test_clock_of_a_registered_benchmark(module: str, clock: str) -> None:
    import importlib

    assert bench_all.clock_of(importlib.import_module(module)) == clock
