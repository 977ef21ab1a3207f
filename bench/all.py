"""`rollart bench all [--quick] --out DIR`: every registered benchmark, then one Markdown report.

Each benchmark runs with its defaults (or `--quick`) and writes DIR/NAME.json and DIR/NAME.png; DIR/report.md
gets, per benchmark, its note (the paper's figure beside ours), its rows as a table and its plot. A benchmark
that fails (e.g. proxy-overhead without vLLM) is reported with its error and the others still run.
"""

from __future__ import annotations

import argparse
import importlib
import time
import traceback
from pathlib import Path
from typing import Any

from bench.report import markdown_table, write_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="bench-report", help="directory for the JSON, PNGs and report.md")
    p.add_argument("--skip", default="", help="comma-separated benchmarks to leave out, e.g. proxy-overhead")


def _args(name: str, module: Any, quick: bool, json_path: Path) -> argparse.Namespace:
    """The namespace `rollart bench NAME [--quick] --json PATH` would give the benchmark."""
    parser = argparse.ArgumentParser(prog=f"rollart bench {name}")
    module.add_arguments(parser)
    args = parser.parse_args([])
    args.quick, args.json = quick, str(json_path)
    return args


def _section(name: str, result: dict[str, Any], out: Path) -> str:
    lines = [f"## {name}", ""]
    if "error" in result:
        return "\n".join(
            [*lines, f"**failed** after {result['seconds']:.0f} s:", "", "```", result["error"], "```", ""]
        )
    payload = result["payload"]
    if payload.get("note"):
        lines += [payload["note"].replace("\n", "  \n"), ""]
    lines += [markdown_table(payload.get("rows", [])), ""]
    png = payload.get("png")
    if png:
        lines += [f"![{name}]({Path(png).resolve().relative_to(out.resolve())})", ""]
    lines += [f"JSON: `{name}.json`; ran in {result['seconds']:.0f} s.", ""]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench import BENCHMARKS

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - set(BENCHMARKS)
    if unknown:
        raise SystemExit(
            f"--skip: unknown benchmark(s) {', '.join(sorted(unknown))}; known: {', '.join(BENCHMARKS)}"
        )
    results: dict[str, dict[str, Any]] = {}
    for name, path in BENCHMARKS.items():
        if path == __name__ or name in skip:
            continue
        module = importlib.import_module(path)
        t0 = time.perf_counter()
        try:
            payload = module.run(_args(name, module, bool(args.quick), out / f"{name}.json"))
            results[name] = {"payload": payload, "seconds": time.perf_counter() - t0}
        except Exception:  # one broken benchmark must not lose the others' results
            results[name] = {"error": traceback.format_exc(limit=3), "seconds": time.perf_counter() - t0}
    mode = "quick" if args.quick else "full"
    header = [
        f"# rollart benchmarks ({mode})",
        "",
        "Each section: the paper's figure beside ours, the rows (as in NAME.json) and the plot. "
        "Modelled devices, real control plane (see each benchmark's module docstring).",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(header + [_section(n, r, out) for n, r in results.items()]))
    summary = {
        "report": str(report),
        "failed": [n for n, r in results.items() if "error" in r],
        "results": results,
    }
    write_json(getattr(args, "json", None), summary)
    print(
        f"wrote {report} ({len(results) - len(summary['failed'])} ok, failed: {summary['failed'] or 'none'})"
    )
    return summary
