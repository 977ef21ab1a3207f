from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from engine.types import Group, Trajectory, TrajStatus, Turn
from tests.services import create_database, postgres_server

pytest_plugins = ["tests.ordering"]  # longest modules first (tests/ordering.py)

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# `make test` runs two test processes, each starting Ray clusters of torch processes, on the machine's
# cores: more busy OpenMP threads than cores. By default an OpenMP thread that finishes its part of an op
# spins, holding a core, waiting for the next: two processes of two threads each on 2 cores took 2.5x
# as long as with waiting threads that sleep (set here before torch loads: the test processes, the runs
# they start and their Ray workers inherit it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Metadata-store tests run against SQLite and a real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/metadata.db"
    # a fresh database per test
    return create_database(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def make_group() -> Callable[..., Group]:
    """Factory: a DONE group from `(reward, turns)` pairs.

    A turn is `(obs_ids, action_ids, action_logprobs, version)`.
    """

    def build(
        members: Sequence[tuple[float | None, Sequence[tuple[list[int], list[int], list[float], int]]]],
        group_id: str = "g0",
        task: str = "toy",
    ) -> Group:
        trajs = []
        for i, (reward, turns) in enumerate(members):
            traj = Trajectory(traj_id=f"{group_id}-{i}", group_id=group_id, task=task, seed=0, reward=reward)
            traj.turns = [
                Turn(observation="", obs_ids=o, action_text="", action_ids=a, action_logprobs=lp, version=v)
                for o, a, lp, v in turns
            ]
            traj.start_version = traj.turns[0].version if traj.turns else -1
            traj.status = TrajStatus.DONE
            trajs.append(traj)
        return Group(group_id=group_id, task=task, seed=0, size=len(trajs), members=trajs)

    return build
