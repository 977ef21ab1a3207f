"""Local services for tests, started on 127.0.0.1 and stopped by PID (PostgreSQL; more join later)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.ports import free_port

# An HTTP call's read timeout for a serving endpoint: the first call waits for a replica to start (and load
# its model), which takes far longer on a loaded 2-core machine than idle; what is tested is the answer.
COLD_CALL_S = 180


def wait_port(port: int, timeout_s: float, what: str, log: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s}s\n{log}")


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise FileNotFoundError(
            f"PostgreSQL '{name}' not found: `make install` installs the postgresql package"
        )
    return found[-1]


@contextmanager
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1; yields its SQLAlchemy URL."""
    as_root = os.geteuid() == 0  # initdb refuses to run as root: run the server as `postgres`
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    data = tempfile.mkdtemp(prefix="rollart-pg-", dir="/tmp")
    if as_root:
        pw = pwd.getpwnam("postgres")
        os.chown(data, pw.pw_uid, pw.pw_gid)
    port = free_port()
    subprocess.run(
        [*prefix, _pg_bin("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    log_path = os.path.join(data, "server.log")
    with open(log_path, "w") as log:
        if as_root:
            os.chown(log_path, pw.pw_uid, pw.pw_gid)
        proc = subprocess.Popen(
            [*prefix, _pg_bin("postgres"), "-D", data, "-h", "127.0.0.1", "-p", str(port), "-k", data],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_port(port, 30, "postgres", log=Path(log_path).read_text()[-2000:])
        _wait_accepting(port, 60, log_path)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        pid_file = os.path.join(data, "postmaster.pid")
        if os.path.exists(pid_file):
            os.kill(
                int(Path(pid_file).read_text().split()[0]), signal.SIGINT
            )  # fast shutdown of the postmaster
        proc.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def _wait_accepting(port: int, timeout_s: float, log_path: str) -> None:
    """Until the server on `port` accepts connections: it listens while it still starts up and refuses
    them ("the database system is starting up", which a CI run's fixtures met on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    ready = [_pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-t", "5"]
    while subprocess.run(ready, capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"postgres on 127.0.0.1:{port} accepted no connection within {timeout_s}s\n"
                + Path(log_path).read_text()[-2000:]
            )
        time.sleep(0.1)


def create_database(server_url: str, name: str) -> str:
    """A new, empty database `name` on the PostgreSQL server of `server_url`; returns its URL."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    return server_url.rsplit("/", 1)[0] + "/" + name
