"""The usage database: one row per GPU server pod, written by the hub and the service.

Both write, and every write is idempotent, so either may be down while servers
start and stop:

- the hub opens a row when a GPU server has started and ends it when the server
  stops (the precise times);
- the service, at every pass over the pods it watches, opens a row for any GPU
  pod without one (from the pod's own start), marks every live pod as seen now,
  and ends the rows of pods that are gone at the time they were last seen: an
  end nobody witnessed is off by at most one pass.

Rows are never deleted: they are the history showback and budgets read. The
database is any SQLAlchemy URL: a sqlite file by default, PostgreSQL where the
hub has one. Synchronous (SQLAlchemy Core); async callers run it in a thread.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..core.budgets import UsageRecord

metadata = MetaData()

usage = Table(
    "jupyterhub_gpu_usage",
    metadata,
    Column("uid", String(64), primary_key=True),  # the pod's uid
    Column("key", String(320), nullable=False),  # <namespace>/<pod name>
    Column("user", String(255), nullable=False),
    Column("group", String(255), nullable=False),
    Column("profile", String(255), nullable=False),
    Column("flavor", String(255)),
    Column("gpus", Float, nullable=False),  # GPU-equivalents held
    Column("started", Float, nullable=False),  # epoch seconds
    Column("last_seen", Float, nullable=False),
    Column("ended", Float),
    #: the end is the last sighting, not a witnessed stop (a later sighting undoes it)
    Column("end_inferred", Boolean, nullable=False, default=False),
    #: when the row last changed: readers fetch only what changed since their last read
    Column("updated", Float, nullable=False),
    Index("ix_jupyterhub_gpu_usage_ended", "ended"),
    Index("ix_jupyterhub_gpu_usage_updated", "updated"),
    Index("ix_jupyterhub_gpu_usage_started", "started"),
    Index("ix_jupyterhub_gpu_usage_key", "key"),
)

_FIELDS = ("uid", "key", "user", "group", "profile", "flavor", "gpus", "started", "last_seen")


class AccountingUnavailable(RuntimeError):
    """The usage database could not be read or written."""


def _record(row: Any) -> UsageRecord:
    # a server's key, user, group, profile and flavor repeat in every row of it: one
    # string each in memory, where the service keeps two months of rows
    return UsageRecord(
        uid=row.uid,
        key=sys.intern(row.key),
        user=sys.intern(row.user),
        group=sys.intern(row.group),
        profile=sys.intern(row.profile),
        flavor=sys.intern(row.flavor) if row.flavor is not None else None,
        gpus=row.gpus,
        started=row.started,
        last_seen=row.last_seen,
        ended=row.ended,
    )


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    # the hub and the service write the same file: readers never wait for a writer,
    # a writer waits (rather than fails) for the other
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


class UsageStore:
    """One usage database."""

    def __init__(self, url: str, *, engine: Engine | None = None) -> None:
        self.url = url
        if engine is None:
            is_sqlite = url.startswith("sqlite")
            engine = create_engine(
                url,
                connect_args={"check_same_thread": False} if is_sqlite else {},
                pool_pre_ping=not is_sqlite,
            )
            if is_sqlite:
                event.listen(engine, "connect", _sqlite_pragmas)
        self.engine = engine
        self._ready = False

    def _guarded(self, what: str, work):
        try:
            if not self._ready:
                metadata.create_all(self.engine)
                self._ready = True
            with self.engine.begin() as connection:
                return work(connection)
        except SQLAlchemyError as e:
            raise AccountingUnavailable(
                f"the GPU usage database ({self.engine.url.render_as_string(hide_password=True)})"
                f" could not {what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            ) from e

    # ---- writes ------------------------------------------------------------------

    def open(self, records: Iterable[UsageRecord], now: float | None = None) -> int:
        """Add the records that have no row yet (by uid); returns how many were new."""
        records = list(records)
        if not records:
            return 0
        now = time.time() if now is None else now

        def work(connection) -> int:
            uids = [r.uid for r in records]
            known = set(
                connection.execute(select(usage.c.uid).where(usage.c.uid.in_(uids))).scalars()
            )
            new = [
                {**{f: getattr(r, f) for f in _FIELDS}, "ended": r.ended, "updated": now}
                for r in records
                if r.uid not in known
            ]
            if new:
                connection.execute(insert(usage), new)
            return len(new)

        return self._guarded("record new servers", work)

    def seen(self, uids: Iterable[str], at: float) -> None:
        """These pods are alive at ``at``; an end inferred for one of them is undone."""
        uids = list(uids)
        if not uids:
            return

        def work(connection) -> None:
            connection.execute(
                update(usage)
                .where(usage.c.uid.in_(uids), usage.c.ended.is_(None))
                .values(last_seen=at, updated=at)
            )
            connection.execute(
                update(usage)
                .where(usage.c.uid.in_(uids), usage.c.end_inferred.is_(True))
                .values(last_seen=at, ended=None, end_inferred=False, updated=at)
            )

        self._guarded("record running servers", work)

    def end(self, key: str, at: float) -> int:
        """The server ``key`` stopped at ``at`` (a witnessed end)."""

        def work(connection) -> int:
            result = connection.execute(
                update(usage)
                .where(usage.c.key == key, usage.c.ended.is_(None))
                .values(ended=at, last_seen=at, end_inferred=False, updated=at)
            )
            return result.rowcount

        return self._guarded("record a stopped server", work)

    def end_missing(self, live: Iterable[str], started_before: float) -> list[UsageRecord]:
        """End the open rows whose pod is not in ``live`` at their last sighting.

        ``started_before``: rows of pods started since are left open (their pod may
        be newer than the caller's list of pods)."""
        live = set(live)
        now = time.time()

        def work(connection) -> list[UsageRecord]:
            rows = connection.execute(
                select(usage).where(usage.c.ended.is_(None), usage.c.started < started_before)
            ).all()
            gone = [_record(r) for r in rows if r.uid not in live]
            for record in gone:
                record.ended = max(record.last_seen, record.started)
                connection.execute(
                    update(usage)
                    .where(usage.c.uid == record.uid, usage.c.ended.is_(None))
                    .values(ended=record.ended, end_inferred=True, updated=now)
                )
            return gone

        return self._guarded("record ended servers", work)

    # ---- reads -------------------------------------------------------------------

    def changed_since(self, since: float) -> list[UsageRecord]:
        """Rows written at or after ``since`` (a reader's incremental refresh)."""
        return self._guarded(
            "be read",
            lambda c: [
                _record(r) for r in c.execute(select(usage).where(usage.c.updated >= since))
            ],
        )

    def overlapping(
        self, since: float, until: float, groups: Iterable[str] | None = None
    ) -> list[UsageRecord]:
        """Rows whose use overlaps [since, until), optionally of some groups only."""
        query = select(usage).where(
            usage.c.started < until, or_(usage.c.ended.is_(None), usage.c.ended >= since)
        )
        if groups is not None:
            query = query.where(usage.c.group.in_(list(groups)))
        return self._guarded("be read", lambda c: [_record(r) for r in c.execute(query)])

    def dispose(self) -> None:
        self.engine.dispose()
