"""Run a Mooncake master (plus its HTTP metadata server) as subprocesses on one address (127.0.0.1 unless
told otherwise: a multi-machine run names the driver machine's private address).

Why two processes: in mooncake-transfer-engine 0.3.13 the master's built-in metadata server
(`--enable_http_metadata_server`) ignores `--http_metadata_server_host` and listens on 0.0.0.0. The
package's own Python metadata server binds to the host it is given, so we run that on `host` and keep
every listener of the master (`--rpc_address`, `--metrics_host`) on `host` too.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.ports import free_ports


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def find_master_binary() -> Path:
    """`mooncake_master` next to this interpreter (venv bin/), else inside the installed package."""
    candidates = [Path(sys.executable).parent / "mooncake_master"]
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "mooncake_master" for p in spec.submodule_search_locations]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        "mooncake_master not found (looked at: "
        + ", ".join(map(str, candidates))
        + "); install the mooncake-transfer-engine-non-cuda wheel"
    )


class MooncakeMaster:
    """A Mooncake master for this machine: `with MooncakeMaster() as m: MooncakeStore(m.master_addr, ...)`.

    `lease_ttl_ms` is how long a read keeps an object from being removed or evicted; it must exceed the
    slowest read of one value (else the read fails with LEASE_EXPIRED).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        lease_ttl_ms: int = 20_000,
        log_dir: Path | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        self.host = host
        self.lease_ttl_ms = lease_ttl_ms
        self.startup_timeout_s = startup_timeout_s
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="mooncake-master-"))
        self.rpc_port = self.metadata_port = 0
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_addr(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> MooncakeMaster:
        if self._procs:
            raise RuntimeError(f"Mooncake master already running (pids {self.pids})")
        self.rpc_port, self.metadata_port, metrics_port = free_ports(self.host, 3)
        master = [
            str(find_master_binary()),
            f"--rpc_address={self.host}",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_host={self.host}",
            f"--metrics_port={metrics_port}",
            "--enable_metric_reporting=false",
            f"--default_kv_lease_ttl={self.lease_ttl_ms}",
            "--logtostderr",
        ]
        metadata = [sys.executable, "-m", "mooncake.http_metadata_server", "--host", self.host]
        metadata += ["--port", str(self.metadata_port), "--log-level", "WARNING"]
        try:
            for name, cmd, port in (
                ("master", master, self.rpc_port),
                ("metadata", metadata, self.metadata_port),
            ):
                self._procs.append(self._spawn(name, cmd))
                self._wait_listening(name, self._procs[-1], port)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.log").open("wb") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _wait_listening(self, name: str, proc: subprocess.Popen[bytes], port: int) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while not _listening(self.host, port):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"Mooncake {name} exited with code {proc.returncode}\n{self._log_tail(name)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Mooncake {name} not listening on {self.host}:{port} "
                    f"after {self.startup_timeout_s:.0f} s\n" + self._log_tail(name)
                )
            time.sleep(0.05)

    def _log_tail(self, name: str, lines: int = 30) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate each process by its PID (kill it if it ignores SIGTERM) and reap it."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs.clear()

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
