"""The driver is killed (SIGKILL) after a checkpoint; `rollart train --resume` continues from it.

The run trains with `backends.training: megatron` at `tensor_parallel: 2` (a Megatron-core GPTModel split
over two TrainWorker actors under gloo): the product path of that backend, its HF-named checkpoints and
its whole (gathered) optimiser state, end to end.

Asserted: the resumed trainer holds exactly the checkpoint's weights (the hash recorded at save time)
and optimiser state (the saved file's hash); the step the killed driver recorded after the checkpoint
is discarded and redone, so the step rows are 1..N, each once, none skipped.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from engine.train.fingerprint import saved_optimizer_sha256
from infra.metadata import MetadataStore
from tests.integration.runs import tiny_config

STEPS = 5


def rollart(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`rollart ARGS` in its own session (so the test can kill it and everything it started)."""
    env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    exe = Path(sys.executable).parent / "rollart"
    with open(log, "w") as out:
        return subprocess.Popen(
            [str(exe), *args], env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )


def session_alive(sid: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "sid=,pid=,comm="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if int(line.split()[0]) == sid]


def test_kill_after_a_checkpoint_then_resume_continues_exactly(prefect_api, tmp_path):
    cfg = tiny_config(tmp_path, "killed", train={"steps": STEPS, "checkpoint_every": 2})
    cfg["resources"]["roles"]["actor_gen"]["count"] = 1
    cfg["backends"].update(training="megatron", tensor_parallel=2)
    cfg["resources"]["pools"][0]["capacity"] = 2  # the compute pool: a unit for each trainer rank
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "runs" / "killed"
    db = run_dir / "metadata.db"

    first = rollart(["train", str(path)], prefect_api, tmp_path / "first.log")
    deadline = time.monotonic() + 400
    store = None
    while True:  # kill once step 3 is recorded: the checkpoint of step 2 exists, step 3 is past it
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the first run did not reach step 3"
        if db.exists():
            store = store or MetadataStore(f"sqlite:///{db}")
            if any(s["step"] == 3 for s in store.steps("killed")):
                break
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    t0 = time.monotonic()
    while session_alive(first.pid) and time.monotonic() - t0 < 30:  # Ray's processes die with the driver
        time.sleep(0.5)
    assert session_alive(first.pid) == []

    trainers = {b.worker: b.pool for b in store.bindings("killed") if b.role == "actor_train"}
    assert trainers == {"train-0": "compute", "train-1": "compute"}  # the two ranks of the one trainer
    ck = store.latest_checkpoint("killed")
    rows = [s["step"] for s in store.steps("killed")]
    assert ck["step"] == 2 and rows[:3] == [1, 2, 3] and len(rows) <= 4

    second = rollart(["train", str(path), "--resume"], prefect_api, tmp_path / "second.log")
    assert second.wait(timeout=400) == 0, (tmp_path / "second.log").read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    resumed = summary["resumed"]
    assert resumed["step"] == 2 and resumed["version"] == 2
    assert resumed["weights_sha256"] == ck["weights_sha256"]  # as the killed trainer had them at save
    assert resumed["optimizer_sha256"] == saved_optimizer_sha256(ck["uri"])
    assert resumed["steps_discarded"] == len(rows) - 2  # step 3 (and 4, if it got there) redone
    # the scheduler's RNG came back too: the resumed run draws the groups after the saved ones
    saved = json.loads((Path(ck["uri"]) / "state.json").read_text())["extra"]["scheduler"]
    assert resumed["scheduler_restored"] and saved["next_group"] >= 2 * cfg["train"]["batch_groups"]
    steps = store.steps("killed")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))  # none repeated, none skipped
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    # the mode's guarantee holds across the restart too (rollart, α = 1: nothing older than one version)
    assert all(s["metrics"]["staleness_max"] <= 1 for s in steps), [
        s["metrics"]["staleness_max"] for s in steps
    ]
    assert summary["steps_this_run"] == STEPS - 2 and store.latest_checkpoint("killed")["step"] == STEPS
