import os
from pathlib import Path
from types import SimpleNamespace
from uuid import uuid4

import pytest

import flows.hooks
from engine.config import load_config
from flows.runner_stop import STOPPED_RUNS, mark_stopped, release_stop_dir, share_stop_dir, stopped_by_runner
from infra.metadata import MetadataStore

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def stop_dir(monkeypatch):
    monkeypatch.delenv(STOPPED_RUNS, raising=False)
    path = share_stop_dir()
    yield path
    release_stop_dir()
    assert not path.exists() and STOPPED_RUNS not in os.environ


def test_a_crash_the_runner_caused_by_stopping_the_run_is_no_failure(tmp_path, monkeypatch, stop_dir):
    """The run took its runner's SIGTERM for a crash (it never heard the cancel intent): nothing is counted,
    no event fires; a crash of another run of the same runner is recorded and emitted with its count."""
    emitted: list[dict] = []
    monkeypatch.setattr(flows.hooks, "emit_event", lambda **kw: emitted.append(kw))
    cfg = load_config(ROOT / "configs" / "frozenlake.yaml", [f"run_root={tmp_path}", "name=hk"])
    cfg.run_dir.mkdir(parents=True)
    stopped, crashed = uuid4(), uuid4()
    mark_stopped([stopped])
    assert stopped_by_runner(stopped) and stopped_by_runner(str(stopped)) and not stopped_by_runner(crashed)
    state = SimpleNamespace(message="Crash detected! Execution was aborted.", name="")
    for run_id in (stopped, crashed):
        run = SimpleNamespace(id=run_id, parameters={"config": cfg.model_dump(mode="json")})
        flows.hooks.record_crash(None, run, state)

    store = MetadataStore(cfg.metadata_url())
    try:
        assert [(e["kind"], e["flow_run_id"]) for e in store.events("hk")] == [("crashed", str(crashed))]
    finally:
        store.close()
    assert [e["resource"]["rollart.failures"] for e in emitted] == ["1"]
    assert emitted[0]["related"][0]["prefect.resource.id"] == f"prefect.flow-run.{crashed}"


def test_outside_a_runner_no_run_counts_as_stopped(monkeypatch):
    monkeypatch.delenv(STOPPED_RUNS, raising=False)
    assert not stopped_by_runner(uuid4())
