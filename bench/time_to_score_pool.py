"""`rollart bench time-to-score --pool A.json B.json ...`: earlier runs under one target, without training.

A seed of the 8-step SmolLM2 runs takes ~16 minutes, so seeds are run one call each (`--seeds N --json
sN.json`). Each call sets its own target from its own sync+ run; pooling reads the calls' `--json` files
back and treats their runs as one call over all their seeds would: one target from every sync+ run (or
`--target`), then the same rows, summary, table and plot. The files must come from the same benchmark
settings but for their seeds, and agree on the untrained model's score; a run (setting, layout, mode, α,
seed) may appear once. Anything else is refused, naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

RUN_KEYS = ("setting", "layout", "mode", "alpha", "seed")
ALLOWED = ("target",)  # the options a pooled call may still give: a target fixed before pooling
# settings the files may differ in: a file's target is its own call's; where it put its runs' batches
# (--batches-to) changes nothing in them, and a pooled call saves none
FREE = ("seeds", "target", "batches_to")


def _tuples(value: Any) -> Any:
    """JSON lists back into the settings' tuples (nested: runs are (mode, α) pairs)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def refuse_training_options(args: Any, settings_cls: type) -> None:
    """With --pool, every option of a training call has nothing behind it: refused by name."""
    names = [f.name for f in fields(settings_cls) if f.name not in ALLOWED]
    given = [name for name in names if getattr(args, name, None) is not None]  # as pick_settings reads them
    if getattr(args, "quick", False):
        given.append("quick")
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise SystemExit(f"--pool re-reads earlier runs: {flags} would change nothing; leave them out")


def pooled(
    paths: list[str], settings_cls: type, target: float | None
) -> tuple[Any, list[dict[str, Any]], float]:
    """The files' settings (seeds: all of theirs; target: `target`), their runs, the score before training."""
    names = [f.name for f in fields(settings_cls)]
    first: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = []
    seen: dict[tuple[Any, ...], str] = {}
    for path in paths:
        payload = json.loads(Path(path).read_text())
        config = payload.get("config", {})
        if "curves" not in payload or "before" not in config:
            raise SystemExit(f"{path}: not a `bench time-to-score --json` file (no curves or config.before)")
        first = first or config
        for name in [*names, "before", "quick"]:
            if name not in FREE and config.get(name) != first.get(name):
                raise SystemExit(
                    f"{path}: config.{name} is {config.get(name)!r}, the first file's {first.get(name)!r}"
                )
        for run in payload["curves"]:
            key = tuple(run[k] for k in RUN_KEYS)
            if key in seen:
                raise SystemExit(f"{path}: run {dict(zip(RUN_KEYS, key, strict=True))} is in {seen[key]} too")
            seen[key] = path
            runs.append(run)
    if first is None:
        raise SystemExit("--pool needs at least one file")
    settings = {name: _tuples(first[name]) for name in names if name not in FREE}
    settings |= {"seeds": tuple(sorted({run["seed"] for run in runs})), "target": target}
    return settings_cls(**settings), runs, float(first["before"])
