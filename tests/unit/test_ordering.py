"""tests/ordering.py: modules longest first by tests/durations.json, a module's tests kept in order."""

import json
from types import SimpleNamespace

from tests import ordering


def test_modules_go_longest_first_unknown_ones_last_and_each_keeps_its_order(tmp_path, monkeypatch):
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/b.py": 5.0, "tests/c.py": 120.0}))
    monkeypatch.setattr(ordering, "DURATIONS", durations)
    ids = [
        "tests/a.py::x",
        "tests/b.py::x",
        "tests/b.py::y",
        "tests/c.py::x",
        "tests/c.py::y",
        "tests/d.py::x",
    ]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    ordering.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/c.py::x",
        "tests/c.py::y",
        "tests/b.py::x",
        "tests/b.py::y",
        "tests/a.py::x",  # not listed: last, in collection order
        "tests/d.py::x",
    ]


def test_the_recorder_writes_each_modules_seconds_longest_first(tmp_path):
    recorder = ordering._Recorder(tmp_path / "out.json")
    for nodeid, seconds in [("tests/a.py::x", 1.0), ("tests/b.py::x", 2.5), ("tests/a.py::y", 0.5)]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))  # type: ignore[arg-type]
    recorder.pytest_sessionfinish(SimpleNamespace())  # type: ignore[arg-type]
    assert json.loads((tmp_path / "out.json").read_text()) == {"tests/b.py": 2.5, "tests/a.py": 1.5}
