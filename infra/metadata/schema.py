"""Tables of the shared metadata store (SQLAlchemy Core; SQLite by default, PostgreSQL at scale).

Everything another process may want to read live goes here: pools, worker bindings, and (later)
runs, steps and checkpoints. Times are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()


def utcnow() -> datetime:
    return datetime.now(UTC)


pools = Table(
    "pools",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),  # gpu-compute | gpu-bandwidth | cpu | serverless
    Column("capacity", Integer, nullable=False),
    Column("resource", String(128), nullable=False),  # Ray custom resource name that models the pool
    Column("device", String(32)),
)

bindings = Table(
    "bindings",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run", String(128), nullable=False, index=True),
    Column("worker", String(128), nullable=False),
    Column("role", String(32), nullable=False),
    Column("pool", String(64), ForeignKey("pools.name"), nullable=False),
    Column("preferred_pool", String(64), nullable=False),
    Column("fallback", Boolean, nullable=False, default=False),
    Column("units", Integer, nullable=False),
    Column("node", String(128)),
    Column("state", String(16), nullable=False),  # active | released | dead
    Column("replaces", Integer, ForeignKey("bindings.id")),  # the dead binding this one rebinds
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
    Column("updated_at", DateTime(timezone=True), nullable=False, default=utcnow),
    Column("ended_at", DateTime(timezone=True)),
)

steps = Table(
    "steps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run", String(128), nullable=False, index=True),
    Column("step", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("metrics", JSON, nullable=False),
    Column("wall_s", Float),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
    UniqueConstraint("run", "step", name="uq_steps_run_step"),  # a step is never recorded twice
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run", String(128), nullable=False, index=True),
    Column("step", Integer, nullable=False),
    Column("uri", String(1024), nullable=False),
    Column("weights_sha256", String(64)),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
)

run_events = Table(
    "run_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run", String(128), nullable=False, index=True),
    Column("kind", String(32), nullable=False),  # failed | crashed (the driver flow's final state)
    Column("reason", Text, nullable=False),
    Column("flow_run_id", String(64)),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
)
