"""What every sandbox backend shares: the result of a run, the error of a backend that cannot run, the
interface (`Sandbox`) the code env calls whatever runs the code: bubblewrap here, a pod on a cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class SandboxUnavailable(RuntimeError):
    """The configured sandbox cannot run code: bubblewrap or the interpreter layout it needs is missing on
    this host, or the Kubernetes cluster is not reachable or refused a call. The message is one line."""


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed before the program could report one
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None  # "timeout" (wall clock) or "output" (over max_output), else None
    wall_s: float


class Sandbox(Protocol):
    """A backend that runs untrusted Python: `backends.sandbox` names which one."""

    def run_python(
        self,
        code: str,
        stdin: str = "",
        *,
        timeout_s: float = 5.0,
        cpu_s: int = 5,
        memory_bytes: int = 256 << 20,
        max_output: int = 64 << 10,
        tmp_bytes: int = 16 << 20,
    ) -> SandboxResult:
        """Run `code` as a script under `python -I -S`, `stdin` on its standard input, within the limits:
        wall clock, CPU seconds, address space, output kept (each stream) and /tmp size."""
        ...

    def warmup(self) -> dict[str, Any]:
        """Get ready to run code (and prove it can): what was checked or prepared, for the run's log."""
        ...
