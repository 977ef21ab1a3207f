"""`rollart bench all [--quick] --out DIR`: every registered benchmark, then one Markdown report.

Each benchmark runs with its defaults (or `--quick`) and writes DIR/NAME.json and DIR/NAME.png; DIR/report.md
opens with one headline table (per benchmark, the rows its `headline(payload)` returns: the metric, our
median and its 95% interval, the paper's number and the ideal, beside the clock and the seeds), then gets,
per benchmark, its note (the paper's figure beside ours), its rows as a table and its plot. A benchmark
that fails (e.g. proxy-overhead without vLLM) is reported with its error and the others still run; one
without a `headline` function, or whose `headline` raises, is named in the headline table.

The benchmarks on the simulated clock (`bench/clock.py`: their figures do not depend on the machine's load)
run first, `SIMULATED_AT_ONCE` at a time, each in its own process (at the lowest scheduling priority) with its
output in DIR/NAME.log; then the wall-clock ones, one after another with the machine to themselves. With
`--quick` a wall-clock benchmark whose verdict is counts, not times (its module's `BESIDE_SIMULATED` says
why, e.g. faults: steps done, members lost), runs in this process while the simulated ones run: its times
then include their load, which its section and its clock column say; the full suite runs it alone. Only
those: the simulated ones at idle priority beside every wall-clock one saved ~90 s of the quick suite, but
on this VM it did not isolate them (proxy-overhead's ratio, the first wall-clock benchmark, read 0.895 and
0.866 in two such suites against 0.955 and 0.990 alone: a busy vCPU is not an idle one to the host).
Consecutive wall-clock benchmarks whose modules name the same `SUITE_SESSION` (a context manager, e.g.
`bench.async_runs.suite_session`: one Ray and its kept workers for async-modes, then alpha-sweep) run inside
one of it, opened before the first and closed after the last.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
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
    if result.get("beside"):
        lines += [
            f"Ran beside the simulated-clock benchmarks ({', '.join(result['beside'])}; quick suite): its "
            "times include their load, its counts do not depend on it. The full suite runs it alone.",
            "",
        ]
    lines += [f"JSON: `{name}.json`; ran in {result['seconds']:.0f} s.", ""]
    return "\n".join(lines)


def number(x: Any) -> str:
    """A headline cell: 4 significant digits (whole numbers from 10,000), a range (low, high) as low–high,
    a dash for None."""
    if x is None:
        return "—"
    if isinstance(x, list | tuple):
        return "–".join(number(v) for v in x)
    return f"{x:.0f}" if abs(x) >= 1e4 else f"{x:.4g}"


def interval(low: float | None, high: float | None) -> str:
    """`[low, high]` in `number`'s format, or a dash when either end is missing."""
    return "—" if low is None or high is None else f"[{number(low)}, {number(high)}]"


def headline_rows(module: Any, result: dict[str, Any]) -> list[dict[str, Any]]:
    """The benchmark's `headline(payload)` rows; one row saying why when it failed, has no `headline`,
    or its `headline` raised or returned nothing."""
    if "error" in result:
        return [{"metric": "(benchmark failed: see its section)"}]
    headline = getattr(module, "headline", None)
    if not callable(headline):
        return [{"metric": f"(no headline: {module.__name__} has no headline(payload) function)"}]
    try:
        return headline(result["payload"]) or [{"metric": "(headline returned no rows)"}]
    except Exception as e:  # a bad headline must not lose the report
        return [{"metric": f"(headline failed: {type(e).__name__}: {e})"}]


def headline_table(results: dict[str, dict[str, Any]], headlines: dict[str, list[dict[str, Any]]]) -> str:
    """report.md's headline table: every benchmark's headline rows beside its clock and seeds."""
    lines = []
    for name, rows in headlines.items():
        payload = results[name].get("payload", {})
        seeds = ", ".join(str(x) for x in payload.get("seeds", [])) or "—"
        clock = payload.get("clock", "—") + (" (beside the simulated)" if results[name].get("beside") else "")
        lines += [
            {
                "benchmark": name,
                "metric": str(h["metric"]).replace("|", "\\|").replace("\n", " "),  # one table cell
                "ours": number(h.get("value")),
                "95% interval": interval(h.get("ci_low"), h.get("ci_high")),
                "paper": number(h.get("paper")),
                "ideal": number(h.get("ideal")),
                "clock": clock,
                "seeds": seeds,
            }
            for h in rows
        ]
    return markdown_table(lines)


HEADER = (
    "Headline: per benchmark, the figures its `headline(payload)` picks. ours: our median (over seeds or "
    "repeats where it has them); 95% interval: its percentile-bootstrap interval (— where there is none, "
    "e.g. one run, or a deterministic simulated clock); paper: the paper's number (a range as low–high); "
    "ideal: the benchmark's own bound (e.g. perfect overlap); clock: virtual (simulated) or wall. What each "
    "figure means and how it was measured: the benchmark's section and module docstring."
)


SIMULATED_AT_ONCE = 2  # one per core here; each is one busy event loop


def clock_of(module: Any) -> str:
    """The clock a benchmark runs on by default: its settings' `clock` field, else the wall clock."""
    return str(getattr(getattr(module, "FULL", None), "clock", "wall"))


def _run_one(
    name: str, path: str, quick: bool, out: Path, before: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Run one benchmark: {"payload", "seconds"}, or {"error", "seconds"} if it raised or exited. A module's
    `suite_args(args, before)`, if it has one, may take inputs from the results of the ones run before it
    (e.g. weight-sync its window from async-modes)."""
    module = importlib.import_module(path)
    t0 = time.perf_counter()
    try:
        args = _args(name, module, quick, out / f"{name}.json")
        if callable(hook := getattr(module, "suite_args", None)):
            hook(args, before or {})
        payload = module.run(args)
        return {"payload": payload, "seconds": time.perf_counter() - t0}
    except (Exception, SystemExit):  # one broken benchmark must not lose the others' results
        # (SystemExit: faults exits so when a requirement is not met, after writing its JSON)
        return {"error": traceback.format_exc(limit=3), "seconds": time.perf_counter() - t0}


def beside_simulated(module: Any) -> bool:
    """Whether a wall-clock benchmark may run beside the simulated ones in the quick suite (module doc)."""
    return bool(getattr(module, "BESIDE_SIMULATED", ""))


def _run_logged(name: str, path: str, quick: bool, out: Path) -> dict[str, Any]:
    """`_run_one` in a pool process (at the lowest priority), its stdout and stderr going to DIR/NAME.log."""
    os.nice(19)  # beside a wall-clock benchmark (quick suite), that one comes first
    with open(out / f"{name}.log", "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            return _run_one(name, path, quick, out)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()


def _run_each(names: dict[str, str], quick: bool, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run every benchmark in `names` (name -> module path), the simulated-clock ones side by side first, with
    `quick` those wall-clock ones beside them that may be (module doc); their results and modules by name,
    in the order of `names`."""
    modules = {name: importlib.import_module(path) for name, path in names.items()}
    simulated = [n for n, m in modules.items() if clock_of(m) == "virtual"]
    beside = [
        n for n, m in modules.items() if quick and simulated and n not in simulated and beside_simulated(m)
    ]
    results: dict[str, dict[str, Any]] = {}
    if simulated:
        print(f"simulated clock, {SIMULATED_AT_ONCE} at a time: {', '.join(simulated)} (logs: {out}/*.log)")
        # a fresh process per benchmark (spawned, not forked: this process may hold threads)
        context = get_context("spawn")
        with ProcessPoolExecutor(SIMULATED_AT_ONCE, mp_context=context, max_tasks_per_child=1) as pool:
            futures = {n: pool.submit(_run_logged, n, names[n], quick, out) for n in simulated}
            for n in beside:
                print(f"{n}: beside them ({modules[n].BESIDE_SIMULATED})", flush=True)
                results[n] = _run_one(n, names[n], quick, out, results) | {"beside": simulated}
            for n, future in futures.items():
                try:
                    results[n] = r = future.result()
                except Exception:  # its process died (and with it the pool: those after it fail alike)
                    results[n] = r = {"error": traceback.format_exc(limit=3), "seconds": 0.0}
                print(f"{n}: {'failed' if 'error' in r else 'done'} in {r['seconds']:.0f} s", flush=True)
    _run_alone(names, modules, quick, out, results)
    return {n: results[n] for n in names}, modules


def _run_alone(
    names: dict[str, str], modules: dict[str, Any], quick: bool, out: Path, results: dict[str, Any]
) -> None:
    """The benchmarks not in `results` yet, one after another in this process; consecutive ones whose
    modules name the same `SUITE_SESSION` run inside one of it (module doc)."""
    with contextlib.ExitStack() as stack:
        current: Any = None
        for n in names:
            if n in results:
                continue
            session = getattr(modules[n], "SUITE_SESSION", None)
            if session is not current:
                stack.close()  # the last one's session ends before another starts
                if session is not None:
                    stack.enter_context(session())
                current = session
            results[n] = _run_one(n, names[n], quick, out, results)


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
    names = {n: p for n, p in BENCHMARKS.items() if p != __name__ and n not in skip}
    results, modules = _run_each(names, bool(args.quick), out)
    headlines = {n: headline_rows(modules[n], r) for n, r in results.items()}
    header = [
        f"# rollart benchmarks ({'quick' if args.quick else 'full'})",
        "",
        HEADER,
        "",
        headline_table(results, headlines),
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
        "no_headline": [n for n, m in modules.items() if not callable(getattr(m, "headline", None))],
        "headline": headlines,
        "results": results,
    }
    write_json(getattr(args, "json", None), summary)
    print(
        f"wrote {report} ({len(results) - len(summary['failed'])} ok, failed: {summary['failed'] or 'none'})"
    )
    return summary
