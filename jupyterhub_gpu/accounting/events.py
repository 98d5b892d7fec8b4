"""Servers' notices and stops, with their reasons, kept in the usage database.

The service writes a row for every notice it gives (an idle GPU, a used-up
budget, a stop coming) and for every end of a server it sees, with why: its own
stops (idle, budget, max_runtime, over_limit) and those nobody scheduled (a stop
through the hub by the user or an admin, a preemption by the scheduler, an
eviction by Kueue, a profile the policy no longer has). The service reads them
back when it starts, so a server's JupyterLab is told why it last stopped after
a service or hub restart; the hub reads a user's last stops for its home and
spawn pages.

What a server running on a used-up budget was told is kept too, one row per
server pod and budget: when it was told and the stop it announced. The budget
rule reads it at every run, so a restarted service neither tells a server again
with a fresh grace nor forgets a stop it announced; the row goes when the pod
goes or the budget has room again.

Three tables beside the usage table, in the same database, created by whichever
of hub and service comes first (on PostgreSQL under the same advisory lock as
the usage table's upgrade; on sqlite the second retries while the first
creates). Rows older than the retention (a year by default) are pruned by the
service, at most once an hour.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from ..core.budgets import BudgetKey, Told
from .store import _UPGRADE_LOCK, AccountingUnavailable, UsageStore

metadata = MetaData()

notices = Table(
    "jupyterhub_gpu_notices",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user", String(255)),  # None: a group's notice (over its limit)
    Column("server", String(255)),  # the server's name ("" the default server)
    Column("uid", String(64)),  # the pod's uid
    Column("kind", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("at", Float, nullable=False),  # epoch seconds
    Column("stop_at", Float),  # the stop it announces
    Index("ix_jupyterhub_gpu_notices_at", "at"),
    Index("ix_jupyterhub_gpu_notices_server", "user", "server", "at"),
)

stops = Table(
    "jupyterhub_gpu_stops",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user", String(255), nullable=False),
    Column("server", String(255), nullable=False),
    Column("uid", String(64)),
    Column("reason", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_jupyterhub_gpu_stops_at", "at"),
    Index("ix_jupyterhub_gpu_stops_server", "user", "server", "at"),
)

budget_told = Table(
    "jupyterhub_gpu_budget_told",
    metadata,
    # the server pod's uid (its namespace/name if it has none): a server started
    # again is a new pod, told anew
    Column("pod", String(320), primary_key=True),
    # the budget: its group, and the member for a member's own budget ("" a group's)
    Column("budget_group", String(255), primary_key=True),
    Column("budget_member", String(255), primary_key=True),
    Column("user", String(255), nullable=False),
    Column("server", String(255), nullable=False),
    Column("told_at", Float, nullable=False),  # epoch seconds
    Column("stop_at", Float),  # the stop announced; None: a warn budget's notice
    Column("stop_said_at", Float),  # when the server was told it is being stopped
)

#: how long notices and stops are kept (seconds)
RETENTION = 365 * 86400
#: the service prunes at most this often (seconds)
PRUNE_EVERY = 3600


@dataclass(frozen=True)
class NoticeRow:
    user: str | None
    server: str | None
    uid: str | None
    kind: str
    message: str
    at: float
    stop_at: float | None = None


@dataclass(frozen=True)
class StopRow:
    user: str
    server: str
    uid: str | None
    reason: str
    message: str
    at: float


def create_tables(engine: Engine, tables: MetaData) -> None:
    """Create ``tables`` where missing; safe when the hub and the service start at once.

    PostgreSQL: under the advisory lock the usage table's upgrade takes, so the
    second waits for the first's commit and then finds them (a concurrent
    ``CREATE TABLE`` fails on PostgreSQL's catalog even with ``checkfirst``).
    sqlite: the second's create fails with "already exists" while the first's is
    not committed; it tries again and finds them."""
    for attempt in range(1, 6):
        try:
            with engine.begin() as connection:
                if engine.dialect.name == "postgresql":
                    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_UPGRADE_LOCK})")
                tables.create_all(connection)
            return
        except SQLAlchemyError as e:
            if attempt == 5 or "already exists" not in str(e):
                raise
            time.sleep(0.2 * attempt)


class EventStore:
    """Notices and stops in the usage database (the same engine as ``usage``)."""

    def __init__(self, usage: UsageStore, retention: float = RETENTION) -> None:
        self.usage = usage
        self.retention = retention
        self._ready = False
        self._pruned_at = 0.0

    def _guarded(self, what: str, work: Callable[[Connection], Any]) -> Any:
        engine = self.usage.engine
        try:
            if not self._ready:
                create_tables(engine, metadata)
                self._ready = True
            with engine.begin() as connection:
                return work(connection)
        except SQLAlchemyError as e:
            raise AccountingUnavailable(
                f"the GPU usage database ({engine.url.render_as_string(hide_password=True)})"
                f" could not {what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            ) from e

    def write(
        self, new_notices: Iterable[NoticeRow], new_stops: Iterable[StopRow], now: float
    ) -> int:
        """Add notices and stops in one transaction; prune what is older than the
        retention (at most once per ``PRUNE_EVERY``). Returns how many rows were pruned."""
        notice_rows = [asdict(n) for n in new_notices]
        stop_rows = [asdict(s) for s in new_stops]
        prune = now - self._pruned_at >= PRUNE_EVERY

        def work(connection: Connection) -> int:
            if notice_rows:
                connection.execute(insert(notices), notice_rows)
            if stop_rows:
                connection.execute(insert(stops), stop_rows)
            pruned = 0
            if prune:
                before = now - self.retention
                pruned = connection.execute(delete(notices).where(notices.c.at < before)).rowcount
                pruned += connection.execute(delete(stops).where(stops.c.at < before)).rowcount
            self.usage.check_fence()
            return pruned

        pruned = self._guarded("record servers' notices and stops", work)
        if prune:
            self._pruned_at = now
        return pruned

    def last_stops(self, since: float, user: str | None = None) -> dict[tuple[str, str], StopRow]:
        """Each server's last stop since ``since`` (of one ``user``, or everyone's)."""
        latest = select(stops.c.user, stops.c.server, func.max(stops.c.at).label("at")).where(
            stops.c.at >= since
        )
        if user is not None:
            latest = latest.where(stops.c.user == user)
        latest = latest.group_by(stops.c.user, stops.c.server).subquery()
        query = select(stops).join(
            latest,
            and_(
                stops.c.user == latest.c.user,
                stops.c.server == latest.c.server,
                stops.c.at == latest.c.at,
            ),
        )

        def work(connection: Connection) -> dict[tuple[str, str], StopRow]:
            found: dict[tuple[str, str], StopRow] = {}
            for row in connection.execute(query.order_by(stops.c.id)):
                found[(row.user, row.server)] = StopRow(
                    row.user, row.server, row.uid, row.reason, row.message, row.at
                )
            return found

        return self._guarded("be read", work)

    def recent_notices(self, since: float) -> list[NoticeRow]:
        """The notices given to users since ``since``, oldest first."""
        query = (
            select(notices)
            .where(notices.c.at >= since, notices.c.user.is_not(None))
            .order_by(notices.c.at, notices.c.id)
        )

        def work(connection: Connection) -> list[NoticeRow]:
            return [
                NoticeRow(r.user, r.server, r.uid, r.kind, r.message, r.at, r.stop_at)
                for r in connection.execute(query)
            ]

        return self._guarded("be read", work)


@dataclass(frozen=True)
class ToldRow:
    """What one server pod was told of one used-up budget (``budget_told``)."""

    pod: str  # the pod's uid, or its namespace/name
    user: str
    server: str
    told: Told


class BudgetToldStore:
    """What servers were told of used-up budgets, in the usage database."""

    def __init__(self, events: EventStore) -> None:
        self.events = events

    def read(self) -> list[ToldRow]:
        """Every row (one per server pod and used-up budget: a few per server at most)."""

        def work(connection: Connection) -> list[ToldRow]:
            return [
                ToldRow(
                    r.pod,
                    r.user,
                    r.server,
                    Told((r.budget_group, r.budget_member), r.told_at, r.stop_at, r.stop_said_at),
                )
                for r in connection.execute(select(budget_told))
            ]

        return self.events._guarded("be read (what servers were told of budgets)", work)

    def write(
        self,
        tell: Iterable[ToldRow],
        forget: Iterable[tuple[str, BudgetKey]],
        forget_pods: Iterable[str],
        stop_said: Iterable[tuple[str, BudgetKey, float]],
    ) -> set[tuple[str, BudgetKey]]:
        """In one transaction: drop the rows of ``forget`` ((pod, budget)) and of the pods
        in ``forget_pods``, add ``tell`` where no row is there yet, note ``stop_said``.
        Returns the (pod, budget) of the rows added: a row already there (another
        process told first) is left as it is, and its notice is not given again."""
        tell, forget, forget_pods = list(tell), list(forget), list(forget_pods)
        stop_said = list(stop_said)
        table = budget_told
        dialect = self.events.usage.engine.dialect.name

        def work(connection: Connection) -> set[tuple[str, BudgetKey]]:
            for pod, (group, member) in forget:
                connection.execute(
                    delete(table).where(
                        table.c.pod == pod,
                        table.c.budget_group == group,
                        table.c.budget_member == member,
                    )
                )
            for chunk in range(0, len(forget_pods), 500):
                connection.execute(
                    delete(table).where(table.c.pod.in_(forget_pods[chunk : chunk + 500]))
                )
            added = set()
            for row in tell:
                group, member = row.told.key
                values = dict(
                    pod=row.pod,
                    budget_group=group,
                    budget_member=member,
                    user=row.user,
                    server=row.server,
                    told_at=row.told.at,
                    stop_at=row.told.stop_at,
                    stop_said_at=row.told.stop_said,
                )
                if connection.execute(_insert_new(dialect, values)).rowcount:
                    added.add((row.pod, row.told.key))
            for pod, (group, member), at in stop_said:
                connection.execute(
                    update(table)
                    .where(
                        table.c.pod == pod,
                        table.c.budget_group == group,
                        table.c.budget_member == member,
                    )
                    .values(stop_said_at=at)
                )
            self.events.usage.check_fence()
            return added

        return self.events._guarded("record what servers were told of budgets", work)


def _insert_new(dialect: str, values: dict[str, Any]) -> Any:
    """An insert of ``values`` into ``budget_told`` that adds nothing where the row is
    there already (two processes telling at once: the first's stands). The usage
    database is PostgreSQL or sqlite (``UsageStore``)."""
    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return dialect_insert(budget_told).values(values).on_conflict_do_nothing()
