"""A Prefect server off 127.0.0.1 requires its auth string (what `rollart ui --host` starts).

127.0.0.2 stands for a private interface: another loopback address, so the test stays on loopback and
still tells the configured host from the default."""

import os
import urllib.error
import urllib.request

import psutil
import pytest

from flows.deploy import basic_auth, server_auth, start_server
from tests.services import free_port

HOST = "127.0.0.2"


def status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_server_off_loopback_refuses_a_client_without_the_auth_string(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_SERVER_API_AUTH_STRING", raising=False)
    assert server_auth("127.0.0.1") is None  # only this machine reaches it
    auth = server_auth(HOST)
    assert auth is not None and auth.startswith("rollart:") and auth != server_auth(HOST)  # fresh each time
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    url, proc = start_server(free_port(), tmp_path / "server.log", env=env, host=HOST, auth=auth)
    try:
        listening = {
            c.laddr.ip
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert url.startswith(f"http://{HOST}:") and listening == {HOST}
        assert status(f"{url}/health", {}) == 200  # Prefect leaves its health probe open
        assert status(f"{url}/admin/version", {}) == 401
        assert status(f"{url}/admin/version", basic_auth("rollart:wrong")) == 401
        assert status(f"{url}/admin/version", basic_auth(auth)) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(proc.pid).status()
