"""Ports for several services on one address are distinct, and free when handed out."""

import socket

from infra.ports import free_ports


def test_ports_chosen_together_are_distinct_and_bindable() -> None:
    ports = free_ports("127.0.0.1", 64)
    assert len(set(ports)) == 64
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # raises if something holds it
