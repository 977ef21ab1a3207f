"""`rollart bench all`: runs every registered benchmark, one failing does not stop the rest, one report."""

import argparse
import sys
import types
from pathlib import Path

import bench
from bench import all as bench_all
from bench.report import new_figure, save_figure, write_json


def _fake(name: str, fail: bool) -> types.ModuleType:
    module = types.ModuleType(name)

    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--size", type=int, default=None)

    def run(args: argparse.Namespace) -> dict:
        if fail:
            raise RuntimeError("no GPU here")
        fig, ax = new_figure()
        ax.plot([1, 2], [3, 4])
        payload = {
            "rows": [{"x": 1, "quick": args.quick, "size": args.size}],
            "note": "Paper: 2x. Ours: 1.5x.",
            "png": save_figure(fig, args.json, "unused.png"),
        }
        write_json(args.json, payload)
        return payload

    module.add_arguments, module.run = add_arguments, run
    return module


def test_report_has_every_table_and_plot_and_the_failures(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "fake_ok", _fake("fake_ok", fail=False))
    monkeypatch.setitem(sys.modules, "fake_bad", _fake("fake_bad", fail=True))
    monkeypatch.setattr(
        bench, "BENCHMARKS", {"ok": "fake_ok", "bad": "fake_bad", "skipped": "fake_bad", "all": "bench.all"}
    )
    out = tmp_path / "report"
    args = argparse.Namespace(quick=True, json=str(tmp_path / "all.json"), out=str(out), skip="skipped")
    summary = bench_all.run(args)
    assert summary["failed"] == ["bad"] and set(summary["results"]) == {"ok", "bad"}
    report = (out / "report.md").read_text()
    assert "# rollart benchmarks (quick)" in report
    assert "## ok" in report and "Paper: 2x. Ours: 1.5x." in report
    assert "| x | quick | size |" in report and "| 1 | True | None |" in report
    assert "![ok](ok.png)" in report and (out / "ok.png").stat().st_size > 0
    assert (out / "ok.json").exists()
    assert "## bad" in report and "RuntimeError: no GPU here" in report
    assert "## skipped" not in report and "## all" not in report
    assert Path(summary["report"]) == out / "report.md"


def test_unknown_skip_is_refused(tmp_path) -> None:
    import pytest

    with pytest.raises(SystemExit, match="unknown benchmark"):
        bench_all.run(argparse.Namespace(quick=True, json=None, out=str(tmp_path), skip="nope"))
