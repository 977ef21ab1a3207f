"""A machine's share of a multi-node run: the pools it offers, as the Ray resources a run looks for.

A run places each worker where its pool's resource is (`rollart_pool_<name>`, `resources.py`). On one
machine the run declares them itself (`ray.init(resources=...)`); on a cluster each node declares what it
offers when it joins: `rollart node start --pool NAME[:UNITS] ...` is `ray start` with those resources.
A run that joins a cluster (`RAY_ADDRESS`) checks first that every pool it needs is offered, with at
least its capacity, and names what is missing (`missing_pools`).
`rendezvous()`: where a trainer's model-parallel ranks meet, a loopback port of the driver's node.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence

import ray

from engine.core.resources import ray_resource


def parse_pools(specs: Sequence[str]) -> dict[str, float]:
    """`["compute:2", "cpu"]` → the Ray resources `{rollart_pool_compute: 2, rollart_pool_cpu: 1}`."""
    out: dict[str, float] = {}
    for spec in specs:
        name, _, units = spec.partition(":")
        try:
            n = float(units) if units else 1.0
        except ValueError:
            n = -1.0
        if not name or not name.replace("-", "_").isidentifier() or n <= 0:
            raise ValueError(f"--pool {spec!r}: expected NAME[:UNITS], e.g. compute:2 (units > 0)")
        if ray_resource(name) in out:
            raise ValueError(f"--pool {name}: given twice")
        out[ray_resource(name)] = n
    return out


def ray_start_command(
    pools: Sequence[str],
    address: str | None = None,
    port: int = 6379,
    node_ip: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The `ray start` command of a node offering `pools`: the head (no `address`) or a node joining the
    cluster at `address`. `node_ip` is the interface other nodes reach it on (Ray picks one if None)."""
    cmd = ["ray", "start", f"--resources={json.dumps(parse_pools(pools))}"]
    cmd += [f"--address={address}"] if address else ["--head", f"--port={port}", "--include-dashboard=false"]
    if node_ip:
        cmd.append(f"--node-ip-address={node_ip}")
    return cmd + list(extra)


def missing_pools(needed: Mapping[str, float], offered: Mapping[str, float]) -> list[str]:
    """What a cluster lacks of the resources a run's pools need, one line each (empty: all there)."""
    lines = []
    for resource, units in needed.items():
        have = offered.get(resource, 0.0)
        if have < units:
            pool = resource.removeprefix(ray_resource(""))
            lines.append(
                f"pool {pool}: the cluster offers {have:g} of {units:g} units "
                f"(add a node with `rollart node start --pool {pool}:{units - have:g} --address ...`)"
            )
    return lines


def rendezvous() -> str:
    """Where the trainer's model-parallel ranks meet: a free loopback port, so all of them must be on this
    node (tensor parallelism exchanges activations every layer: it belongs within a node)."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) > 1:
        raise ValueError(
            f"backends.tensor_parallel × pipeline_parallel > 1 runs its ranks on the driver's node; this Ray "
            f"cluster has {len(nodes)} nodes, and placing the ranks together there is not implemented yet"
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"
