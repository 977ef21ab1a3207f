"""Longest modules first, so that two test processes end together.

`make test` hands whole modules to two processes (`--dist loadfile`). xdist's default order puts the
modules with the most tests first, which leaves the long end-to-end modules (one or two tests, one to
three minutes each) for the end: one process ran a two-minute module while the other had finished,
about two minutes idle in a sixteen-minute run. Here modules are ordered by their seconds in
`tests/durations.json` (longest first; a module not listed yet goes last, in collection order), and
`make test` passes `--no-loadscope-reorder` so xdist keeps this order. The file only orders the run:
a stale or missing entry changes when a module runs, never whether it passes.

Refresh it after adding a long module: `make test PYTEST_ARGS="--write-durations tests/durations.json"`
(seconds per module, setup and teardown included, as that run measured them).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-durations",
        metavar="PATH",
        default=None,
        help="write each test module's seconds (setup, call and teardown) to PATH as JSON",
    )


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: -float(seconds.get(module_of(item.nodeid), 0.0)))  # stable: ties keep order


class _Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        ordered = dict(sorted(((m, round(s, 1)) for m, s in self.seconds.items()), key=lambda kv: -kv[1]))
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--write-durations")
    if path and not hasattr(config, "workerinput"):  # the controller: the workers' reports reach it
        config.pluginmanager.register(_Recorder(Path(path)), "rollart-durations")
