"""The GPU service's showback of billing months, worked out off the event loop.

The months of the records kept in memory (``GPUTime``'s book: at least two months)
are answered from the month tally (``core.showback_tally``); older months are summed
from the usage database's rows, on the readers' threads and connections.

Everything here that grows with the records is done on a thread, never on the
event loop: putting each pass's rows into the tally, listing the sessions whose
utilisation a month still needs and making them, their means, keeping the sessions
whose means are final (a month's first answer after a start keeps tens of
thousands) and the sums. The loop hands the work over, reads the utilisation from
Prometheus and takes a viewer's groups from the answer.

The tally is changed and read by one thread at a time, in the order asked: a step
holds an ``asyncio.Lock`` (waited for on the loop, never on a thread) while its
thread runs, and first puts the rows of the passes before it, so no step sees the
tally half-changed and every answer asked for after a pass counts that pass's rows.
These steps run on the pass's executor (the loop's default): a month's answer is
worked out once per pass for every group, whoever asks first, shared by those who
ask meanwhile and kept until a row of that month changes; a member's answer is their
groups' part of it. So readers can neither multiply the tally's work nor make the
pass wait behind theirs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Container, Mapping
from concurrent.futures import Executor
from typing import Any
from zoneinfo import ZoneInfo

from ..core.billing import Billing
from ..core.budgets import UsageRecord
from ..core.energy import unmetered_flavors
from ..core.model import Policy
from ..core.showback import Showback, month_bounds, of_groups, sessions_of, showback
from ..core.showback_tally import ShowbackTally
from ..core.utilisation import Session
from .idle import shares_its_device
from .time_views import showback_json
from .utilisation import Measured, UtilisationReader
from .views import Viewer

log = logging.getLogger("jupyterhub_gpu.service")

#: a showback kept: (month, the groups asked for, sorted; None: every group)
Key = tuple[str, tuple[str, ...] | None]
#: a pass's rows for the tally: (rows read, when, the moment the book keeps from)
Pending = tuple[list[UsageRecord], float, float]


def shared_flavors(policy: Policy) -> set[str]:
    """The flavors whose GPUs are shared: a device's utilisation is all its sharers',
    so it tells nothing of one session's."""
    return {n for n, f in policy.flavors.items() if shares_its_device(f)}


def put_rows(tally: ShowbackTally, records: list[UsageRecord], now: float, kept: float) -> None:
    """Rows read into the tally, and the months before ``kept`` forgotten (on a thread:
    the first read's are a year's)."""
    for record in records:
        tally.put(record, now)
    tally.prune(kept)


def unmeasured_sessions(
    tally: ShowbackTally,
    month: str,
    since: float,
    until: float,
    now: float,
    running: Container[str],
) -> dict[str, Session]:
    """The sessions of ``month`` (up to ``until``) whose mean is not final yet: all the
    month's ended ones at the first answer after a start, then the running servers and
    those that ended in a day still being read."""
    return sessions_of(tally.unmeasured(month, now), since, until, now, running)


def tallied_answer(
    tally: ShowbackTally,
    month: str,
    now: float,
    running: Container[str],
    sessions: Mapping[str, Session] | None,
    measured: Measured | None,
) -> Showback | None:
    """The month's showback for every group: the sessions whose means ``measured``
    says are final kept in the tally for good (their end as ``sessions`` had it), the
    others measured with its utilisation and power; None when the tally no longer
    keeps the month (pruned since it was asked for)."""
    if tally.month_bounds(month)[0] < tally.pruned:
        return None
    if measured is None:
        return tally.showback(month, now, running)
    utilisation, power, coverage = measured.utilisation, measured.power, measured.coverage
    if sessions is not None and coverage.final:
        final = coverage.final
        tally.finalise(
            month, ((uid, utilisation.get(uid), sessions[uid][2]) for uid in final), power
        )
        utilisation = {k: v for k, v in utilisation.items() if k not in final}
        power = {k: v for k, v in power.items() if k not in final}
    result = tally.showback(month, now, running, utilisation, None, power)
    return dataclasses.replace(result, coverage=coverage)


class ShowbackMonths:
    """Each billing month's showback, from the tally or the usage database, computed
    on threads and kept until a row of that month changes."""

    def __init__(
        self,
        policy: Policy,
        billing_timezone: str,
        clock: Callable[[], float],
        running: Callable[[], Mapping[str, Any]],
        records: Callable[[float, float, set[str] | None], Awaitable[list[UsageRecord]]],
        known: Callable[[Collection[str] | None], bool],
        family: Callable[[str], set[str]],
        horizon: float,
        utilisation_reader: UtilisationReader | None = None,
    ) -> None:
        self.policy = policy
        self.billing_timezone = billing_timezone
        self.zone = ZoneInfo(billing_timezone)
        self.clock = clock
        #: the server pods alive now (the service's watch, changed on the loop)
        self.running = running
        #: the records of groups (None: all) overlapping a range, from memory or the
        #: usage database
        self.records = records
        #: whether the records in memory hold any of these groups' (None: any at all)
        self.known = known
        self.family = family
        #: how far back the records in memory reach (seconds before now)
        self.horizon = horizon
        self.utilisation_reader = utilisation_reader
        self.shared = shared_flavors(policy)
        #: the flavors whose servers' GPU power is not theirs alone: no energy measured
        self.unmetered = unmetered_flavors(policy)
        #: grams of CO2 equivalent per kWh, for showback's emissions (None: not given)
        self.emissions_factor: float | None = None
        self.billing = Billing.of(policy)
        #: the book's records summed by billing month; changed and read on threads only,
        #: one step at a time (``_step``)
        self.tally = self.new_tally()
        #: the tally holds the records in memory (their first read is done)
        self.ready = False
        self._lock = asyncio.Lock()
        #: the passes' rows not in the tally yet, in the order read (the next step puts them)
        self._pending: list[Pending] = []
        self._putting: asyncio.Task | None = None
        #: showbacks computed since a row of their month last changed
        self.answers: dict[Key, Showback] = {}
        #: the tally's answers under way, by month (every group's, shared)
        self._computing: dict[str, asyncio.Future[Showback | None]] = {}
        #: how many times rows have changed: an answer begun before a change is not kept
        self._changes = 0
        #: what was rendered from them for every admin alike (views, JSON, CSV), by key
        self.rendered: dict[tuple[str, ...], Any] = {}
        #: where reads of older months run (their records and sums): the readers' threads
        self.readers: Executor | None = None

    def new_tally(self) -> ShowbackTally:
        """An empty tally for this policy's flavors and rates."""
        return ShowbackTally(self.zone, self.shared, self.billing, self.unmetered)

    # ---- the tally, one step at a time on a thread ------------------------------------

    async def _step(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(tally, *args)`` on the pass's executor, after the rows of the passes so
        far are put, with no other step under way."""
        async with self._lock:
            pending, self._pending = self._pending, []
            tally = self.tally

            def run() -> Any:
                for records, now, kept in pending:
                    put_rows(tally, records, now, kept)
                return work(tally, *args)

            return await asyncio.get_running_loop().run_in_executor(None, run)

    def take(self, records: list[UsageRecord], now: float, kept: float) -> None:
        """A pass's rows read at ``now`` (the book keeping records from ``kept``): put into
        the tally by the next step, before any answer asked for from now on; what they
        change is no longer kept. Returns at once: the pass does not wait for the tally."""
        self._pending.append((records, now, kept))
        self._forget(records)
        if self._putting is None or self._putting.done():
            # a step of its own, so rows are put even when no showback is asked for
            self._putting = asyncio.ensure_future(self._step(lambda tally: None))
            self._putting.add_done_callback(_log_failure)

    def replace(self, tally: ShowbackTally) -> None:
        """The tally made by the first read, of every record in memory."""
        self.tally = tally
        self._pending.clear()
        self.ready = True
        self.answers.clear()
        self._computing.clear()
        self._changes += 1
        self.rendered = {}

    def _forget(self, changed: list[UsageRecord]) -> None:
        """Drop the showbacks the rows just read change, and what was rendered from them.
        A finished month that none of them overlaps, with all its utilisation read, is
        kept: its answer is the same until one of its rows changes (the usage database's
        revision moves with every pass's sightings, so it alone cannot tell)."""
        self._changes += 1
        months = set()
        for (month, _), result in self.answers.items():
            end = month_bounds(month, self.zone)[1]
            coverage = result.coverage
            if (
                result.until < end
                or (coverage is not None and coverage.unread > 0)
                or any(
                    r.started < end and (r.ended is None or r.ended > result.since) for r in changed
                )
            ):
                months.add(month)
        # an answer under way may have read the tally before these rows: asked anew
        self._computing.clear()
        self.answers = {k: v for k, v in self.answers.items() if k[0] not in months}
        self.rendered = {k: v for k, v in self.rendered.items() if not months.intersection(k)}

    # ---- answers ----------------------------------------------------------------------

    async def showback(self, month: str, groups: set[str] | None) -> Showback:
        """GPU-hours of a month (``YYYY-MM``, in the billing time zone) for ``groups``
        and the groups below them (a parent's total includes its children's; None:
        every group)."""
        since, until = month_bounds(month, self.zone)
        if groups is not None:
            groups = set().union(*(self.family(g) for g in groups))
        key = (month, None if groups is None else tuple(sorted(groups)))
        cached = self.answers.get(key)
        if cached is not None:
            # the same until the next pass reads the book again (usage_interval)
            return cached
        changes = self._changes
        now = self.clock()
        until = min(until, now)
        result = None
        if self.ready and since >= max(now - self.horizon, self.tally.pruned):
            whole = await self._month(month, since, until)
            if whole is not None and groups is not None:
                # their rows of every group's answer: the same sums, in the same order
                whole = of_groups(whole, groups)
                if not self.known(groups):
                    whole = dataclasses.replace(whole, coverage=None)
            result = whole
        if result is None:
            result = await self._summed(since, until, now, groups)
        if changes == self._changes:
            self._keep(key, result)
        return result

    async def _month(self, month: str, since: float, until: float) -> Showback | None:
        """Every group's showback of a month the tally keeps: kept, under way, or a new
        one (None: the tally no longer keeps it)."""
        whole = self.answers.get((month, None))
        if whole is not None:
            return whole
        computing = self._computing.get(month)
        if computing is None:
            changes = self._changes
            computing = asyncio.ensure_future(self._tallied(month, since, until))
            self._computing[month] = computing

            def done(future: asyncio.Future[Showback | None]) -> None:
                if self._computing.get(month) is future:
                    del self._computing[month]
                _log_failure(future)
                kept = not future.cancelled() and future.exception() is None
                if kept and future.result() is not None and changes == self._changes:
                    self._keep((month, None), future.result())

            computing.add_done_callback(done)
        # shielded: an asker who stops waiting leaves the answer to the others
        return await asyncio.shield(computing)

    def _keep(self, key: Key, result: Showback) -> None:
        if len(self.answers) >= 256:
            self.answers.pop(next(iter(self.answers)))
        self.answers[key] = result

    async def _tallied(self, month: str, since: float, until: float) -> Showback | None:
        """A month of the book's from its tally: the closed records' sums kept, the
        running servers' added; with Prometheus, the sessions not final yet measured,
        and those final now kept. All of it on threads."""
        sessions = measured = None
        if until > since and self.known(None) and self.utilisation_reader is not None:
            now = self.clock()
            # the pods' watch changes the running servers on the loop: a copy for the thread
            running = frozenset(self.running())
            sessions = await self._step(
                unmeasured_sessions, month, since, min(until, now), now, running
            )
            measured = await self.measure(since, until, sessions, None)
        # the clock read after the utilisation: a pass meanwhile put rows up to its own
        return await self._step(
            tallied_answer, month, self.clock(), frozenset(self.running()), sessions, measured
        )

    async def _summed(
        self, since: float, until: float, now: float, groups: set[str] | None
    ) -> Showback:
        """A month older than the book's: summed from the usage database's records, on
        the readers' threads (a month's are a few hundred thousand at a large site)."""
        records = await self.records(since, until, groups) if until > since else []
        loop = asyncio.get_running_loop()
        running = frozenset(self.running())
        measured = None
        if records and self.utilisation_reader is not None:
            sessions = await loop.run_in_executor(
                self.readers, sessions_of, records, since, until, now, running, self.shared
            )
            measured = await self.measure(since, until, sessions, self.readers)
        # no session of a shared flavor was measured (``sessions_of``), nor the energy
        # of an unmetered one
        result = await loop.run_in_executor(
            self.readers,
            showback,
            records,
            since,
            until,
            now,
            running,
            measured.utilisation if measured else None,
            self.billing,
            measured.power if measured else None,
            self.unmetered,
        )
        if measured is not None:
            result = dataclasses.replace(result, coverage=measured.coverage)
        return result

    async def measure(
        self,
        since: float,
        until: float,
        sessions: Mapping[str, Session],
        executor: Executor | None = None,
    ) -> Measured | None:
        """Each session's mean GPU utilisation (percent) and power (watts) from
        ``since`` to ``until`` over its own pod's life, by its id (the record's uid),
        from the DCGM metrics in Prometheus, worked out on ``executor``, and which part
        of the range it covers; None without Prometheus."""
        if self.utilisation_reader is None:
            return None
        return await self.utilisation_reader.measure(since, until, sessions, executor)

    async def view(
        self,
        month: str,
        viewer: Viewer,
        admin: bool,
        groups: set[str] | None,
        budgets: dict[str, Any],
    ) -> dict[str, Any]:
        """``api/showback``'s JSON view for this viewer (an admin's is every admin's,
        rendered once until the next pass), rendered on the readers' threads (an
        admin's has a row per user and flavor)."""
        key = ("view", month)
        if admin and key in self.rendered:
            return self.rendered[key]
        # an answer begun before a pass is the asker's, not kept for the next ones
        changes = self._changes
        result = await self.showback(month, groups)
        view = await asyncio.get_running_loop().run_in_executor(
            self.readers,
            showback_json,
            month,
            result,
            viewer,
            admin,
            groups,
            budgets,
            self.policy.charged_groups,
            self.billing_timezone,
            self.policy,
            self.emissions_factor,
        )
        if admin and changes == self._changes:
            self.rendered[key] = view
        return view


def _log_failure(task: asyncio.Future) -> None:
    """A step nobody waits for any more (its askers left, or the rows' own) that failed."""
    if not task.cancelled() and task.exception() is not None:
        log.error("showback: the month tally's work failed", exc_info=task.exception())
