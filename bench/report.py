"""Helpers shared by the benchmarks: settings from the options, a rich table, the JSON, a PNG, Markdown."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

S = TypeVar("S")


def print_table(title: str, rows: Sequence[dict[str, Any]], note: str = "") -> None:
    table = Table(title=title)
    cols = list(rows[0]) if rows else []
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    # Piped to a file or CI log, rich would fold the table into 80 columns and cut the headers.
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    if note:
        console.print(note)


def write_json(path: str | None, payload: dict[str, Any]) -> Path | None:
    if not path:
        return None
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2))
    return p


def publish(
    args: Any,
    title: str,
    settings: Any,
    rows: list[dict[str, Any]],
    note: str,
    *,
    table: Sequence[dict[str, Any]] | None = None,
    clock: str | None = None,
    seeds: Sequence[int] | None = None,
    config: dict[str, Any] | None = None,
    plot: Callable[[str | None], str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Every benchmark's ending: `table` (default: the rows) printed under `title` with `note`, then the
    JSON payload written where `--json` says and returned. The payload's common keys come first: the clock
    and seeds (default: the `settings` dataclass's fields of those names), the rows, the note and the
    config (the settings, then `config`, then `quick`); then `extra`; then `png`, the path `plot(json_path)`
    saved its figure at."""
    print_table(title, rows if table is None else table, note)
    json_path = getattr(args, "json", None)
    payload = {
        "clock": clock or settings.clock,
        "seeds": list(settings.seeds if seeds is None else seeds),
        "rows": rows,
        "note": note,
        # as the JSON reads back (tuples as lists)
        "config": json.loads(
            json.dumps(asdict(settings) | (config or {}) | {"quick": bool(getattr(args, "quick", False))})
        ),
        **extra,
    }
    if plot is not None:
        payload["png"] = plot(json_path)
    write_json(json_path, payload)
    return payload


def png_path(json_path: str | None, default: str) -> Path:
    """The plot goes next to the JSON (same stem), or to runs/bench/`default` without --json."""
    p = Path(json_path).with_suffix(".png") if json_path else Path("runs") / "bench" / default
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def pick_settings(args: Any, full: S, quick: S) -> S:
    """`--quick` picks the base settings; every option given (not None) overrides the field of its name."""
    names = [f.name for f in fields(full)]  # type: ignore[arg-type]  # S is a dataclass
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return replace(quick if getattr(args, "quick", False) else full, **given)


def at_least(kind: type, low: float, strict: bool = False) -> Any:
    """An argparse type: `kind(text)`, which must be >= low (> low when `strict`)."""

    def parse(text: str) -> Any:
        value = kind(text)
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got {text}")
        return value

    return parse


def names_of(choices: Sequence[str]) -> Any:
    """An argparse type: a comma list of names, each one of `choices` ('a,b' -> ('a', 'b'))."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(","))
        if not set(names) <= set(choices):
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}; got {text!r}")
        return names

    return parse


def numbers(kind: type, low: float, strict: bool = False) -> Any:
    """An argparse type: comma-separated `kind` values, each `at_least(kind, low, strict)`."""
    one = at_least(kind, low, strict)

    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(one(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {'integers' if kind is int else 'numbers'}, got {text!r}"
            ) from None

    return parse


def new_figure(width: float = 6.0, height: float = 4.0, cols: int = 1) -> tuple[Figure, Any]:
    """A figure and its `cols` axes side by side, drawn off-screen (no pyplot, no global backend switch)."""
    from matplotlib.figure import Figure  # not at CLI start

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(1, cols)


def save_figure(fig: Figure, json_path: str | None, default: str) -> str:
    """Write the figure next to the JSON (`png_path`); return its path."""
    out = png_path(json_path, default)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return str(out)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a GitHub-flavoured Markdown table (floats to 3 decimals, nested values as JSON)."""
    if not rows:
        return "(no rows)"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}"
        return json.dumps(v) if isinstance(v, dict | list) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def load_note(before: Sequence[float], after: Sequence[float], cpus: int | None) -> str:
    """The 1/5/15-minute load averages around a measurement: other users of the CPUs skew its numbers."""
    fmt = "/".join(["{:.1f}"] * 3)
    return f"Load average (1/5/15 min) before {fmt.format(*before)}, after {fmt.format(*after)}, {cpus} CPUs."


def median_ci(xs: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float, float]:
    """The median of `xs` and a percentile-bootstrap 95% interval of it."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return statistics.median(xs), meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def ci_text(x: float | None, low: float | None, high: float | None, fmt: str) -> str:
    """`x [low, high]` in `fmt`, or a dash when any of them is missing (a table cell)."""
    return "—" if x is None or low is None or high is None else f"{x:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def ci_errors(rows: Sequence[dict[str, Any]], key: str, low: str, high: str) -> list[list[float]]:
    """Matplotlib's asymmetric `yerr` of each row's `key` from its interval columns `low`/`high`."""
    return [[r[key] - r[low] for r in rows], [r[high] - r[key] for r in rows]]


def or_dash(x: float | None, spec: str = ".0f") -> str:
    """`x` in `spec`, or a dash for None (a table cell)."""
    return "—" if x is None else format(x, spec)


def headline_row(
    metric: str,
    value: float | None,
    ci_low: float | None = None,
    ci_high: float | None = None,
    paper: float | Sequence[float] | None = None,
    ideal: float | None = None,
) -> dict[str, Any]:
    """One row of a benchmark's `headline(payload)` (report.md's headline table, `bench.all`): our figure,
    its 95% interval, the paper's number (a range as (low, high)) and the ideal; None where there is none."""
    return {
        "metric": metric,
        "value": value,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "paper": paper,
        "ideal": ideal,
    }
