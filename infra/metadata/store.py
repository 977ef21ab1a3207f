"""MetadataStore: the shared, cross-process record of pools, bindings, steps and checkpoints.

Any SQLAlchemy URL works (`sqlite:///path.db` by default, `postgresql+psycopg://...` at scale).
Capacity accounting is done inside one write transaction (`BEGIN IMMEDIATE` on SQLite, row locks on
PostgreSQL), so two processes binding at once can never over-commit a pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, event, func, select, update
from sqlalchemy.engine import Engine, make_url

from infra.metadata.schema import bindings, checkpoints, metadata, pools, run_events, steps, utcnow


class PoolsExhausted(RuntimeError):
    """No candidate pool has the units asked for."""


@dataclass(frozen=True)
class BindingRow:
    id: int
    run: str
    worker: str
    role: str
    pool: str
    preferred_pool: str
    fallback: bool
    units: int
    node: str | None
    state: str
    replaces: int | None


def _sqlite_immediate(engine: Engine) -> None:
    """pysqlite defers BEGIN; make every transaction take the write lock up front (serialisable)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA busy_timeout = 30000")
        dbapi_conn.execute("PRAGMA journal_mode = WAL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


class MetadataStore:
    def __init__(self, url: str):
        u = make_url(url)
        if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:"):
            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        self.url = url
        self.engine = create_engine(url, pool_pre_ping=True)
        if u.get_backend_name() == "sqlite":
            _sqlite_immediate(self.engine)
        metadata.create_all(self.engine)

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def close(self) -> None:
        self.engine.dispose()

    # pools ---------------------------------------------------------------------------------------
    def upsert_pool(
        self, name: str, kind: str, capacity: int, resource: str, device: str | None = None
    ) -> None:
        with self._tx() as c:
            row = dict(kind=kind, capacity=capacity, resource=resource, device=device)
            if c.execute(select(pools.c.name).where(pools.c.name == name)).first():
                c.execute(update(pools).where(pools.c.name == name).values(**row))
            else:
                c.execute(pools.insert().values(name=name, **row))

    def pool_usage(self) -> dict[str, tuple[int, int]]:
        """pool -> (units bound by active bindings, capacity)."""
        with self._tx() as c:
            return self._usage(c)

    @staticmethod
    def _usage(c: Connection) -> dict[str, tuple[int, int]]:
        used: dict[str, int | None] = {
            pool: units
            for pool, units in c.execute(
                select(bindings.c.pool, func.sum(bindings.c.units))
                .where(bindings.c.state == "active")
                .group_by(bindings.c.pool)
            ).all()
        }
        return {
            n: (int(used.get(n) or 0), cap) for n, cap in c.execute(select(pools.c.name, pools.c.capacity))
        }

    # bindings ------------------------------------------------------------------------------------
    def reserve(
        self,
        run: str,
        worker: str,
        role: str,
        candidates: Sequence[str],
        units: int,
        replaces: int | None = None,
    ) -> BindingRow:
        """Bind `worker` to the first candidate pool with `units` free (candidates[0] is preferred)."""
        with self._tx() as c:
            c.execute(select(pools.c.name).where(pools.c.name.in_(candidates)).with_for_update()).all()
            usage = self._usage(c)
            for pool in candidates:
                used, cap = usage.get(pool, (0, 0))
                if used + units <= cap:
                    values: dict[str, Any] = dict(
                        run=run,
                        worker=worker,
                        role=role,
                        pool=pool,
                        preferred_pool=candidates[0],
                        fallback=pool != candidates[0],
                        units=units,
                        state="active",
                        replaces=replaces,
                    )
                    key = c.execute(bindings.insert().values(**values)).inserted_primary_key
                    assert key is not None  # a one-row INSERT always has its primary key
                    return BindingRow(id=key[0], node=None, **values)
            free = ", ".join(f"{p} {usage.get(p, (0, 0))[1] - usage.get(p, (0, 0))[0]}" for p in candidates)
            raise PoolsExhausted(f"{role} worker {worker}: needs {units} unit(s); free units: {free}")

    def set_binding(self, binding_id: int, **values: Any) -> None:
        if values.get("state") in ("released", "dead"):
            values.setdefault("ended_at", utcnow())
        with self._tx() as c:
            c.execute(
                update(bindings).where(bindings.c.id == binding_id).values(updated_at=utcnow(), **values)
            )

    def bindings(self, run: str | None = None, state: str | None = None) -> list[BindingRow]:
        q = select(*(bindings.c[f] for f in BindingRow.__dataclass_fields__)).order_by(bindings.c.id)
        if run is not None:
            q = q.where(bindings.c.run == run)
        if state is not None:
            q = q.where(bindings.c.state == state)
        with self._tx() as c:
            return [BindingRow(**r._mapping) for r in c.execute(q)]

    def release_run(self, run: str) -> int:
        """Release every active binding of a run; returns how many."""
        with self._tx() as c:
            res = c.execute(
                update(bindings)
                .where(bindings.c.run == run, bindings.c.state == "active")
                .values(state="released", ended_at=utcnow(), updated_at=utcnow())
            )
            return res.rowcount

    # steps and checkpoints -----------------------------------------------------------------------
    def record_step(self, run: str, step: int, version: int, metrics: dict[str, Any], wall_s: float) -> None:
        with self._tx() as c:
            c.execute(
                steps.insert().values(run=run, step=step, version=version, metrics=metrics, wall_s=wall_s)
            )

    def discard_steps_after(self, run: str, step: int) -> int:
        """Delete the step rows past `step`: a run resumed from step `step`'s checkpoint redoes them."""
        with self._tx() as c:
            return c.execute(steps.delete().where(steps.c.run == run, steps.c.step > step)).rowcount

    def steps(self, run: str) -> list[dict[str, Any]]:
        with self._tx() as c:
            q = select(steps.c.step, steps.c.version, steps.c.metrics, steps.c.wall_s).where(
                steps.c.run == run
            )
            return [dict(r._mapping) for r in c.execute(q.order_by(steps.c.step))]

    def record_checkpoint(self, run: str, step: int, uri: str, weights_sha256: str | None = None) -> None:
        with self._tx() as c:
            c.execute(checkpoints.insert().values(run=run, step=step, uri=uri, weights_sha256=weights_sha256))

    def latest_checkpoint(self, run: str, step: int | None = None) -> dict[str, Any] | None:
        """The newest checkpoint of `run` (of its step `step` when given), or None."""
        where = [checkpoints.c.run == run] + ([checkpoints.c.step == step] if step is not None else [])
        with self._tx() as c:
            q = (
                select(checkpoints.c.step, checkpoints.c.uri, checkpoints.c.weights_sha256)
                .where(*where)
                .order_by(checkpoints.c.step.desc(), checkpoints.c.id.desc())
                .limit(1)
            )
            r = c.execute(q).first()
            return dict(r._mapping) if r else None

    # how runs ended --------------------------------------------------------------------------------
    def record_event(self, run: str, kind: str, reason: str, flow_run_id: str | None = None) -> None:
        """A driver flow that failed or crashed: why, kept beside its steps and checkpoints."""
        with self._tx() as c:
            c.execute(run_events.insert().values(run=run, kind=kind, reason=reason, flow_run_id=flow_run_id))

    def events(self, run: str) -> list[dict[str, Any]]:
        with self._tx() as c:
            q = select(
                run_events.c.kind, run_events.c.reason, run_events.c.flow_run_id, run_events.c.created_at
            )
            return [
                dict(r._mapping)
                for r in c.execute(q.where(run_events.c.run == run).order_by(run_events.c.id))
            ]
