import json
import subprocess
import sys

import pytest
import sqlalchemy

from infra.metadata import MetadataStore, PoolsExhausted


@pytest.fixture
def store(store_url):
    s = MetadataStore(store_url)
    s.upsert_pool("compute", "gpu-compute", 2, "rollart_pool_compute")
    s.upsert_pool("bandwidth", "gpu-bandwidth", 1, "rollart_pool_bandwidth")
    yield s
    s.close()


def test_reserve_prefers_then_falls_back_then_refuses(store):
    a = store.reserve("r", "gen-0", "actor_gen", ["bandwidth", "compute"], 1)
    b = store.reserve("r", "gen-1", "actor_gen", ["bandwidth", "compute"], 1)
    assert (a.pool, a.fallback) == ("bandwidth", False)
    assert (b.pool, b.preferred_pool, b.fallback) == ("compute", "bandwidth", True)
    with pytest.raises(PoolsExhausted, match=r"needs 2 unit\(s\); free units: bandwidth 0, compute 1"):
        store.reserve("r", "gen-2", "actor_gen", ["bandwidth", "compute"], 2)
    assert store.pool_usage() == {"compute": (1, 2), "bandwidth": (1, 1)}
    store.set_binding(a.id, state="released")
    assert store.pool_usage()["bandwidth"] == (0, 1)
    rows = {r.worker: r for r in store.bindings("r")}
    assert rows["gen-0"].state == "released" and rows["gen-1"].state == "active"


def test_release_run_and_step_rows_are_unique(store):
    store.reserve("r1", "w0", "reward", ["compute"], 1)
    store.reserve("r2", "w0", "reward", ["compute"], 1)
    assert store.release_run("r1") == 1
    assert [r.state for r in store.bindings("r2")] == ["active"]
    store.record_step("r1", 1, 1, {"loss": 0.5}, 2.0)
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        store.record_step("r1", 1, 1, {"loss": 0.5}, 2.0)
    assert store.steps("r1") == [{"step": 1, "version": 1, "metrics": {"loss": 0.5}, "wall_s": 2.0}]
    store.record_checkpoint("r1", 5, "/ck/5", "ab" * 32)
    store.record_checkpoint("r1", 10, "/ck/10")
    assert store.latest_checkpoint("r1")["uri"] == "/ck/10"
    assert store.latest_checkpoint("other") is None


READER = """
import json, sys
from infra.metadata import MetadataStore
rows = MetadataStore(sys.argv[1]).bindings(state="active")
print(json.dumps([[r.worker, r.pool, r.fallback] for r in rows]))
"""

RESERVER = """
import sys
from infra.metadata import MetadataStore, PoolsExhausted
s = MetadataStore(sys.argv[1])
got = 0
for i in range(4):
    try:
        s.reserve("race", f"{sys.argv[2]}-{i}", "actor_gen", ["compute", "bandwidth"], 1)
        got += 1
    except PoolsExhausted:
        pass
print(got)
"""


def test_bindings_are_readable_live_from_another_process(store):
    store.reserve("r", "gen-0", "actor_gen", ["bandwidth", "compute"], 1)
    store.reserve("r", "gen-1", "actor_gen", ["bandwidth", "compute"], 1)
    out = subprocess.run(
        [sys.executable, "-c", READER, store.url], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [["gen-0", "bandwidth", False], ["gen-1", "compute", True]]


def test_concurrent_processes_never_overcommit_a_pool(store):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RESERVER, store.url, f"p{i}"], stdout=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    granted = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert sum(granted) == 3  # capacity: compute 2 + bandwidth 1, out of 12 requests
    assert store.pool_usage() == {"compute": (2, 2), "bandwidth": (1, 1)}


def test_discard_steps_after_a_checkpoint_keeps_earlier_rows(tmp_path):
    store = MetadataStore(f"sqlite:///{tmp_path}/m.db")
    for step in range(1, 6):
        store.record_step("r", step, step, {"loss": 0.0}, 1.0)
    store.record_step("other", 4, 4, {}, 1.0)
    assert store.discard_steps_after("r", 3) == 2
    assert [s["step"] for s in store.steps("r")] == [1, 2, 3]
    assert [s["step"] for s in store.steps("other")] == [4]
    store.record_step("r", 4, 4, {"loss": 1.0}, 1.0)  # the resumed run records step 4 again, once
    assert [s["step"] for s in store.steps("r")] == [1, 2, 3, 4]
