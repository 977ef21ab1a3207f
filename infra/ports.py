"""Free TCP ports for the services a run starts on one address."""

from __future__ import annotations

import socket
from contextlib import ExitStack


def free_ports(host: str, n: int) -> list[int]:
    """`n` distinct ports free on `host` now. Every socket stays bound until all `n` are chosen: a port
    released at once can be handed out again by the next bind (two services were given one port, and
    the second one's clients reached the first)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(host, 1)[0]
