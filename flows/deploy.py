"""Schedules and the UI.

`rollart deploy` serves the train flow as a deployment named after the experiment, on a cron or interval
schedule; every scheduled run resumes the experiment from its latest checkpoint and trains `train.steps`
more steps. Schedules fire only where a Prefect server runs its scheduler: `rollart deploy` uses the server
that `PREFECT_API_URL` names, or starts one on 127.0.0.1 (as `rollart ui` does) and says which. One run of
an experiment at a time (`concurrency_limit=1`): a run due while another trains waits for it (`--overlap
wait`) or is cancelled (`--overlap cancel`). `--auto-resume N` adds an automation that re-runs the
deployment (resuming) when a run fails or crashes, at most N times in a row (flows/hooks.py emits the
events it matches: `rollart.failures` counts the failed runs since the last completed one).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from uuid import UUID

from engine.config import load_config
from flows.runner_stop import mark_stopped, release_stop_dir, share_stop_dir

OVERLAP = ("wait", "cancel")
LOOPBACK = "127.0.0.1"


def deployment(
    config: str,
    overrides: list[str],
    cron: str | None = None,
    interval: float | None = None,
    overlap: str = "wait",
) -> Any:
    """The train flow as a scheduled deployment named after the experiment (not yet applied/served); its
    default parameters are the resolved config, which a run started from the UI may change field by field."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    from flows.train import train

    cfg = load_config(config, overrides)
    if not cron and not interval:
        raise ValueError("a schedule needs --cron or --interval")
    if overlap not in OVERLAP:
        raise ValueError(f"--overlap is one of {', '.join(OVERLAP)}; got {overlap!r}")
    strategy = ConcurrencyLimitStrategy.ENQUEUE if overlap == "wait" else ConcurrencyLimitStrategy.CANCEL_NEW
    return train.to_deployment(
        name=cfg.name,
        cron=cron,
        interval=interval,
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=strategy),
        parameters={"config": cfg.model_dump(mode="json"), "resume": True, "more_steps": cfg.train.steps},
        description=f"scheduled retraining of {cfg.name}: resume from the latest checkpoint, "
        f"then {cfg.train.steps} more steps",
        enforce_parameter_schema=True,  # a run started from the UI with a bad field is refused, naming it
        _sync=True,  # a RunnerDeployment even when called from async code
    )


def auto_resume(deployment_id: UUID, experiment: str, times: int) -> UUID:
    """Create (or replace) the automation that runs the deployment again, resuming, when a run of
    `experiment` fails or crashes, while fewer than `times` have failed in a row. Returns its id."""
    from prefect.automations import Automation, EventTrigger, Posture, RunDeployment

    if times < 1:
        raise ValueError(f"--auto-resume needs at least 1 retry; got {times}")
    name = f"rollart auto-resume {experiment}"
    with contextlib.suppress(ValueError):  # ValueError: none of that name yet
        Automation.read(name=name).delete()
    automation = Automation(
        name=name,
        description=f"re-run {experiment} with resume=True after a failed or crashed run, "
        f"{times}x in a row at most",
        trigger=EventTrigger(
            expect={"rollart.run.failed", "rollart.run.crashed"},
            match={
                "prefect.resource.id": f"rollart.experiment.{experiment}",
                "rollart.failures": [str(k) for k in range(1, times + 1)],
            },
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[RunDeployment(source="selected", deployment_id=deployment_id, parameters={"resume": True})],
    ).create()
    return automation.id


def _prefect() -> str:
    return shutil.which("prefect", path=os.path.dirname(sys.executable)) or "prefect"


def start_server(
    port: int,
    log: Path,
    timeout_s: float = 180.0,
    env: dict[str, str] | None = None,
    host: str = LOOPBACK,
    auth: str | None = None,
) -> tuple[str, subprocess.Popen[bytes]]:
    """`prefect server start` on `host` in the background (output to `log`, environment `env` or this
    process's); returns its API URL once it answers, and the process (the caller stops it). `auth`
    ("user:password"): the server refuses every request without it (Prefect's API auth string)."""
    env = dict(os.environ if env is None else env)
    if auth:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [_prefect(), "server", "start", "--host", host, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://{host}:{port}/api"
    health = urllib.request.Request(f"{url}/health", headers=basic_auth(auth))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the Prefect server exited ({proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200:
                        return url, proc
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the Prefect server did not answer at {url} within {timeout_s:.0f} s; see {log}")
    except BaseException:  # not up in time, or interrupted (SIGTERM, Ctrl-C): nothing left running
        proc.terminate()
        raise


def basic_auth(auth: str | None) -> dict[str, str]:
    """The header a client sends with Prefect's auth string (what `PREFECT_API_AUTH_STRING` makes it send)."""
    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}


def server_auth(host: str) -> str | None:
    """The auth string a server on `host` requires: none on 127.0.0.1, which only this machine reaches;
    anywhere else `PREFECT_SERVER_API_AUTH_STRING`, or a fresh one."""
    if host == LOOPBACK:
        return None
    return os.environ.get("PREFECT_SERVER_API_AUTH_STRING") or f"rollart:{secrets.token_urlsafe(24)}"


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


CANCEL_ACK_S = 15.0  # how long a runner's cancel waits for the run to confirm it (Prefect's default: 1 s)


def runner(ack_timeout_s: float = CANCEL_ACK_S) -> Any:
    """The Prefect runner that `rollart deploy` serves with: it pauses the schedule when stopped, and its
    cancel of a run in flight waits up to `ack_timeout_s` for the run's acknowledgement before the SIGTERM.

    A run marks that SIGTERM as a cancel only if it acknowledged the runner's cancel intent first, on the
    control channel's thread. While the run's main thread holds the GIL in a long C call (an extension
    module loading, Ray starting: seconds on a busy machine) that thread cannot answer; after Prefect's 1 s
    the runner sent SIGTERM anyway, and the run ended as a crash whose hook counted a failure that the
    auto-resume automation answered with an extra run (a `make test` run saw exactly that). A run deaf for
    longer still learns of the stop from flows/runner_stop.py, whose directory its process inherits."""
    from prefect.runner import Runner
    from prefect.runner._control_channel import ControlChannel

    share_stop_dir()
    serving = Runner(pause_on_shutdown=True)
    serving._control_channel = ControlChannel(ack_timeout=ack_timeout_s)  # wired into the runner at start()
    return serving


async def stop_runner(serving: Any, started: asyncio.Task[None]) -> None:
    """Stop a `runner()` whose `start()` is the task `started`: cancel its runs in flight, each once it can
    hear the cancel, pause its schedule, and return once `started` has ended.

    A run still starting cannot: its SIGTERM would land before the run installed Prefect's handler (the
    process dies, nothing recorded), or after that but before the runner saw the run connect, where the
    run takes it for a crash and its hook counts a failure. So first wait until each run the runner
    launched listens on its control channel or has ended (at most as long as the runner waits for an ack).
    A run still deaf after that finds its id among the stopped runs (flows/runner_stop.py) when its crash
    hook runs, and so do the crash hooks the runner itself runs for a run killed before it could report
    (they run after its process exited, after `astop` may have returned: the marks are kept until the
    runner has finished, which a CI run saw answered with an extra run when they were not)."""
    deadline = time.monotonic() + serving._control_channel._ack_timeout
    while time.monotonic() < deadline:
        runs = list(serving._control_channel._registrations.values())
        if all(r.connected.is_set() or r.disconnected.is_set() for r in runs):
            break
        await asyncio.sleep(0.1)
    mark_stopped(serving._process_manager.flow_run_ids())
    await serving.astop()
    await started  # its runs' tasks have ended, their crash hooks too: no hook is left to read the marks
    release_stop_dir()


async def _serve(dep: Any) -> None:
    """Run the deployment's scheduled runs until SIGTERM or Ctrl-C, then stop as a process manager expects:
    a run in flight is cancelled (Cancelled on the server, its process and Ray cluster gone; the next run
    resumes from its last checkpoint), the schedule is paused, and the process exits.

    Prefect's `serve` does not: its SIGTERM handler calls the runner's `stop()` from inside the event loop,
    which makes a coroutine that nothing awaits, so the run in flight was left Running on the server or the
    exit waited for it to end (a `make test` run saw no exit within 240 s)."""
    serving_runner = runner()
    await serving_runner.aadd_deployment(dep)
    serving = asyncio.create_task(serving_runner.start())
    await asyncio.sleep(0)  # start()'s first step installs Prefect's SIGTERM handler; these replace it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"serving rollart-train/{dep.name}; SIGTERM or Ctrl-C stops it, cancelling a run in flight")
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    while stop.is_set() and not serving_runner.started and not serving.done():  # stopped while it started
        await asyncio.sleep(0.1)
    if stop.is_set() and serving_runner.started:
        print("stopping: cancelling the runs in flight and pausing the schedule")
        await stop_runner(serving_runner, serving)
    await serving


def serve_deployment(
    config: str,
    overrides: list[str],
    cron: str | None,
    interval: float | None,
    overlap: str = "wait",
    resume_times: int = 0,
    port: int = 4200,
) -> None:
    """Serve the deployment until interrupted, against `PREFECT_API_URL` or a server started here."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    # SIGTERM before `_serve` installs its own handler (while the deployment is being applied) would end
    # this process at once, skipping the `finally` below and leaving the server it started running
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    url, server = PREFECT_API_URL.value(), None
    if url:
        print(f"Prefect API: {url} (from PREFECT_API_URL); its scheduler fires the runs")
    else:
        log = Path(PREFECT_HOME.value()) / "rollart-server.log"
        url, server = start_server(port, log)
        print(
            f"Prefect API: {url} — no PREFECT_API_URL was set, so this process started a Prefect server "
            f"(UI http://127.0.0.1:{port}, log {log}); it stops with this process"
        )
    try:
        with temporary_settings({PREFECT_API_URL: url}):
            dep = deployment(config, overrides, cron, interval, overlap)
            if resume_times:
                automation = auto_resume(dep.apply(), dep.name, resume_times)
                print(f"auto-resume: automation {automation}, at most {resume_times} runs in a row")
            asyncio.run(_serve(dep))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


def ui(port: int = 4200, host: str = LOOPBACK) -> int:
    """Start a Prefect server on `host` (foreground) and print its URL; off loopback it requires an auth
    string (`server_auth`), printed once for the clients to set."""
    auth = server_auth(host)
    print(f"Prefect UI: http://{host}:{port}  (set PREFECT_API_URL=http://{host}:{port}/api to use it)")
    env = dict(os.environ)
    if auth:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
        print(f"it requires an auth string: clients set PREFECT_API_AUTH_STRING={auth}")
    return subprocess.call([_prefect(), "server", "start", "--host", host, "--port", str(port)], env=env)
