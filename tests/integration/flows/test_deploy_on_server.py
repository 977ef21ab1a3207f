"""Schedules that fire: `rollart deploy` against a real `prefect server start` on 127.0.0.1 (its scheduler
and automations running; not the temporary test server), as a user runs retraining.

One process serves the deployment. A run started as from the UI (`prefect deployment run -p` with a changed
config field) and the interval schedule's runs train one at a time (a run that comes due while another
trains waits for it); each resumes from the checkpoint before it and trains two steps further. SIGTERM
while the third one trains stops the runner within SHUTDOWN_S, that run Cancelled and not counted as failed.
Then the auto-resume automation answers a crash event with a resuming run, and ignores one past its limit.
A run slow to hear its runner's cancel (still importing, or holding the GIL) still ends as a cancel
(held_gil.py).
"""

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.services import free_port

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SHUTDOWN_S = (
    120  # a `rollart deploy` runner given SIGTERM, a run in flight, has this long to exit (~15 s here)
)


def experiment(tmp_path: Path) -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "frozenlake.yaml").read_text())
    cfg.update(name="sched", run_root=str(tmp_path / "runs"))
    cfg["model"]["pretrain_steps"] = 0  # a random tiny model: scheduling is under test, not learning
    cfg["tasks"] = [dict(cfg["tasks"][0], group_size=2, max_turns=3, eval_problems=3, eval_samples=1)]
    cfg["rollout"].update(concurrency=8, redundancy=0)
    cfg["train"].update(steps=2, batch_groups=2, checkpoint_every=2, micro_batch=8)
    cfg["backends"].update(generation="hf", weight_store="ray")
    return cfg


async def _runs(client, deployment_id, state: str) -> list:
    """The deployment's top-level runs whose state type is `state`; none of its runs may have failed or
    crashed. Read by state: the interval schedule keeps ~100 future runs, and each poll read them all."""
    from prefect.client.schemas.filters import DeploymentFilter, FlowRunFilter

    def read(*types: str):
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id={"any_": [deployment_id]}),
            flow_run_filter=FlowRunFilter(
                parent_task_run_id={"is_null_": True}, state={"type": {"any_": list(types)}}
            ),
        )

    bad = await read("FAILED", "CRASHED")
    assert not bad, [(r.name, r.state.message) for r in bad]
    return await read(state)


def _emit_crash(env: dict, experiment: str, failures: str) -> None:
    """The event flows/hooks.py emits when a run of `experiment` crashes, sent from another process."""
    code = (
        "from prefect.events import emit_event; emit_event(event='rollart.run.crashed', resource="
        f"{{'prefect.resource.id': 'rollart.experiment.{experiment}', 'rollart.failures': '{failures}'}}, "
        "payload={'reason': 'test', 'last_checkpoint': 2})"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


async def _messages(client, run_ids: list) -> list[str]:
    """Every log line of the runs `run_ids`, page by page (the API answers 200 at most at once)."""
    from prefect.client.schemas.filters import LogFilter

    lines: list[str] = []
    while True:
        page = await client.read_logs(LogFilter(flow_run_id={"any_": run_ids}), limit=200, offset=len(lines))
        lines += [m.message for m in page]
        if len(page) < 200:
            return lines


def _deployed(api_url: str) -> bool:
    """Whether the server at `api_url` answers and has the deployment (one HTTP call: polling with the
    `prefect` CLI cost a process start, seconds of CPU, per poll, taken from the deploy process starting)."""
    try:
        with urllib.request.urlopen(f"{api_url}/deployments/name/rollart-train/sched", timeout=5) as r:
            return r.status == 200
    except OSError:  # not listening yet, or 404 (HTTPError is an OSError)
        return False


def _prefect(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "prefect"), *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(900)  # two training runs in a row and part of a third (~2 minutes here)
async def test_a_deployed_schedule_fires_runs_one_at_a_time_each_resuming_the_last(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra.metadata import MetadataStore

    env = prefect_api
    path = tmp_path / "sched.yaml"
    cfg = experiment(tmp_path)
    path.write_text(yaml.safe_dump(cfg))
    log = (tmp_path / "deploy.log").open("w")
    deploy = subprocess.Popen(
        [str(BIN / "rollart"), "deploy", str(path), "--interval", "30", "--auto-resume", "2"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            async with get_client() as client:
                for _ in range(240):  # the deploy process imports torch and applies the deployment
                    if _deployed(env["PREFECT_API_URL"]):
                        break
                    assert deploy.poll() is None, (tmp_path / "deploy.log").read_text()
                    await asyncio.sleep(1)
                dep = await client.read_deployment_by_name("rollart-train/sched")
                assert dep.global_concurrency_limit.limit == 1  # one run of the experiment at a time
                assert dep.concurrency_options.collision_strategy == "ENQUEUE"  # --overlap wait

                # as from the UI: a changed config field through the typed parameter; a bad one refused
                def run_with_lr(lr: object) -> subprocess.CompletedProcess:
                    config = json.loads(json.dumps(dep.parameters["config"]))
                    config["train"]["lr"] = lr
                    params = json.dumps({"config": config})
                    return _prefect(env, "deployment", "run", "rollart-train/sched", "--params", params)

                bad = run_with_lr("fast")
                assert bad.returncode != 0 and "lr" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
                ui = run_with_lr(0.002)
                assert ui.returncode == 0, ui.stdout + ui.stderr

                done: list = []
                for _ in range(600):  # two runs of ~1 minute each, one after the other
                    done = sorted(await _runs(client, dep.id, "COMPLETED"), key=lambda r: r.start_time)
                    if len(done) >= 2:
                        break
                    assert deploy.poll() is None, (tmp_path / "deploy.log").read_text()
                    await asyncio.sleep(1)
                first, second = done[:2]
                assert first.end_time <= second.start_time
                (automation,) = [
                    a for a in await client.read_automations() if a.name == "rollart auto-resume sched"
                ]
                assert automation.actions[0].deployment_id == dep.id

                # stopped as a process manager stops it, while the next scheduled run trains: that run is
                # cancelled (not left Running, not counted as a failure that auto-resume answers)
                for _ in range(300):
                    if inflight := await _runs(client, dep.id, "RUNNING"):
                        break
                    await asyncio.sleep(1)
                (third,) = inflight
                assert second.end_time <= third.start_time
                # the UI run, its field changed, and two the scheduler fired (in whatever order they came)
                lrs = [r.parameters["config"]["train"]["lr"] for r in (first, second, third)]
                assert sorted(lrs) == sorted([0.002, cfg["train"]["lr"], cfg["train"]["lr"]])
                assert sum(r.auto_scheduled for r in (first, second, third)) == 2
                deploy.terminate()  # what the automation starts now stays scheduled: no runner serves it
                t0 = time.monotonic()
                assert deploy.wait(timeout=SHUTDOWN_S) == 0, (tmp_path / "deploy.log").read_text()[-3000:]
                print(f"a runner stopped with a run in flight exited in {time.monotonic() - t0:.1f} s")
                third = await client.read_flow_run(third.id)
                assert third.state.is_cancelled(), (
                    third.state,
                    (tmp_path / "deploy.log").read_text()[-3000:],
                )
                assert (await client.read_deployment(dep.id)).paused  # the runner paused its schedule
        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            async with get_client() as client:
                # a third failure in a row is past --auto-resume 2: no run; a first one: one run, resuming
                for failures in ("3", "1"):
                    _emit_crash(env, "sched", failures)
                made: list = []
                for _ in range(120):
                    runs = await client.read_flow_runs(
                        deployment_filter=DeploymentFilter(id={"any_": [dep.id]})
                    )
                    made = [r for r in runs if r.created_by and r.created_by.type == "AUTOMATION"]
                    if made:
                        break
                    await asyncio.sleep(1)
                # The one wanted run is there. That no other follows (the "3" event dropped, the "1" event
                # acted on once) is a claim about nothing happening: the server signals no "evaluated and
                # dropped", so this fixed wait is the check itself, not a guess at a duration.
                await asyncio.sleep(5)  # a second, wrong run has 5 s to show up
                runs = await client.read_flow_runs(deployment_filter=DeploymentFilter(id={"any_": [dep.id]}))
                made = [r for r in runs if r.created_by and r.created_by.type == "AUTOMATION"]
                assert len(made) == 1 and made[0].parameters["resume"] is True, [
                    (r.name, r.created, r.created_by) for r in made
                ]
                # what every run that completed logged (a busy machine may let one more complete before
                # the SIGTERM lands: which of them resumed is read from the logs, not assumed)
                completed = [r.id for r in await _runs(client, dep.id, "COMPLETED")]
                logs = await _messages(client, completed)
                # the server is shared with other tests: its scheduler stops making runs of this one
                await client.delete_deployment(dep.id)
                await client.delete_automation(automation.id)
    finally:
        if deploy.poll() is None:
            deploy.terminate()
            deploy.wait(timeout=SHUTDOWN_S)
        log.close()

    store = MetadataStore(f"sqlite:///{tmp_path}/runs/sched/metadata.db")
    rows = store.steps("sched")[:4]
    assert [(r["step"], r["version"]) for r in rows] == [(k, k) for k in range(1, 5)]  # none repeated
    weights = store.latest_checkpoint("sched", 2)["weights_sha256"]
    assert any(m.startswith(f"resumed from step 2: weights {weights[:12]}") for m in logs), logs
    # the cancelled run recorded no failure
    assert [e["kind"] for e in store.events("sched")] == ["completed"] * len(completed)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["importing", "holding", "deaf", "killed"])
def test_a_runners_cancel_is_heard_by_a_run_that_is_slow_to_listen(prefect_api, tmp_path, when):
    """`rollart deploy`'s runner stopped while its run still imports the flow (not listening for a cancel
    yet), or while the run's main thread holds the GIL for 4 s (longer than Prefect's 1 s default for the
    acknowledgement): the runner waits until the run can hear the cancel and confirms it, so the SIGTERM
    after it reaches a run that knows it is a cancel. Unheard, the SIGTERM is taken for a crash, whose hook
    counts a failure that `--auto-resume` answers with another run. A run that never connects ("deaf", as
    one whose imports outlast the runner's wait) does take the SIGTERM for a crash, and its crash hook
    learns that its runner stopped it (flows/runner_stop.py), so records no failure (tests/unit/flows). So
    does the hook the runner runs itself for a run killed while still importing ("killed"), late: a CI run
    saw it count a failure once the runner's stop had returned and the marks were gone."""
    marker = tmp_path / "marker"
    out = subprocess.run(
        [sys.executable, "-m", "tests.integration.flows.held_gil", str(marker), when],
        env={**prefect_api, "HELD_GIL_MARKER": str(marker), "HELD_GIL_WHEN": when},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    heard = when not in ("deaf", "killed")
    assert result == {"acked": [heard], "state": "CANCELLED"}, out.stdout[-3000:] + out.stderr[-3000:]
    if when == "holding":
        assert marker.read_text() == "intent at SIGTERM: cancel"
    if when == "deaf":
        assert marker.read_text() == "intent at SIGTERM: None; crash hook: stopped by its runner: True"
    if when == "killed":
        assert marker.read_text() == "importing; crash hook: stopped by its runner: True"


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(600)
def test_deploy_without_an_api_url_starts_a_server_says_so_and_stops_it_on_sigterm(tmp_path):
    """No PREFECT_API_URL: `rollart deploy` starts `prefect server start` on 127.0.0.1 itself, serves the
    deployment against it, and takes it down when stopped (as a process manager stops it: SIGTERM)."""
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    path = tmp_path / "sched.yaml"
    path.write_text(yaml.safe_dump(experiment(tmp_path)))
    port = free_port()
    out = tmp_path / "deploy.log"
    with out.open("w") as log:
        deploy = subprocess.Popen(
            [str(BIN / "rollart"), "deploy", str(path), "--interval", "3600", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    api = {**env, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    try:
        for _ in range(240):  # the server starts, then the deployment is applied
            if _deployed(api["PREFECT_API_URL"]):
                break
            assert deploy.poll() is None, out.read_text()
            time.sleep(1)
        else:
            raise AssertionError(f"no deployment within 240 s\n{out.read_text()}")
        text = out.read_text()
        assert f"Prefect API: http://127.0.0.1:{port}/api — no PREFECT_API_URL was set" in text, text
        deploy.send_signal(signal.SIGTERM)
        deploy.wait(timeout=90)
        for _ in range(60):
            if not _listening(port):
                break
            time.sleep(0.5)
        assert not _listening(port), "the server this deploy started outlived it"
    finally:
        if deploy.poll() is None:
            deploy.kill()
            deploy.wait(timeout=30)
        # a server left behind by a failed run of this test is stopped too (matched by its port)
        subprocess.run(["pkill", "-f", f"server start --host 127.0.0.1 --port {port}"], check=False)
