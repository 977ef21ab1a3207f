"""Run untrusted (model-written) Python inside bubblewrap: no network, no repo, no secrets, bounded.

The sandbox sees only read-only /usr (with the /lib, /lib64, /bin links) and the interpreter's install
prefix, a private size-capped tmpfs at /tmp, and fresh /proc and /dev. Every namespace bar the user one
is unshared; when we run as root, the program is then started under a uid of its own (no capabilities,
no-new-privs) because root is exempt from RLIMIT_NPROC, and a per-call uid keeps one sandbox's fork
bomb from starving the forks of the others. CPU time, address space, process count and file size are
capped with `prlimit`, which also keeps `preexec_fn` (unsafe in threaded callers) out of the picture.
The wall-clock limit kills the process group; the sandbox's pid namespace then dies with its pid 1
(bwrap `--die-with-parent`), and the call returns only once that pid 1 has exited, which the kernel
allows only after every other process of the namespace is gone: nothing outlives the call.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from infra.sandbox.base import SandboxResult, SandboxUnavailable

_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
_SCRIPT = "/tmp/main.py"
_UID_BASE = 1_000_000  # far above the uids of real accounts
_UID_SLOTS = 256  # per-process slots: uid = base + pid * slots + slot stays below 2**32 for any pid
_uid_counter = itertools.count()
_uid_lock = threading.Lock()


def bwrap_available() -> bool:
    """Whether the `bwrap` binary (Debian package bubblewrap) is on PATH."""
    return shutil.which("bwrap") is not None


def _interpreter() -> tuple[str, str]:
    """The real interpreter binary and its install prefix (venv links and shims resolved)."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not (exe.startswith(prefix + "/") or exe.startswith("/usr/")):
        raise SandboxUnavailable(f"interpreter {exe} lies outside its prefix {prefix} and /usr")
    return exe, prefix


def _next_uid() -> int:
    """A uid no other live sandbox (of any process) holds, so RLIMIT_NPROC counts this one alone."""
    with _uid_lock:
        slot = next(_uid_counter) % _UID_SLOTS
    return _UID_BASE + os.getpid() * _UID_SLOTS + slot


def _mounts(prefix: str, tmp_bytes: int) -> list[str]:
    args: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if not prefix.startswith("/usr/"):
        # Parents of the prefix (e.g. /root) are traversable but not listable inside the sandbox.
        for parent in reversed(Path(prefix).parents[:-1]):
            args += ["--perms", "0711", "--dir", str(parent)]
        args += ["--ro-bind", prefix, prefix]
    args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    return [*args, "--proc", "/proc", "--dev", "/dev"]


def _command(exe: str, prefix: str, code_fd: int, info_fd: int, limits: dict[str, int]) -> list[str]:
    prlimit = [f"--{name}={value}" for name, value in limits.items()]
    env = ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    env += ["--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    if os.geteuid() == 0:
        uid = str(_next_uid())
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup"]
        namespaces += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        drop += ["--inh-caps=-all", "--bounding-set=-all", "--"]
    else:
        namespaces, drop = ["--unshare-all"], []
    return [
        "setpriv", "--pdeathsig", "KILL", "--",  # the sandbox dies with the thread that started it
        "prlimit", *prlimit, "--",
        "bwrap", *namespaces, "--die-with-parent", "--new-session", "--info-fd", str(info_fd),
        *_mounts(prefix, limits["fsize"]), "--perms", "0444", "--ro-bind-data", str(code_fd), _SCRIPT,
        "--clearenv", *env, "--chdir", "/tmp", "--",
        *drop, exe, "-I", "-S", _SCRIPT,
    ]  # fmt: skip


def _pidns_init(info_r: int) -> int | None:
    """A pidfd of the sandbox's pid 1, from bwrap's `--info-fd` JSON (None when bwrap failed first)."""
    with os.fdopen(info_r, "rb") as f:
        raw = f.read()
    try:
        return os.pidfd_open(json.loads(raw)["child-pid"])
    except (ValueError, KeyError, ProcessLookupError):
        return None


def _pump(
    proc: subprocess.Popen[bytes], stdin: bytes, deadline: float, max_output: int
) -> tuple[bytes, bytes, str | None]:
    """Feed stdin and collect output until both pipes close, the deadline passes or output overflows."""
    assert proc.stdin and proc.stdout and proc.stderr
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in out:
        sel.register(fd, selectors.EVENT_READ)
    in_fd, pending = proc.stdin.fileno(), memoryview(stdin)
    if pending:
        os.set_blocking(in_fd, False)
        sel.register(in_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    reason = None
    while reason is None and sel.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = "timeout"
            break
        for key, _ in sel.select(remaining):
            fd = int(key.fd)
            if fd == in_fd:
                try:
                    pending = pending[os.write(fd, pending[:65536]) :]
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    sel.unregister(fd)
                    proc.stdin.close()
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                sel.unregister(fd)
            out[fd] += chunk
            if len(out[fd]) > max_output:
                reason = "output"
    sel.close()
    return bytes(out[proc.stdout.fileno()]), bytes(out[proc.stderr.fileno()]), reason


def _spawn(
    code: str, exe: str, prefix: str, limits: dict[str, int]
) -> tuple[subprocess.Popen[bytes], int | None]:
    """Start the sandbox on `code` (a read-only file in it): the bwrap process, in a session of its own,
    and a pidfd of the sandbox's pid 1 (None when bwrap failed before starting it)."""
    with tempfile.TemporaryFile() as script:
        script.write(code.encode())
        script.seek(0)
        info_r, info_w = os.pipe()
        try:
            proc = subprocess.Popen(
                _command(exe, prefix, script.fileno(), info_w, limits),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(script.fileno(), info_w),
                start_new_session=True,
            )
        except BaseException:
            os.close(info_r)
            raise
        finally:
            os.close(info_w)
        return proc, _pidns_init(info_r)


def _communicate(
    proc: subprocess.Popen[bytes], stdin: bytes, deadline: float, max_output: int
) -> tuple[bytes, bytes, str | None]:
    """`_pump`, then wait for the exit until `deadline`; a program stopped for time or output has its
    process group killed. Returns once the bwrap process has exited."""
    out, err, reason = _pump(proc, stdin, deadline, max_output)
    if reason is None:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            reason = "timeout"
    if reason is not None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return out, err, reason


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 5.0,
    cpu_s: int = 5,
    memory_bytes: int = 256 << 20,
    max_output: int = 64 << 10,
    max_procs: int = 32,
    tmp_bytes: int = 16 << 20,
) -> SandboxResult:
    """Run `code` as a script under `python -I -S` in a fresh sandbox, feeding it `stdin`.

    The code travels as a read-only file (not on stdin) so that the program can read `stdin` itself.
    `max_procs` counts threads too; `tmp_bytes` caps both the /tmp tmpfs and any single written file.
    stdout and stderr are cut at `max_output` bytes each; going over it stops the program.
    """
    if not bwrap_available():
        raise SandboxUnavailable("bwrap not found: install the bubblewrap package (scripts/install.sh)")
    exe, prefix = _interpreter()
    limits = {"cpu": cpu_s, "as": memory_bytes, "nproc": max_procs, "fsize": tmp_bytes, "core": 0}
    start = time.monotonic()
    proc, init = _spawn(code, exe, prefix, limits)
    with proc:
        out, err, reason = _communicate(proc, stdin.encode(), start + timeout_s, max_output)
    if init is not None:
        _wait_exit(init)
    return SandboxResult(
        returncode=None if reason else proc.returncode,
        stdout=out[:max_output].decode(errors="replace"),
        stderr=err[:max_output].decode(errors="replace"),
        timed_out=reason == "timeout",
        killed_reason=reason,
        wall_s=time.monotonic() - start,
    )


def _wait_exit(pidfd: int, timeout_s: float = 10.0) -> None:
    """Block until the process behind `pidfd` has exited (a pidfd turns readable then)."""
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        exited = bool(sel.select(timeout_s))
    os.close(pidfd)
    if not exited:
        raise RuntimeError(f"sandbox pid namespace still alive {timeout_s} s after its bwrap exited")


class Bwrap:
    """`backends.sandbox: bwrap` as a `Sandbox`: `run_python` above; nothing to prepare beyond the binary."""

    run_python = staticmethod(run_python)

    def warmup(self) -> dict[str, Any]:
        return {
            "backend": "bwrap",
            "bubblewrap": shutil.which("bwrap") or "missing (code tasks would be refused)",
        }
