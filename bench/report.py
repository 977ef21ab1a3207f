"""Output helpers shared by the benchmarks: a rich table, the JSON file, a PNG path."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def print_table(title: str, rows: Sequence[dict[str, Any]], note: str = "") -> None:
    table = Table(title=title)
    cols = list(rows[0]) if rows else []
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    console = Console()
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


def png_path(json_path: str | None, default: str) -> Path:
    """The plot goes next to the JSON (same stem), or to `default` without --json."""
    p = Path(json_path).with_suffix(".png") if json_path else Path(default)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p
