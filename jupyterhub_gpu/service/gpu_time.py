"""The service's part in GPU time: it records what the pods show, and reads usage back.

Every ``usage_interval`` the service writes down what the server pods it watches
show (``record``): a row for every GPU pod that has none (the hub was down when
it started), a sighting for every live one, and an end, at its last sighting,
for every row whose pod is gone. It then reads back the rows that changed into
its ``UsageBook`` of recent records, from which budgets (for ``api/usage``,
metrics and the budget rule), history and showback are answered without a
database query; an older month is read from the database.

Only a view of the pods known to be current is a sighting: while the pod watch
or its list fails (the API server unreachable), a pod the service still holds
may be gone, so a pass records no sighting and ends nothing; the rows keep their
last sighting, open records count up to it (``running`` is empty), and the pass
says so. Once a list succeeds, the pods in it are seen again and the rows of
those gone meanwhile end at their last sighting, before the outage.

While the database cannot be written, every pass still looks at the pods: it
keeps their starts, their latest sightings and, for a pod seen during the outage
that is gone now, its end at its last sighting (``accounting.backlog``), and
writes them when the database is back, with those times. A pass never waits on
the database for more than half the time between passes, so its sightings keep
their pace whatever the database does; until a pass has written and read again,
the numbers shown are the last read, marked as behind (``GPUTimeSnapshot.lag``),
and the budget rule acts on none of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Container, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from ..accounting.backlog import DEFAULT_LIMIT, AccountingLag, Backlog
from ..accounting.store import AccountingUnavailable, UsageStore, collector_paused
from ..core import words
from ..core.billed_book import BilledBook, billed_book_for
from ..core.budgets import HOUR, UsageBook, UsageRecord, longest_period
from ..core.fairshare import FairShareBook, read_window
from ..core.model import Budget, Policy
from ..core.showback import Series, Showback, check_history, history, month_of
from ..core.showback_tally import ShowbackTally
from ..core.utilisation import Chunks
from .dra_charges import AllocationCharges
from .fair_share import CHANGE_OVER, FairShareSnapshot, fair_share_snapshot
from .hours import DEFAULT_WINDOW, HoursView
from .idle import Prometheus
from .showback_months import ShowbackMonths, put_rows
from .state import ServiceState
from .tasks import RetryAtInterval
from .time_views import group_totals
from .utilisation import UtilisationReader
from .views import Viewer

log = logging.getLogger("jupyterhub_gpu.service")

#: how far back the service keeps records in memory: the longest budget window, and
#: at least two months, so this month's and last month's showback need no query
MIN_HORIZON = 62 * 86400.0


class AccountingBehind(RetryAtInterval):
    """The usage database could not be written or read in this pass: what the pods
    showed is kept to be written later, and the pass runs again at its interval."""


class PodsUnseen(RetryAtInterval):
    """The pod watch is failing: this pass saw no pod (what was kept was written and
    the usage read), and runs again at its interval."""


@dataclass
class GPUTimeSnapshot:
    """What the views read, computed once per pass (not per request)."""

    groups: dict[str, HoursView] = field(default_factory=dict)
    users: dict[tuple[str, str], HoursView] = field(default_factory=dict)  # (user, group)
    #: why the last pass could not write or read the usage database (None: it did)
    error: str | None = None
    fail_open: bool = False
    #: when the numbers above were read from the database (epoch seconds; None: never)
    read_at: float | None = None
    #: how far the database is behind the pods (unwritten events, last write and read)
    lag: AccountingLag = field(default_factory=AccountingLag)
    #: every group's and member's fair-share standing (None: fair share is off)
    fair_share: FairShareSnapshot | None = None
    #: this billing month's figures per group (its children's included, as showback's
    #: group totals: ``time_views.FIGURES``), as of the last pass; for the metrics
    month_totals: dict[str, list[float]] = field(default_factory=dict)

    @property
    def current(self) -> bool:
        """The numbers were read in the last pass, after writing what it saw."""
        return self.error is None and self.read_at is not None


class GPUTime:
    def __init__(
        self,
        policy: Policy,
        state: ServiceState,
        store: UsageStore,
        *,
        fail_open: bool = False,
        clock: Callable[[], float] = time.time,
        prometheus: Prometheus | None = None,
        billing_timezone: str = "UTC",
        backlog_limit: int = DEFAULT_LIMIT,
        utilisation_chunks: Chunks | None = None,
        utilisation_refresh: float = 300.0,
    ) -> None:
        self.policy = policy
        #: the time zone a showback month is taken in (its name, and the zone)
        self.billing_timezone = billing_timezone
        self.zone = ZoneInfo(billing_timezone)
        #: where GPUs' utilisation is read for showback (allocated versus utilised), a
        #: day at a time: a finished day is read once
        self.prometheus = prometheus
        self.utilisation_reader = (
            UtilisationReader(
                prometheus,
                utilisation_chunks or Chunks(zone=self.zone, refresh=utilisation_refresh),
                clock,
            )
            if prometheus is not None
            else None
        )
        self.state = state
        self.store = store
        self.clock = clock
        #: what servers on DRA devices are charged (their claims' allocation)
        self.allocations = AllocationCharges(policy)
        self.book = UsageBook(horizon=max(longest_period(policy), MIN_HORIZON))
        #: with budgets in billed units on weighted flavors: the book's rows in billed
        #: units (None: not needed)
        self.billed = billed_book_for(policy, self.book.horizon)
        #: with fair_share: decayed usage per group and member, fed the book's rows
        self.fair = FairShareBook(policy) if policy.fair_share else None
        #: each month's showback: the book's months from their tally (its records summed
        #: by billing month as they are read, on threads), older ones from the database
        self.months = ShowbackMonths(
            policy,
            billing_timezone,
            clock,
            lambda: self.running,
            self._records,
            self._known,
            self.family,
            self.book.horizon,
            self.utilisation_reader,
        )
        self.snapshot = GPUTimeSnapshot(fail_open=fail_open)
        self._read_at: float | None = None
        #: what the pods showed that is not written yet (all of it, between passes,
        #: only while the database cannot be written)
        self.backlog = Backlog(backlog_limit, log, clock)
        #: since when the database has failed (None: the last pass wrote and read)
        self._failing_since: float | None = None
        #: the write (and read) under way, begun by a pass that did not wait it out
        self._writing: asyncio.Task | None = None
        #: when the last pass began (monotonic): a pass waits at most half the gap
        self._pass_began: float | None = None
        #: the usage database's revision the book is read up to
        self._revision: int | None = None
        self._histories: dict[tuple[str, float, float, float], Series] = {}
        #: the database connections of the reads users ask for (records outside the
        #: book), never the pass's
        self.reader_store = store

    @property
    def readers(self) -> Executor | None:
        """Where reads users ask for (records outside the book, their sums) run: the
        readers' threads, never the pass's (None: the default executor)."""
        return self.months.readers

    @readers.setter
    def readers(self, executor: Executor | None) -> None:
        self.months.readers = executor

    @property
    def rendered(self) -> dict[tuple[str, ...], Any]:
        """What was rendered from the showbacks kept for every admin alike (views, JSON,
        CSV), by key, until a row of their month changes."""
        return self.months.rendered

    @property
    def running(self) -> Mapping[str, Any]:
        """Keys of the server pods alive now: their open records count up to now (none
        while the pod watch fails: they count up to their last sighting)."""
        if self.state.server_pods_behind_since is not None:
            return {}
        return self.state.server_pods or {}

    # ---- recording -------------------------------------------------------------------

    async def record(self) -> str:
        """One pass: keep what the pods show, write it (and all kept before) down, then
        read back what changed. Raises ``AccountingBehind`` when the database could
        not be written or read, with everything kept for the next pass."""
        pods = self.state.server_pods
        if pods is None:
            raise RuntimeError("server pods not listed yet (see the watch server pods task)")
        # read before the clock: a pod seen now was in a list or watch that held then
        behind = self.state.server_pods_behind_since
        now = self.clock()
        began = time.monotonic()
        # the first pass reads every row the book holds: it may take a while
        wait = None if self._pass_began is None else max((began - self._pass_began) / 2, 1.0)
        self._pass_began = began
        live: dict[str, UsageRecord] = {}
        inventory = self.state.dra
        for pod in pods.values() if behind is None else ():
            # a server on DRA devices is charged what its claims were allocated
            if pod.usage is not None and (
                usage := self.allocations.charged(pod.usage, inventory, now)
            ):
                live[usage.uid] = usage
        if behind is None:
            self.allocations.keep_only(p.uid for p in pods.values() if p.uid)
        carried = len(self.backlog)
        if behind is None:
            self.keep(live, now)
        writing = self._writing
        if writing is not None and not writing.done():
            raise self._behind(now, "it has not answered the write begun by an earlier pass")
        if writing is not None and not writing.cancelled() and writing.exception() is not None:
            # an earlier pass's write that ended after that pass stopped waiting for it
            log.warning("GPU usage: an earlier write failed: %r", writing.exception())
        self._writing = writing = asyncio.ensure_future(
            self._write_and_read(set(live) if behind is None else None, now)
        )
        done, _ = await asyncio.wait({writing}, timeout=wait)
        if not done:
            raise self._behind(now, f"it has not answered within {wait:.0f} s")
        self._writing = None
        new, ended, error = writing.result()
        if error is not None:
            raise self._behind(now, error)
        if behind is not None:
            # a pod listed before the failure may be gone: seeing it now would move its
            # row's last sighting (and so its end) past it
            raise PodsUnseen(
                f"no server pod seen since {words.moment(behind)}: the server-pod watch is "
                "failing (see its task); rows keep their last sighting until the pods are "
                "listed again"
            )
        # this month for every group, ready before an admin asks (the largest answer),
        # and its totals per group for the metrics (a row per user and flavor: a thread)
        month = await self.showback(self.month_of(now), None)
        self.snapshot.month_totals = await asyncio.get_running_loop().run_in_executor(
            self.readers, group_totals, month, None, self.policy.charged_groups
        )
        for record in ended:
            log.info(
                "GPU usage: %s's server %s ended unseen; counted until last seen",
                record.user,
                record.key,
            )
        report = f"{len(live)} GPU servers running, {new} recorded new, {len(ended)} ended unseen"
        if carried:
            report += f"; {carried} servers' events kept while the database was unavailable written"
        return report

    def forget_unwritten(self) -> None:
        """This replica stopped acting: what it kept unwritten is the acting replica's to
        see and write now (a write under way is refused by the store's fence)."""
        self._writing = None
        self._pass_began = None
        self.backlog = Backlog(self.backlog.limit, log, self.clock)

    def keep(self, live: Mapping[str, UsageRecord], now: float) -> None:
        """Keep what the pods show at ``now`` until it is written: each live pod's
        start and sighting, and for each pod kept as running that is gone now, its end
        at its last sighting (an inferred end, undone should it be seen again)."""
        for pending in self.backlog.unended():
            if pending.uid not in live and pending.seen is not None:
                self.backlog.add(pending.uid, now, end=pending.seen, inferred=True)
        for uid, record in live.items():
            self.backlog.add(uid, now, record=record, seen=now)

    async def _write_and_read(
        self, live: set[str] | None, now: float
    ) -> tuple[int, list[UsageRecord], str | None]:
        """Write everything kept, end the rows of pods gone since (``live`` None: the
        pods are not known, none is ended), read what changed: (rows new, rows ended
        unseen, why the database failed or None)."""
        new, ended = 0, []
        try:
            carried = len(self.backlog)
            oldest = self.backlog.oldest()
            new = await self.backlog.write(self.store)
            if self._failing_since is not None and carried:
                log.info(
                    "GPU usage database writable again: the events of %d servers kept since "
                    "%s written",
                    carried,
                    words.moment(oldest or now),
                )
            if live is not None:
                # a pod younger than this pass may be missing from the list it was made from
                ended = await asyncio.to_thread(self.store.end_missing, live, now - 10.0)
            await self.read()
        except AccountingUnavailable as e:
            if self._failing_since is None:
                self._failing_since = now
                log.error(
                    "GPU usage database unavailable: what the server pods show is kept in "
                    "memory (at most %d servers) and written when it is back: %s",
                    self.backlog.limit,
                    e,
                )
            self.snapshot.error = str(e)
            self.snapshot.lag = self.lag()
            return new, ended, str(e)
        self._failing_since = None
        return new, ended, None

    def lag(self) -> AccountingLag:
        """How far the database is behind what this service has seen."""
        error = self.snapshot.error if self._failing_since is not None else None
        return AccountingLag(
            ok=self._failing_since is None and self._read_at is not None,
            error=error,
            failing_since=self._failing_since,
            unwritten=len(self.backlog),
            oldest_unwritten=self.backlog.oldest(),
            last_write=self.backlog.last_write,
            last_read=self._read_at,
            dropped=self.backlog.dropped,
        )

    def _behind(self, now: float, why: str) -> AccountingBehind:
        """The pass's failure: the snapshot says so (numbers kept, marked behind)."""
        if self._failing_since is None:
            self._failing_since = now
        if self.snapshot.error is None:
            self.snapshot.error = f"the GPU usage database is behind: {why}"
        self.snapshot.lag = self.lag()
        oldest = self.snapshot.lag.oldest_unwritten
        since = f", the oldest from {words.moment(oldest)}" if oldest is not None else ""
        return AccountingBehind(
            f"{len(self.backlog)} servers' GPU usage kept in memory until the usage database "
            f"can be written{since}: {why}"
        )

    async def read(self) -> None:
        """Bring the book up to date and recompute what the views show."""
        now = self.clock()
        if self._revision is None:
            await self._first_read(now)
            return
        # every row written since, in the order written (whatever its times)
        records, revision = await asyncio.to_thread(self.store.changed_since, self._revision)
        # a pass's rows (mostly its sightings: the running servers) into the book
        self._take(self.book, self.fair, records, now, self.billed)
        self._revision = revision
        self._read_at = now
        self._failing_since = None
        # every group's, parent's and member's sums (some thousand owners) on the pass's
        # thread; nothing changes the book until the next pass reads again
        running = frozenset(self.running)
        sums = await asyncio.get_running_loop().run_in_executor(
            None, self._sums, self.book, self.fair, now, running
        )
        self.snapshot = self._snapshot(*sums)
        # and into the month tally, on a thread (the months before the book's reach
        # forgotten there too): the pass does not wait for it
        self.months.take(records, now, now - self.book.horizon)
        self._histories.clear()

    async def _first_read(self, now: float) -> None:
        """The first read: every row of the book's reach (a year's at a large site, some
        hundred thousand), read, indexed and summed in a thread, so the event loop keeps
        answering meanwhile; what the views read is swapped in at once when it is done.
        Nothing else touches these books before then (views and history go to the
        database until the first read is in)."""
        since = now - max(self.book.horizon, read_window(self.policy))
        # the pods' watch changes ``running`` on the loop: the thread sums a copy
        running = frozenset(self.running)

        def build() -> tuple[UsageBook, ShowbackTally, FairShareBook | None, Any, int, Any]:
            with collector_paused():
                return build_books()

        def build_books() -> tuple[
            UsageBook, ShowbackTally, FairShareBook | None, BilledBook | None, int, Any
        ]:
            records, revision = self.store.snapshot(since, now)
            book = UsageBook(horizon=self.book.horizon)
            tally = self.months.new_tally()
            fair = FairShareBook(self.policy) if self.policy.fair_share else None
            billed = billed_book_for(self.policy, book.horizon)
            self._take(book, fair, records, now, billed)
            put_rows(tally, records, now, now - book.horizon)
            sums = self._sums(book, fair, now, running, billed)
            return book, tally, fair, billed, revision, sums

        self.book, tally, self.fair, self.billed, revision, sums = await asyncio.to_thread(build)
        self._revision = revision
        self._read_at = now
        self._failing_since = None
        self.snapshot = self._snapshot(*sums)
        self.months.replace(tally)
        self._histories.clear()

    def _take(
        self,
        book: UsageBook,
        fair: FairShareBook | None,
        records: list[UsageRecord],
        now: float,
        billed: BilledBook | None = None,
    ) -> None:
        """Put rows read into the book (and the book in billed units) and the fair-share
        standings."""
        for record in records:
            earlier = book.open_by_key.get(record.key)
            book.put(self.policy, record)
            if billed is not None:
                billed.put(self.policy, record)
            if fair is not None:
                if earlier is not None and earlier is not record and earlier.ended is not None:
                    fair.ended(earlier)  # ended in place by the book
                fair.put(record)
        if fair is not None:
            fair.settle(now)
        book.prune(self.policy, now)
        if billed is not None:
            billed.prune(self.policy, now)

    def compute(self, now: float) -> GPUTimeSnapshot:
        return self._snapshot(*self._sums(self.book, self.fair, now, self.running, self.billed))

    def _sums(
        self,
        book: UsageBook,
        fair_book: FairShareBook | None,
        now: float,
        running: Container[str],
        billed: BilledBook | None = None,
    ) -> tuple[
        float, dict[str, HoursView], dict[tuple[str, str], HoursView], FairShareSnapshot | None
    ]:
        """Every group's and member's GPU-hours in its window, and the fair-share standings.

        Each window's sums are kept by the book as the clock moves (closed records
        summed once, open ones each pass): a pass at a year of a large cluster's
        records costs what one at a day's does."""
        windows: dict[tuple[float, bool], dict[tuple[str, str | None], float]] = {}

        def view(owner: tuple[str, str | None], budget: Budget | None) -> HoursView:
            period = budget.period if budget else DEFAULT_WINDOW
            in_units = budget is not None and budget.in_units
            # a budget in units reads the book in billed units (none: no flavor is
            # weighted, and its units are the GPU-hours)
            kept = billed if in_units and billed is not None else book
            sums = windows.get((period, kept is billed))
            if sums is None:
                sums = windows[(period, kept is billed)] = kept.window_seconds(
                    float(period), now, running
                )
            used = sums.get(owner, 0.0) / HOUR
            cap = budget.amount if budget else None
            return HoursView(used, cap, period, cap is not None and used >= cap, in_units)

        groups = {
            group.name: view((group.name, None), None if group.unlimited else group.budget)
            for group in self.policy.all_groups
        }
        users = {}
        for user, group_name in book.by_user:
            group = self.policy.find_group(group_name)
            users[(user, group_name)] = view(
                (group_name, user), group.user_budget if group else None
            )
        fair = None
        if fair_book is not None:
            # only the records of the window it compares with (not a year's)
            recent = book.window_records(float(CHANGE_OVER), now)
            fair = fair_share_snapshot(self.policy, fair_book, recent, now, running)
        return now, groups, users, fair

    def _snapshot(
        self,
        now: float,
        groups: dict[str, HoursView],
        users: dict[tuple[str, str], HoursView],
        fair: FairShareSnapshot | None,
    ) -> GPUTimeSnapshot:
        return GPUTimeSnapshot(
            groups,
            users,
            None,
            self.snapshot.fail_open,
            read_at=now,
            lag=self.lag(),
            fair_share=fair,
            month_totals=self.snapshot.month_totals,
        )

    # ---- looking back ----------------------------------------------------------------

    async def _records(
        self, since: float, until: float, groups: set[str] | None
    ) -> list[UsageRecord]:
        """Records of ``groups`` (None: all) overlapping [since, until): from memory when
        it reaches back that far (only those groups' own records), else from the database."""
        if self._read_at is not None and since >= self.clock() - self.book.horizon:
            if groups is None:
                return list(self.book.records.values())
            found: dict[str, UsageRecord] = {}
            for group in groups:
                # a group's index holds its children's records too: keep its own
                found.update(
                    (r.uid, r) for r in self.book.group_records(group) if r.group in groups
                )
            return list(found.values())
        wanted = None if groups is None else sorted(groups)
        records = await asyncio.get_running_loop().run_in_executor(
            self.readers, self.reader_store.overlapping, since, until, wanted
        )
        return [r for r in records if groups is None or r.group in groups]

    def family(self, group: str) -> set[str]:
        """The group and every group below it (its use includes theirs)."""
        return {
            g.name
            for g in self.policy.all_groups
            if any(a.name == group for a in self.policy.ancestors(g.name))
        }

    async def history(self, group: str, since: float, until: float, step: float) -> Series:
        """``group``'s GPU use over time; the range and points are checked before any
        record is read, the sums made off the event loop, and each answer kept until the
        next pass reads the book again."""
        check_history(since, until, step)
        key = (group, since, until, step)
        cached = self._histories.get(key)
        if cached is not None:
            return cached
        records = await self._records(since, until, self.family(group))
        series = await asyncio.get_running_loop().run_in_executor(
            self.readers, history, records, since, until, step, self.clock(), self.running
        )
        if len(self._histories) >= 256:
            self._histories.pop(next(iter(self._histories)))
        self._histories[key] = series
        return series

    def month_of(self, epoch: float) -> str:
        """The billing month (``YYYY-MM``, in the billing time zone) of a moment."""
        return month_of(epoch, self.zone)

    async def showback(self, month: str, groups: set[str] | None) -> Showback:
        """GPU-hours of a month (``YYYY-MM``, in the billing time zone) for ``groups``
        and the groups below them (a parent's total includes its children's; None:
        every group): worked out on threads (``ShowbackMonths``)."""
        return await self.months.showback(month, groups)

    def _known(self, groups: Collection[str] | None) -> bool:
        """Whether the book holds any record of ``groups`` (or their children; None: any
        record at all)."""
        book = self.book
        return bool(book.records) if groups is None else any(book.by_group.get(g) for g in groups)

    async def showback_view(
        self, month: str, viewer: Viewer, admin: bool, groups: set[str] | None
    ) -> dict[str, Any]:
        """``api/showback``'s JSON view for this viewer (an admin's is every admin's,
        rendered once until the next pass)."""
        budgets = {n: h.to_json() for n, h in self.snapshot.groups.items() if h.budget is not None}
        return await self.months.view(month, viewer, admin, groups, budgets)
