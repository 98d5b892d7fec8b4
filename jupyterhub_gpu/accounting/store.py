"""The usage database: one row per GPU server pod, written by the hub and the service.

Both write, and every write is idempotent, so either may be down while servers
start and stop:

- the hub opens a row when a GPU server has started and ends it when the server
  stops (the precise times);
- the service, at every pass over the pods it watches, opens a row for any GPU
  pod without one (from the pod's own start), marks every live pod as seen now,
  and ends the rows of pods that are gone at the time they were last seen: an
  end nobody witnessed is off by at most one pass.

Rows are keyed by the pod's uid, and every write names the uid it means: a new
pod of the same server (same ``<namespace>/<pod name>``) is a row of its own,
which no write about an older pod touches. An end is either witnessed (a stop
the hub saw through: final) or inferred (the pod was found gone: dated at its
last sighting, never before its start, and undone by a later sighting of the
same pod).

Every write transaction takes the next number of one counter first and stamps
it on the rows it writes (``revision``). Taking it locks the counter until the
transaction commits, so writers take their numbers in the order they commit: a
reader that has seen every row up to revision N has seen every write numbered N
or less, whatever times those writes carry, and asks for what is newer.
On PostgreSQL a write transaction that sits idle for ``HELD_WRITE_LIMIT`` (its
process suspended or frozen mid-write) is ended by the server, so the counter is
never held longer than that by a writer that no longer moves.

A write the database refuses is not lost: the hub and the service keep it
(``backlog.Backlog``) and write it later with ``write``, which applies each pod's
kept start, latest sighting and end, with their true times, in one transaction.

Rows are never deleted: they are the history showback and budgets read. The
database is any SQLAlchemy URL: a sqlite file by default, PostgreSQL where the
hub has one. Synchronous (SQLAlchemy Core); async callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import gc
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    case,
    create_engine,
    event,
    func,
    insert,
    inspect,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from ..core.usage import UsageRecord, open_end

if TYPE_CHECKING:
    from .backlog import Pending

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
    #: when the row last changed (wall time; what readers before ``revision`` read)
    Column("updated", Float, nullable=False),
    #: the counter's number of the write that last changed the row: readers fetch only
    #: rows newer than the last they read. Added to tables of earlier versions (0 there)
    Column("revision", BigInteger, nullable=False, server_default=text("0")),
    Index("ix_jupyterhub_gpu_usage_ended", "ended"),
    Index("ix_jupyterhub_gpu_usage_updated", "updated"),
    Index("ix_jupyterhub_gpu_usage_started", "started"),
    Index("ix_jupyterhub_gpu_usage_key", "key"),
    Index("ix_jupyterhub_gpu_usage_revision", "revision"),
)

#: one row (id 1): the revision of the last write
revisions = Table(
    "jupyterhub_gpu_usage_revision",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("value", BigInteger, nullable=False),
)

_FIELDS = ("uid", "key", "user", "group", "profile", "flavor", "gpus", "started", "last_seen")


class AccountingUnavailable(RuntimeError):
    """The usage database could not be read or written."""


_collector = threading.Lock()
_collector_paused = 0


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a first read makes its hundreds of thousands
    of records (in a thread), then set them aside from it.

    Each collection of the oldest generation looks at every object alive and holds the
    interpreter while it does: made as they are read, a year's rows set off several
    such collections, each stalling the event loop a tenth of a second or more, and
    once read, every later one walks them again. The records are kept until they leave
    every window, and hold no cycles (refcounting frees them), so they are frozen out
    of the collector's view (``gc.freeze``) rather than walked again and again."""
    global _collector_paused
    with _collector:
        _collector_paused += 1
        if _collector_paused == 1:
            gc.disable()
    try:
        yield
    finally:
        with _collector:
            _collector_paused -= 1
            if _collector_paused == 0:
                gc.freeze()
                gc.enable()


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


def _greatest(*values: Any) -> Any:
    """The largest of columns and numbers, in SQL any database runs."""
    values = tuple(literal(v, Float) if isinstance(v, int | float) else v for v in values)
    largest = values[0]
    for value in values[1:]:
        largest = case((value > largest, value), else_=largest)
    return largest


#: how long a connection to a sqlite file waits for the other writer, in seconds
_SQLITE_BUSY_WAIT = 10.0
#: how long PostgreSQL lets a write transaction sit idle before it ends its session, in
#: seconds. A writer holds the revision counter until it commits: one whose process is
#: suspended, frozen or cut off mid-write would otherwise keep every other writer (the
#: hub, the replica acting after it) waiting for as long as its connection stays open
HELD_WRITE_LIMIT = 10.0


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    """The hub and the service write the same file: readers never wait for a writer
    (write-ahead log), and a writer waits, rather than fails, for the other."""
    cursor = connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={int(_SQLITE_BUSY_WAIT * 1000)}")
        # The log mode is kept in the file, so only its first opener switches it. The
        # switch needs the file to itself and sqlite reports "locked" at once, without
        # its busy wait, when the other writer has it open: wait here instead.
        deadline = time.monotonic() + _SQLITE_BUSY_WAIT
        while cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                mode = cursor.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e):
                    raise
                mode = str(e)
            if mode != "wal":
                if time.monotonic() > deadline:
                    raise sqlite3.OperationalError(
                        f"could not switch the file to write-ahead logging: {mode}"
                    )
                time.sleep(0.05)
    finally:
        cursor.close()


def _insert_new(connection: Connection, rows: list[dict[str, Any]]) -> int:
    """Insert the rows whose uid has none yet; returns how many were inserted. A row
    another writer inserts meanwhile is skipped, never an error."""
    dialect = connection.dialect.name
    if dialect in ("postgresql", "sqlite"):
        dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        statement = (
            dialect_insert(usage)
            .on_conflict_do_nothing(index_elements=[usage.c.uid])
            .returning(usage.c.uid)
        )
        return len(connection.execute(statement, rows).all())
    # another database: the writers are serialised by the revision counter
    uids = [row["uid"] for row in rows]
    known = set(connection.execute(select(usage.c.uid).where(usage.c.uid.in_(uids))).scalars())
    new = [row for row in rows if row["uid"] not in known]
    if new:
        connection.execute(insert(usage), new)
    return len(new)


def _open_rows(
    connection: Connection, records: Iterable[UsageRecord], stamp: dict[str, Any]
) -> int:
    """Insert rows for the records whose pod has none; how many were new."""
    rows = [
        {**{f: getattr(r, f) for f in _FIELDS}, "ended": r.ended, "end_inferred": False, **stamp}
        for r in records
    ]
    return _insert_new(connection, rows) if rows else 0


def _seen_rows(connection: Connection, uids: list[str], at: float, stamp: dict[str, Any]) -> None:
    """These pods were alive at ``at``: open rows move their last sighting forward, and
    an end inferred before ``at`` is undone."""
    connection.execute(
        update(usage)
        .where(usage.c.uid.in_(uids), usage.c.ended.is_(None), usage.c.last_seen < at)
        .values(last_seen=at, **stamp)
    )
    connection.execute(
        update(usage)
        .where(usage.c.uid.in_(uids), usage.c.end_inferred.is_(True), usage.c.ended < at)
        .values(
            last_seen=_greatest(usage.c.last_seen, at),
            ended=None,
            end_inferred=False,
            **stamp,
        )
    )


def _end_row(
    connection: Connection, uid: str, at: float, inferred: bool, stamp: dict[str, Any]
) -> int:
    """End the row of pod ``uid`` at ``at`` (see ``UsageStore.end``); 0 or 1 rows."""
    if inferred:
        statement = (
            update(usage)
            .where(usage.c.uid == uid, usage.c.ended.is_(None))
            .values(
                ended=_greatest(at, usage.c.last_seen, usage.c.started),
                end_inferred=True,
                **stamp,
            )
        )
    else:
        statement = (
            update(usage)
            .where(
                usage.c.uid == uid,
                or_(usage.c.ended.is_(None), usage.c.end_inferred.is_(True)),
            )
            .values(ended=_greatest(at, usage.c.started), end_inferred=False, **stamp)
        )
    return connection.execute(statement).rowcount


#: the PostgreSQL advisory lock the upgrade of a table is made under
_UPGRADE_LOCK = 7_395_512_001


def _add_revision(engine: Engine) -> None:
    """Bring a table of an earlier version up to this one: its ``revision`` column
    (0 in every existing row) and index. Safe when the hub and the service both
    start on it at once: on PostgreSQL one waits for the other (its ``IF NOT EXISTS``
    does not hold against a concurrent create); elsewhere a step the other one did
    first fails, and the upgrade is tried again from what is there."""
    dialect = engine.dialect.name
    index = next(i for i in usage.indexes if i.name == "ix_jupyterhub_gpu_usage_revision")
    for attempt in range(1, 6):
        try:
            with engine.begin() as connection:
                if dialect == "postgresql":
                    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_UPGRADE_LOCK})")
                columns = {c["name"] for c in inspect(connection).get_columns(usage.name)}
                if "revision" not in columns:
                    connection.exec_driver_sql(
                        f"ALTER TABLE {usage.name} ADD COLUMN revision BIGINT NOT NULL DEFAULT 0"
                    )
                if dialect in ("postgresql", "sqlite"):
                    connection.exec_driver_sql(
                        f"CREATE INDEX IF NOT EXISTS {index.name} ON {usage.name} (revision)"
                    )
                else:
                    index.create(connection, checkfirst=True)
            return
        except SQLAlchemyError:
            # sqlite commits each schema change on its own: the other one may have
            # added the column and not yet the index
            if attempt == 5:
                raise
            time.sleep(0.1 * attempt)


class NotActing(Exception):
    """A write refused because this replica of the GPU service does not act now (it does
    not hold its Lease): the replica that does writes what the pods show."""


class UsageStore:
    """One usage database."""

    #: with leader election: why this process may not write now (None: it may). Asked
    #: inside each write's transaction, last before its commit
    fence: Callable[[], str | None] | None = None

    def check_fence(self) -> None:
        """Raise ``NotActing`` (rolling the transaction back) when the fence says so."""
        if self.fence is not None and (why := self.fence()) is not None:
            raise NotActing(f"nothing written to the GPU usage database: {why}")

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

    def _prepare(self) -> None:
        """Create the tables, or bring those of an earlier version up to date."""
        for attempt in range(1, 6):
            try:
                metadata.create_all(self.engine)
                break
            except SQLAlchemyError as e:
                # the other writer (the hub, or the service) is creating them at this
                # moment: once its transaction is committed, they are there to find
                if attempt == 5 or "already exists" not in str(e):
                    raise
                time.sleep(0.2 * attempt)
        _add_revision(self.engine)
        with self.engine.begin() as connection:
            if connection.execute(select(revisions.c.value)).first() is None:
                latest = connection.execute(
                    select(func.coalesce(func.max(usage.c.revision), 0))
                ).scalar_one()
                row = {"id": 1, "value": latest}
                dialect = connection.dialect.name
                if dialect in ("postgresql", "sqlite"):
                    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
                    connection.execute(dialect_insert(revisions).on_conflict_do_nothing(), row)
                else:
                    connection.execute(insert(revisions), row)

    def _guarded(self, what: str, work: Callable[[Connection], Any]) -> Any:
        try:
            if not self._ready:
                self._prepare()
                self._ready = True
            with self.engine.begin() as connection:
                return work(connection)
        except SQLAlchemyError as e:
            raise AccountingUnavailable(
                f"the GPU usage database ({self.engine.url.render_as_string(hide_password=True)})"
                f" could not {what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            ) from e

    def _write(self, what: str, work: Callable[[Connection, int], Any]) -> Any:
        """Run ``work`` in one transaction with the next revision, taken first: the
        counter stays locked until the commit (and on sqlite, taking it is what
        begins the write), so revisions are committed in order."""

        def numbered(connection: Connection) -> Any:
            if connection.dialect.name == "postgresql":
                # for this transaction only: a read may rightly take longer than this
                limit = int(HELD_WRITE_LIMIT * 1000)
                connection.exec_driver_sql(
                    f"SET LOCAL idle_in_transaction_session_timeout = {limit}"
                )
            connection.execute(
                update(revisions).where(revisions.c.id == 1).values(value=revisions.c.value + 1)
            )
            revision = connection.execute(
                select(revisions.c.value).where(revisions.c.id == 1)
            ).scalar_one()
            result = work(connection, revision)
            self.check_fence()
            return result

        return self._guarded(what, numbered)

    # ---- writes ------------------------------------------------------------------

    def open(self, records: Iterable[UsageRecord], now: float | None = None) -> int:
        """Add the records that have no row yet (by uid); returns how many were new.

        The hub and the service may add the same pod at the same moment: the one
        that comes second adds nothing."""
        records = list(records)
        if not records:
            return 0
        now = time.time() if now is None else now

        def work(connection: Connection, revision: int) -> int:
            return _open_rows(connection, records, {"updated": now, "revision": revision})

        return self._write("record new servers", work)

    def seen(self, uids: Iterable[str], at: float) -> None:
        """These pods are alive at ``at``; an end inferred for one of them before
        ``at`` is undone (it runs on)."""
        uids = list(uids)
        if not uids:
            return
        now = time.time()

        def work(connection: Connection, revision: int) -> None:
            _seen_rows(connection, uids, at, {"updated": now, "revision": revision})

        self._write("record running servers", work)

    def end(self, uid: str, at: float, *, inferred: bool = False) -> int:
        """The pod ``uid`` is gone: its row ends at ``at``, and never before its start.

        Witnessed (the stop was seen through): final, replacing an inferred end.
        ``inferred`` (found gone, ``at`` its last sighting): on an open row only,
        never before its last sighting, and undone by a later one (``seen``).
        Returns how many rows changed (0 or 1)."""
        now = time.time()

        def work(connection: Connection, revision: int) -> int:
            return _end_row(connection, uid, at, inferred, {"updated": now, "revision": revision})

        return self._write("record a stopped server", work)

    def write(self, entries: Iterable[Pending]) -> int:
        """Write pods' events kept while the database could not be written (or just
        now: ``backlog.Backlog``), in one transaction: each pod's start (a new row
        unless it has one, its last sighting as kept), then its sighting, then its
        end, each with its true time. Returns how many rows were new."""
        entries = list(entries)
        if not entries:
            return 0
        now = time.time()

        def work(connection: Connection, revision: int) -> int:
            stamp = {"updated": now, "revision": revision}
            opens = [
                replace(p.record, last_seen=max(p.record.last_seen, p.seen or 0.0))
                for p in entries
                if p.record is not None
            ]
            new = _open_rows(connection, opens, stamp)
            # one statement per sighting time: a pass sees all its pods at once
            by_time: dict[float, list[str]] = {}
            for p in entries:
                if p.seen is not None:
                    by_time.setdefault(p.seen, []).append(p.uid)
            for at, uids in by_time.items():
                _seen_rows(connection, uids, at, stamp)
            for p in entries:
                if p.end is not None:
                    _end_row(connection, p.uid, p.end, p.inferred, stamp)
            return new

        return self._write("record servers' starts, sightings and ends", work)

    def end_missing(self, live: Iterable[str], started_before: float) -> list[UsageRecord]:
        """End the open rows whose pod is not in ``live`` at their last sighting
        (inferred ends).

        ``started_before``: rows of pods started since are left open (their pod may
        be newer than the caller's list of pods)."""
        live = set(live)
        now = time.time()

        def work(connection: Connection, revision: int) -> list[UsageRecord]:
            rows = connection.execute(
                select(usage).where(usage.c.ended.is_(None), usage.c.started < started_before)
            ).all()
            gone = [_record(r) for r in rows if r.uid not in live]
            for record in gone:
                record.ended = open_end(record, now)  # not running: its last sighting
                connection.execute(
                    update(usage)
                    .where(usage.c.uid == record.uid, usage.c.ended.is_(None))
                    .values(ended=record.ended, end_inferred=True, updated=now, revision=revision)
                )
            return gone

        return self._write("record ended servers", work)

    # ---- reads -------------------------------------------------------------------

    def revision(self) -> int:
        """The revision of the last write committed."""
        return self._guarded(
            "be read",
            lambda c: c.execute(select(revisions.c.value).where(revisions.c.id == 1)).scalar_one(),
        )

    def changed_since(self, revision: int) -> tuple[list[UsageRecord], int]:
        """Rows written after ``revision`` (a reader's incremental refresh), and the
        revision to ask from next time."""

        def work(connection: Connection) -> tuple[list[UsageRecord], int]:
            rows = connection.execute(select(usage).where(usage.c.revision > revision)).all()
            return [_record(r) for r in rows], max((r.revision for r in rows), default=revision)

        return self._guarded("be read", work)

    def snapshot(self, since: float, until: float) -> tuple[list[UsageRecord], int]:
        """A reader's first read: the rows overlapping [since, until), and the revision
        to continue from with ``changed_since`` (taken before the rows are read: a
        write committed meanwhile is read again, never missed)."""

        def work(connection: Connection) -> tuple[list[UsageRecord], int]:
            revision = connection.execute(
                select(revisions.c.value).where(revisions.c.id == 1)
            ).scalar_one()
            query = select(usage).where(
                usage.c.started < until, or_(usage.c.ended.is_(None), usage.c.ended >= since)
            )
            return [_record(r) for r in connection.execute(query)], revision

        with collector_paused():  # a year's rows: see there
            return self._guarded("be read", work)

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
