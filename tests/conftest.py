from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
