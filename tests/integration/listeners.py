"""The TCP sockets a process tree listens on, sampled while a run goes on (psutil reads /proc)."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    pid: int
    process: str  # the process title: Ray names its workers "ray::<Class>"

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.host)
        mapped = getattr(address, "ipv4_mapped", None)  # "::ffff:127.0.0.1": a dual-stack socket's view
        return (mapped or address).is_loopback

    def __str__(self) -> str:
        return f"{self.host}:{self.port} ({self.process}, pid {self.pid})"


def _title(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "?"


def listeners(root: int) -> set[Listener]:
    """What `root` and its descendants listen on now."""
    try:
        tree = {root, *(c.pid for c in psutil.Process(root).children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()
    return {
        Listener(c.laddr.ip, c.laddr.port, c.pid, _title(c.pid))
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in tree
    }


@contextmanager
def sampled_listeners(root: int, every_s: float = 0.5) -> Iterator[set[Listener]]:
    """Every listener of `root`'s tree opened while the block runs (a sampler thread adds to the set).
    Sockets already listening when it starts are left out: in a test process, an earlier test's Ray
    driver may have left its own behind."""
    before = {(s.host, s.port, s.pid) for s in listeners(root)}
    seen: set[Listener] = set()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.update(s for s in listeners(root) if (s.host, s.port, s.pid) not in before)
            done.wait(every_s)

    thread = threading.Thread(target=sample, name="listener-sampler", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()
