"""What a node offers a multi-node run: `rollart node start`'s pools as Ray resources, and the check a run
that joins a cluster makes (engine/core/nodes.py)."""

import json

import pytest

from engine.core.nodes import missing_pools, parse_pools, ray_start_command
from flows.cli import main


def test_pools_become_the_resources_runs_place_workers_by():
    assert parse_pools(["compute:2", "cpu", "gpu-h20:0.5"]) == {
        "rollart_pool_compute": 2.0,
        "rollart_pool_cpu": 1.0,
        "rollart_pool_gpu-h20": 0.5,
    }
    for bad in ("compute:0", "compute:x", ":2", "a b"):
        with pytest.raises(ValueError, match="expected NAME\\[:UNITS\\]"):
            parse_pools([bad])
    with pytest.raises(ValueError, match="--pool cpu: given twice"):
        parse_pools(["cpu", "cpu:2"])


def test_the_head_and_a_joining_node_get_their_ray_start_commands():
    head = ray_start_command(["compute:1"], port=6400, node_ip="10.0.0.5")
    assert head[:2] == ["ray", "start"] and "--head" in head and "--port=6400" in head
    assert "--node-ip-address=10.0.0.5" in head and "--include-dashboard=false" in head
    assert json.loads(head[2].removeprefix("--resources=")) == {"rollart_pool_compute": 1.0}
    node = ray_start_command(["bandwidth:2"], address="10.0.0.5:6400", extra=["--num-gpus=2"])
    assert node[3:] == ["--address=10.0.0.5:6400", "--num-gpus=2"] and "--head" not in node


def test_a_cluster_lacking_a_pool_is_named_with_the_command_that_adds_it():
    needed = {"rollart_pool_compute": 1.0, "rollart_pool_bandwidth": 3.0}
    assert missing_pools(needed, {"rollart_pool_compute": 1.0, "rollart_pool_bandwidth": 3.0, "CPU": 8}) == []
    assert missing_pools(needed, {"rollart_pool_bandwidth": 1.0}) == [
        "pool compute: the cluster offers 0 of 1 units (add a node with `rollart node start --pool "
        "compute:1 --address ...`)",
        "pool bandwidth: the cluster offers 1 of 3 units (add a node with `rollart node start --pool "
        "bandwidth:2 --address ...`)",
    ]


def test_rollart_node_start_prints_the_command_and_refuses_a_bad_pool(capsys):
    assert (
        main(["node", "start", "--pool", "cpu:4", "--address", "10.0.0.5:6379", "--dry-run", "--", "--block"])
        == 0
    )
    cmd = capsys.readouterr().out.split()
    assert cmd[0].endswith("/ray") and cmd[1:] == [
        "start",
        '--resources={"rollart_pool_cpu":',
        "4.0}",
        "--address=10.0.0.5:6379",
        "--block",
    ]
    assert main(["node", "start", "--pool", "cpu:-1", "--dry-run"]) == 2
    assert "expected NAME[:UNITS]" in capsys.readouterr().err
