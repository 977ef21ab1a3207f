"""Containment of infra.sandbox on the real bubblewrap: no reads, writes, network or survivors outside it."""

import json
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infra.sandbox import SandboxUnavailable, bwrap_available, run_python

ROOT = Path(__file__).resolve().parents[3]

# Prints {path: exception name or "read"} for every path the code tries to open.
_TRY_READ = """
import json, sys
seen = {}
for path in sys.stdin.read().split():
    try:
        open(path, "rb").read()
        seen[path] = "read"
    except OSError as e:
        seen[path] = type(e).__name__
print(json.dumps(seen))
"""


def _sandbox_uid_procs(uid: int) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]


@pytest.fixture
def repo_secret() -> Iterator[Path]:
    """A readable file in the repo's .tmp (outside /tmp, which the sandbox replaces by its own tmpfs)."""
    folder = ROOT / ".tmp" / f"sandbox-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    secret = folder / "secret.txt"
    secret.write_text("s3cret")
    yield secret
    shutil.rmtree(folder)


def test_runs_code_with_its_stdin_and_a_minimal_env():
    assert bwrap_available()
    code = "import os, sys\nprint(sys.stdin.read()[::-1])\nprint(sorted(os.environ))\nprint(os.getcwd())"
    r = run_python(code, "abc")
    # PWD comes from bwrap's --chdir, LC_CTYPE from Python's own C-locale coercion (PEP 538).
    env = "['HOME', 'LC_CTYPE', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE']"
    assert r.stdout.splitlines() == ["cba", env, "/tmp"]
    assert (r.returncode, r.timed_out, r.killed_reason, r.stderr) == (0, False, None, "")


def test_cannot_read_repo_home_or_credentials(repo_secret: Path, tmp_path: Path):
    (tmp_path / "host_tmp.txt").write_text("x")
    paths = [
        str(repo_secret),
        str(ROOT / "pyproject.toml"),
        str(Path.home() / ".ray" / "auth_token"),
        str(Path.home() / ".bashrc"),
        "/etc/shadow",
        "/etc/passwd",
        str(tmp_path / "host_tmp.txt"),
    ]
    r = run_python(_TRY_READ, " ".join(paths))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == dict.fromkeys(paths, "FileNotFoundError")
    listing = run_python("import os\nprint(sorted(os.listdir('/')))\nos.listdir('/root')")
    assert listing.stdout.strip() == "['bin', 'dev', 'lib', 'lib64', 'proc', 'root', 'tmp', 'usr']"
    assert "PermissionError" in listing.stderr  # /root only leads, untraversable, to the interpreter prefix


def test_no_network_not_even_loopback():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (
            "import socket, sys\n"
            "print(socket.if_nameindex())\n"
            "for target in (('127.0.0.1', int(sys.stdin.read())), ('example.com', 80)):\n"
            "    try:\n"
            "        socket.create_connection(target, timeout=2)\n"
            "        print('connected')\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n"
        )
        r = run_python(code, str(port))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    # Its own loopback (bwrap brings lo up) has no listener on the port; no DNS without /etc or a route.
    assert r.stdout.splitlines() == ["[(1, 'lo')]", "ConnectionRefusedError", "gaierror"]


def test_cannot_write_outside_its_tmpfs():
    code = (
        "import os, sys\n"
        "for path in ('/usr/x', '/x', sys.prefix + '/x', '/root/x', '/proc/x'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print(path, 'written')\n"
        "    except OSError as e:\n"
        "        print(path, type(e).__name__)\n"
        "open('/tmp/ok', 'w').write('y' * 1000)\n"
        "print(os.path.getsize('/tmp/ok'))\n"
        "try:\n"
        "    open('/tmp/big', 'w').write('z' * (2 << 20))\n"
        "except OSError as e:\n"
        "    print('big', e.errno)\n"
    )
    r = run_python(code, tmp_bytes=1 << 20)
    lines = r.stdout.splitlines()
    assert all(not line.endswith("written") for line in lines[:5]), lines
    assert lines[5:] == ["1000", "big 28"]  # ENOSPC: the tmpfs holds tmp_bytes at most


def test_infinite_loop_is_killed_by_the_wall_clock():
    r = run_python("while True:\n    pass", timeout_s=1.0, cpu_s=30)
    assert (r.timed_out, r.killed_reason, r.returncode) == (True, "timeout", None)
    assert 1.0 <= r.wall_s < 10.0


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock():
    r = run_python("while True:\n    pass", timeout_s=20.0, cpu_s=1)
    assert not r.timed_out and r.killed_reason is None
    assert r.returncode not in (0, None)
    assert r.wall_s < 15.0


def test_process_limit_and_no_survivors():
    # The main process counts as one of max_procs=8, so exactly 7 forks succeed; the children sleep on.
    code = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except BlockingIOError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(100)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(os.getuid(), n)\n"
    )
    before = _children()
    r = run_python(code, max_procs=8)
    uid, forks = map(int, r.stdout.split())
    assert (r.returncode, forks) == (0, 7)
    assert _sandbox_uid_procs(uid) == []
    assert _children() <= before  # nothing new outlives the call


def _children() -> set[int]:
    """This process's descendants (other tests in the same session may have left services running)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_fork_bomb_is_killed_and_leaves_nothing_behind():
    code = "import os, sys\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n        os.fork()\n"
    code += "    except OSError:\n        pass\n"
    before = _children()
    r = run_python(code, timeout_s=2.0, max_procs=16)
    assert r.timed_out
    uid = int(r.stdout.split()[0])
    assert _sandbox_uid_procs(uid) == []
    assert _children() <= before


def test_memory_hog_hits_the_address_space_limit():
    r = run_python("b = bytearray(512 << 20)\nprint('allocated')", memory_bytes=256 << 20)
    assert (r.returncode, r.stdout, r.timed_out) == (1, "", False)
    assert r.stderr.strip().endswith("MemoryError")


def test_huge_output_is_truncated_and_stopped():
    r = run_python("import sys\nwhile True:\n    sys.stdout.write('y' * 4096)", max_output=1000)
    assert (r.killed_reason, r.stdout, r.timed_out) == ("output", "y" * 1000, False)
    small = run_python("print('y' * 999, end='')", max_output=1000)
    assert (small.stdout, small.killed_reason) == ("y" * 999, None)


def test_missing_bwrap_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not bwrap_available()
    with pytest.raises(SandboxUnavailable, match="install the bubblewrap package"):
        run_python("print(1)")
