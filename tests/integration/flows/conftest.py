"""Fixtures shared by the flow tests."""

import os
import uuid

import pytest


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect")
    env = {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_MEMO_STORE_PATH": str(home / "memo"),
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "storage"),
        # a new PREFECT_HOME migrates its database before the temporary server answers: on a loaded 2-core
        # machine that overran Prefect's 20 s start-up timeout once ("Timed out while attempting to connect
        # to ephemeral Prefect API server"), as it had for the notebook test
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # Prefect reads its settings from the environment once, when first imported: another test module may
    # have imported it already, so the settings are set here too (the server subprocess reads the env)
    import prefect.settings

    updates = {getattr(prefect.settings, name): value for name, value in env.items()}
    with prefect.settings.temporary_settings(updates=updates):
        yield home
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="package")
def prefect_api(tmp_path_factory, postgres_url):
    """A real `prefect server start` on 127.0.0.1 (its scheduler and automations running), shared by the
    flow tests that run `rollart` in subprocesses, and stopped after them (an idle server's services
    still cost CPU): the environment for those processes, PREFECT_API_URL set.

    Its database is PostgreSQL: on SQLite, the runs, the runner and the server's services writing at once
    stalled it for 60 s at a time ("database is locked", seen in the schedule test here).
    A run that comes due while another holds its deployment's slot is put back by the server for 30 s,
    and a runner polls every 10 s (Prefect's defaults): up to 40 s idle between two runs of one deployment.
    The order of the runs is under test, not those intervals, so both are shortened here."""
    from flows.deploy import start_server
    from tests.services import create_database, free_port

    # a new database each time: with two test processes (`make test`) a process may leave this package and
    # come back to it, and the fixture is then set up again on the same PostgreSQL server
    name = f"prefect_api_{uuid.uuid4().hex[:8]}"
    database = create_database(postgres_url, name).replace("+psycopg", "+asyncpg")
    home = tmp_path_factory.mktemp("prefect-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_API_DATABASE_CONNECTION_URL=database,
        PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS="5",
        PREFECT_RUNNER_POLL_FREQUENCY="2",
    )
    url, proc = start_server(free_port(), home / "server.log", env=env)
    try:
        yield {**env, "PREFECT_API_URL": url}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
