"""The hub's admission of spawns: one ledger, kept true, and the lines spawns wait in.

Every ``GPUKubeSpawner`` of a hub shares one ``SpawnAdmission``: the ``Ledger``
(``core.admission``, pure arithmetic), its first rebuild from pod labels, its
periodic resync against the pods, the line of ``when_full: wait`` (first come,
first served, or with ``fair_share`` by standing: ``core.fairshare``), and the
deletions still finishing after failed stops. The
spawner supplies what only it can do (list the charged pods, with its Kubernetes
client and namespaces); everything else about admission lives here, in one
object a test can replace.

GPU time: the hub writes each GPU server's start and end to the usage database
through a ``Backlog``, so a write the database refuses is kept (bounded) and
written, with its true time, at the next chance: a retry soon after, every
ledger resync, every later write. After any failed read or write, GPU spawns of
groups with a budget follow ``accounting_fail_open`` (refused by default) until
everything kept is written and the rows are read again: never admitted on
numbers that could not be refreshed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..accounting.backlog import DEFAULT_LIMIT, AccountingLag, Backlog
from ..accounting.store import AccountingUnavailable, UsageStore, collector_paused
from ..core import words
from ..core.admission import Charge, Decision, Ledger
from ..core.budgets import (
    BudgetState,
    UsageBook,
    UsageRecord,
    budget_refusal,
    budgets_of,
    has_budget,
    longest_period,
)
from ..core.dra import DraInventory, allocated_gpus
from ..core.fairshare import (
    FairShareBook,
    Place,
    Waiter,
    burst_band,
    read_window,
    why_placed,
)
from ..core.line import Line
from ..core.model import Group, Policy
from ..core.pending import STARTS_BY_ITSELF
from ..core.selection import Request
from ..core.shaping import usage_record_from_pod

#: lists the charges on the pods Kubernetes has now (the spawner's own client)
ListCharges = Callable[[Policy], Awaitable[list[Charge]]]

#: seconds between two workings-out of every waiting server's standing (standings
#: move slowly: a half-life is days), all for one moment, off any spawn's path; a
#: newcomer's is worked out for that same moment, so the line compares like with like
#: (a group's usage grows while its servers run: standings of two moments differ)
ORDER_KEPT = 1.0
#: standings worked out between two turns of the event loop, when all are
STANDINGS_PER_TURN = 200

#: what a GPU spawn of a group with a budget is told while budgets cannot be checked
BUDGETS_UNCHECKED = (
    "GPU-hour budgets cannot be checked now, as the usage database is unavailable, so "
    "GPU servers of groups with a budget cannot start: try again in a few minutes, or "
    "start one without GPUs"
)

#: why a budget refused a spawn, in one word (the hub counts refused spawns by it)
REFUSED_BUDGET = "budget"
REFUSED_USAGE_DATABASE = "usage_database"


class SpawnAdmission:
    """The ledger every spawn is admitted against, and the lines they wait in."""

    def __init__(self, log: logging.Logger | None = None, *, loaded: bool = False) -> None:
        self.log = log or logging.getLogger("jupyterhub_gpu")
        self.ledger = Ledger()
        #: the ledger has been rebuilt from pods (or there is nothing to read: offline)
        self.loaded = loaded
        self._loading: asyncio.Future | None = None
        self._resync: asyncio.Task | None = None
        #: the servers waiting for capacity, kept in the order they go (``waiting``:
        #: by group)
        self.line = Line()
        self._arrivals = itertools.count()
        #: the moment every waiting server's standing was worked out for, and the task
        #: that works them out again every ``ORDER_KEPT`` while any server waits
        self._standings_at: float | None = None
        self._restanding: asyncio.Task | None = None
        #: with fair_share: each group's and member's decayed GPU time, fed the same
        #: records as ``usage``
        self.fair: FairShareBook | None = None
        self._changed: asyncio.Condition | None = None
        #: servers admitted whose start has not finished, and when each server was last
        #: admitted, started or released (monotonic): the resync leaves these as they
        #: are, as their pods may not exist yet, or be too new or too old for its listing
        self.starting: set[str] = set()
        self.touched: dict[str, float] = {}
        #: deletions of pods whose stop failed, retried until the pod is gone
        self.finishing: set[asyncio.Future] = set()
        #: server pods started before the policy that were running at the last listing
        #: (rebuild or resync): while there are any, new servers do not preempt
        self.servers_before_policy = 0
        #: GPU time: the usage records budgets are checked against, read from the
        #: usage database (``store``) and kept current by this hub's own starts and stops
        self.usage = UsageBook()
        self.store: UsageStore | None = None
        self.fail_open = False
        self.usage_loaded = loaded
        self.usage_error: str | None = None
        #: since when a read or write of the usage database has failed (None: the last
        #: read succeeded, with everything kept written first)
        self.usage_failing_since: float | None = None
        #: when the usage database was last read
        self.usage_read_at: float | None = None
        #: the usage database's revision read up to (None: not read yet)
        self._usage_revision: int | None = None
        self.clock: Callable[[], float] = time.time
        #: starts and ends not written yet (while the database cannot be written)
        self.backlog = Backlog(DEFAULT_LIMIT, self.log, lambda: self.clock())
        #: the longest wait between two retries after a failure (seconds)
        self.retry_max = 30.0
        self._policy: Policy | None = None
        self._database: asyncio.Lock | None = None
        self._retrying: asyncio.Task | None = None

    def use_store(self, store: UsageStore, fail_open: bool) -> None:
        """Record GPU time in ``store`` and check budgets against what it holds."""
        self.store = store
        self.fail_open = fail_open
        self.usage_loaded = False

    @classmethod
    def empty_cluster(cls) -> SpawnAdmission:
        """An admission that knows no servers and reads nothing from Kubernetes: what
        ``jupyterhub-gpu profiles`` and ``pod`` assume."""
        return cls(loaded=True)

    @property
    def changed(self) -> asyncio.Condition:
        """Notified whenever a charge is released (created in the running loop)."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    # ---- the ledger, rebuilt from pods ----------------------------------------------

    async def ready_ledger(
        self, policy: Policy, list_charges: ListCharges, resync_interval: float
    ) -> Ledger:
        """The ledger, rebuilt from pod labels the first time it is needed."""
        if not self.loaded:
            # shielded: one cancelled spawn must not cancel the rebuild the others await
            await asyncio.shield(self.begin_rebuild(policy, list_charges, resync_interval))
        return self.ledger

    def begin_rebuild(
        self, policy: Policy, list_charges: ListCharges, resync_interval: float
    ) -> asyncio.Future:
        """The rebuild of the ledger under way, started unless one is.

        One rebuild every waiting spawn awaits: its end wakes them all in one turn of
        the event loop, where an asyncio.Lock would hand over to its waiters one turn
        at a time (a storm right after a hub start queued ~50 spawns behind it for
        10 s). A failed rebuild answers the spawns awaiting it; the next one retries.
        """
        if self._loading is None or self._loading.done():
            self._loading = asyncio.ensure_future(
                self._rebuild(policy, list_charges, resync_interval)
            )
            self._loading.add_done_callback(self._report_failed_rebuild)
        return self._loading

    def _report_failed_rebuild(self, rebuild: asyncio.Future) -> None:
        if not rebuild.cancelled() and rebuild.exception() is not None:
            self.log.warning(
                "GPU ledger rebuild failed (the next spawn retries): %s", rebuild.exception()
            )

    async def _rebuild(
        self, policy: Policy, list_charges: ListCharges, resync_interval: float
    ) -> None:
        charges = await list_charges(policy)
        # the usage too, before any spawn is decided against this ledger
        await self.read_usage(policy)
        self.ledger = Ledger.from_charges(policy, charges)
        self.loaded = True
        if resync_interval > 0 and self._resync is None:
            self._resync = asyncio.create_task(
                self._resync_forever(policy, list_charges, resync_interval)
            )
        self.log.info("GPU ledger rebuilt from %d running servers", len(charges))

    async def _resync_forever(
        self, policy: Policy, list_charges: ListCharges, interval: float
    ) -> None:
        previous_listing = self.clock()  # the rebuild's listing, just before
        while True:
            await asyncio.sleep(interval)
            try:
                listed_at = time.monotonic()
                listed_wall = self.clock()
                charges = await list_charges(policy)
            except Exception as e:  # the API server restarting: try again next time
                self.log.warning("GPU ledger resync skipped: %r", e)
                continue
            # spawns under way, and servers admitted or started since the listing
            keep = self.starting | {k for k, at in self.touched.items() if at >= listed_at}
            added, released = self.ledger.resync(policy, charges, keep)
            for key in released:
                # gone since the last listing: its GPU time ends at the last sighting,
                # an inferred end (a later sighting of its pod undoes it)
                self.record_stop(key, at=previous_listing, inferred=True)
            previous_listing = listed_wall
            for key, what in [(k, "counted") for k in added] + [(k, "released") for k in released]:
                self.log.warning("GPU ledger resync: %s %s (the hub had missed it)", what, key)
            if released:
                await self._notify()
            await self.read_usage(policy)
            horizon = time.monotonic() - 10 * max(interval, 1)
            for key in [k for k, at in self.touched.items() if at < horizon]:
                del self.touched[key]

    # ---- GPU time -------------------------------------------------------------------

    @property
    def usage_current(self) -> bool:
        """Budgets can be checked: the usage was read, and nothing failed since."""
        return self.usage_loaded and self.usage_failing_since is None

    def _database_lock(self) -> asyncio.Lock:
        """Held by every read and write of the usage database: one at a time, so a
        read never misses a write of this hub's that is under way."""
        if self._database is None:
            self._database = asyncio.Lock()
        return self._database

    async def read_usage(self, policy: Policy) -> None:
        """Write what is kept, then bring the usage book up to date with the database
        (only rows changed since the last read, after the first). A failure is kept,
        shown and retried; budgets are checked again once a read succeeds."""
        self._policy = policy
        if self.store is None:
            self.usage_loaded = True  # nothing recorded: offline rendering
            return
        async with self._database_lock():
            if not await self._write_kept():
                return  # its failure is noted: what is read now would be behind
            now = self.clock()
            first = self._usage_revision is None
            try:
                if first:
                    since = now - max(longest_period(policy), read_window(policy))
                    records, revision = await asyncio.to_thread(self.store.snapshot, since, now)
                else:
                    # every row written since, in the order written (whatever its times)
                    records, revision = await asyncio.to_thread(
                        self.store.changed_since, self._usage_revision
                    )
            except AccountingUnavailable as e:
                self._failed(e)
                return
            if first:
                await self._first_book(policy, records, now)  # pruned there
            else:
                for record in records:
                    pending = self.backlog.get(record.uid)
                    self.count_usage(policy, pending.applied(record) if pending else record)
                self.usage.prune(policy, now)
            if self.fair is not None:
                self.fair.settle(now)
            self._usage_revision = revision
            self.usage_read_at = now
            if self.usage_failing_since is not None:
                self.log.info("GPU usage database readable and writable again")
            self.usage_error = None
            self.usage_failing_since = None
            self.usage_loaded = True

    async def _first_book(self, policy: Policy, records: list[UsageRecord], now: float) -> None:
        """The book of the first read, built in a thread: a year of a large cluster's
        rows (some hundred thousand) take seconds to index, and spawns and the hub's
        pages must not wait on them. This hub's own starts and stops meanwhile (and
        since it started) are put in on the loop, then the rows with events not yet
        written, as a later read does."""

        def build() -> tuple[UsageBook, FairShareBook | None]:
            with collector_paused():
                return build_book()

        def build_book() -> tuple[UsageBook, FairShareBook | None]:
            book = UsageBook.for_policy(policy)
            fair = FairShareBook(policy) if policy.fair_share is not None else None
            for record in records:
                earlier = book.open_by_key.get(record.key)
                book.put(policy, record)
                if fair is not None:
                    if earlier is not None and earlier is not record and earlier.ended is not None:
                        fair.ended(earlier)  # the book ended the pod this one replaced
                    fair.put(record)
            book.prune(policy, now)
            return book, fair

        book, fair = await asyncio.to_thread(build)
        mine = [r for r in self.usage.records.values() if r.uid not in book.records]
        self.usage, self.fair = book, fair
        for record in mine:
            # this hub's own starts and stops since it started (the database's row of
            # one, where there is one, is the later word, as it always was)
            self.count_usage(policy, record)
        for record in records if len(self.backlog) else ():
            pending = self.backlog.get(record.uid)
            if pending is not None:
                self.count_usage(policy, pending.applied(record))

    async def _write_kept(self) -> bool:
        """Write the starts and ends kept (the caller holds the database lock);
        whether everything was written."""
        if not len(self.backlog) or self.store is None:
            return True
        try:
            await self.backlog.write(self.store)
        except AccountingUnavailable as e:
            self._failed(e)
            return False
        return True

    def _failed(self, error: AccountingUnavailable) -> None:
        """A read or write failed: budgets are not checked on what the hub holds until a
        read succeeds again, which is retried soon."""
        if self.usage_failing_since is None:
            self.usage_failing_since = self.clock()
            self.log.error(
                "GPU usage database unavailable: GPU spawns of groups with a budget are %s "
                "until it can be read again; starts and stops are kept in memory (at most "
                "%d servers) and written then: %s",
                "admitted unchecked" if self.fail_open else "refused",
                self.backlog.limit,
                error,
            )
        self.usage_error = str(error)
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.ensure_future(self._retry())

    async def _retry(self) -> None:
        """After a failure: write what is kept and read again, waiting longer each time
        (up to ``retry_max``), until both succeed."""
        delay = 1.0
        while self.usage_failing_since is not None or len(self.backlog):
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max)
            try:
                if self._policy is not None:
                    await self.read_usage(self._policy)
                else:
                    async with self._database_lock():
                        if await self._write_kept():
                            self.usage_failing_since = None
            except Exception:
                self.log.exception("GPU usage: retrying the usage database failed")

    def accounting(self) -> AccountingLag:
        """How far the usage database is behind what this hub has seen (for the
        hub's metrics)."""
        return AccountingLag(
            ok=self.usage_current,
            error=self.usage_error if self.usage_failing_since is not None else None,
            failing_since=self.usage_failing_since,
            unwritten=len(self.backlog),
            oldest_unwritten=self.backlog.oldest(),
            last_write=self.backlog.last_write,
            last_read=self.usage_read_at,
            dropped=self.backlog.dropped,
        )

    def budget_refusal(
        self, policy: Policy, user: str, group: Group, request: Request
    ) -> str | None:
        """Why a GPU budget forbids this server now, or None (synchronous: it is part of
        the atomic admission)."""
        if not request.gpus or not has_budget(policy, group):
            return None
        if not self.usage_current:
            # never checked against numbers that could not be refreshed
            if self.fail_open:
                self.log.warning(
                    "GPU budget of %s not checked (accounting_fail_open): %s",
                    group.name,
                    self.usage_error or "the usage database has not been read yet",
                )
                return None
            return BUDGETS_UNCHECKED
        return budget_refusal(
            policy, self.usage, user, group, float(request.gpus), self.clock(), self.ledger
        )

    def budgets(self, policy: Policy, user: str, group: Group) -> list[BudgetState]:
        """The budgets a GPU server of ``user`` in ``group`` would count against, now
        (none while the usage database cannot be read)."""
        if not self.usage_current or not has_budget(policy, group):
            return []
        return budgets_of(
            policy, self.usage, user, group, self.clock(), running=self.ledger.charges
        )

    def usable_again(self, states: list[BudgetState]) -> float | None:
        """When every used-up budget of ``states`` has room again, as a refusal says
        (None: none is used up, or when is not known)."""
        now = self.clock()
        times = []
        for state in states:
            if not state.exhausted:
                continue
            room = self.usage.room_returns(
                state.group, state.user, state.budget, now, self.ledger.charges
            )
            if room is None:
                return None
            times.append(room[0])
        return max(times, default=None)

    def record_start(
        self, policy: Policy, pod: dict[str, Any], dra: DraInventory | None = None
    ) -> None:
        """A GPU server's pod started: count it from its start, and write it down; a
        server on DRA devices as its claims' allocation in ``dra`` says, where known."""
        try:
            record = usage_record_from_pod(pod)
        except ValueError as e:
            self.log.warning("GPU usage not recorded: %s", e)
            return
        if record is None:
            return
        flavor = policy.flavors.get(record.flavor or "")
        held = allocated_gpus(dra, record.uid, flavor and flavor.dra_equivalents) if dra else None
        if held is not None:
            record.gpus = float(held)
        self._policy = policy
        record.last_seen = max(self.clock(), record.started)
        if self.store is not None:
            self.backlog.add(record.uid, record=record)
            self._write_soon()
        self.count_usage(policy, record)

    def count_usage(self, policy: Policy, record: Any) -> None:
        """Put a usage record in the budgets' book and, with fair share, the standings'."""
        earlier = self.usage.open_by_key.get(record.key)
        self.usage.put(policy, record)
        if policy.fair_share is None:
            return
        fair = self.fair_book(policy)
        if earlier is not None and earlier is not record and earlier.ended is not None:
            fair.ended(earlier)  # the book ended the pod this one replaced, in place
        fair.put(record)

    def burst_band(self, policy: Policy, user: str, group: str) -> str | None:
        """With fair share, the band of a server of ``user`` bursting above ``group``'s
        quota, by their standing now (``fairshare.burst_band``); None without it."""
        if policy.fair_share is None:
            return None
        book = self.fair_book(policy)
        now, running = self.clock(), self.ledger.charges
        return burst_band(
            book.group_standing(group, now, running),
            book.member_standing(user, group, now, running),
        )

    def fair_book(self, policy: Policy) -> FairShareBook:
        """The fair-share standings (``policy`` has ``fair_share``)."""
        if self.fair is None:
            # one policy for the hub's life: a new policy comes with a restart (and a
            # spawner's copy of the config parses an equal policy of its own)
            self.fair = FairShareBook(policy)
        return self.fair

    def record_stop(
        self, key: str, at: float | None = None, *, uid: str | None = None, inferred: bool = False
    ) -> None:
        """A pod of the server ``key`` is gone (now, or ``at``): its GPU time ends.

        ``uid``: that pod's, where the caller knows it; without it, the pod the usage
        book has open for ``key`` (the server's latest start). Only that pod's record
        ends: by the time a deletion is seen through, the key may name a newer pod
        (the user started again after a failed stop), whose record runs on.
        ``inferred``: the pod was found gone and ``at`` is its last sighting (the
        ledger resync): a later sighting of the pod undoes the end. Otherwise, with
        ``uid`` and ``at`` (when the hub asked that pod to go, or when it said it
        ended), the end is final even where the book had inferred one.
        """
        known = at is not None
        at = self.clock() if at is None else at
        record = self.usage.open_by_key.get(key) if uid is None else self.usage.records.get(uid)
        if record is None or record.key != key:
            # not a GPU server's pod, or one the book no longer holds: the service ends
            # its row, if it has one, at its last sighting
            return
        if record.ended is None and self.usage.open_by_key.get(key) is record:
            if inferred:
                at = max(at, record.last_seen)
            self.usage.end(key, at)
            if self.fair is not None:
                self.fair.ended(record)
        elif inferred or uid is None or not known:
            # ended already: a newer pod of the server started, which ended it at its
            # last sighting; when this pod went is not known any better
            at, inferred = record.ended if record.ended is not None else at, True
        # else: that very pod's end, when the hub asked it to go or as the pod said it,
        # replaces the end the book inferred at its last sighting (once written and read)
        if self.store is not None:
            self.backlog.add(record.uid, end=at, inferred=inferred)
            self._write_soon()

    def _write_soon(self) -> None:
        """Write what is kept now, in the background; while the database is failing,
        the retry writes it."""
        if self.usage_failing_since is not None:
            return

        async def work() -> None:
            async with self._database_lock():
                await self._write_kept()

        self.finish_in_background(work())

    # ---- admitting, waiting, releasing -----------------------------------------------

    async def admit(
        self,
        policy: Policy,
        key: str,
        user: str,
        group: Group,
        request: Request,
        *,
        show_wait: Callable[[str | None], None],
        poll_interval: float,
    ) -> Decision:
        """Admit or refuse the server ``key``, waiting in line while the decision is
        "wait". ``show_wait`` is told the line position to show (None when the wait is
        over); ``poll_interval`` bounds each wait for a release that happened elsewhere
        (another hub replica, a pod an admin removed).

        Only a server with nobody ahead of it in the line that waits for capacity it
        needs too (``core.fairshare.place``) is decided; the others wait their turn."""
        now = self.clock()
        chain = tuple(policy.charged_groups(group.name))
        me = Waiter(key, user, group.name, chain, now, next(self._arrivals))
        self.join_line(policy, me, now)
        show_wait(None)
        try:
            while True:
                reason = None
                where = self.place(policy, me, self.clock())
                if not where.ahead:
                    # check and reserve happen in this one synchronous step: atomic
                    over_budget = self.budget_refusal(policy, user, group, request)
                    if over_budget:
                        unchecked = over_budget == BUDGETS_UNCHECKED
                        kind = REFUSED_USAGE_DATABASE if unchecked else REFUSED_BUDGET
                        return Decision("refuse", reason=over_budget, kind=kind)
                    decision = self.ledger.admit(policy, key, user, group, request)
                    if decision.admitted:
                        self.starting.add(key)
                        self.touched[key] = time.monotonic()
                    if decision.outcome != "wait":
                        return decision
                    reason = decision.reason
                    self.line.block(me, decision.level or group.name)
                elif me.blocked_on is None:
                    # it waits for what the first ahead of it waits for
                    self.line.block(me, where.ahead[0].blocked_on)
                now = self.clock()
                where = self.place(policy, me, now)
                show_wait(self._wait_message(policy, group, me, where, reason, now))
                async with self.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), poll_interval)
        finally:
            self.line.leave(me)
            show_wait(None)

    def join_line(self, policy: Policy, me: Waiter, now: float) -> None:
        """``me`` joins the line; with fair share, with its standing worked out for the
        moment every other waiter's was (now, if none waits or theirs are older than
        ``ORDER_KEPT``), and the standings worked out again every ``ORDER_KEPT``."""
        line = self._line_for(policy, now)
        if policy.fair_share is not None:
            at = self._standings_at
            if not len(line) or at is None or not 0 <= now - at < ORDER_KEPT:
                at = self._standings_at = now
            me.standing = self.fair_book(policy).order_key(
                me.user, me.group, at, self.ledger.charges
            )
            me.standing_at = at
            if self._restanding is None or self._restanding.done():
                with contextlib.suppress(RuntimeError):  # no event loop: nothing to keep
                    self._restanding = asyncio.get_running_loop().create_task(
                        self._restand_while_waiting(policy)
                    )
        line.join(me, now)

    def place(self, policy: Policy, me: Waiter, now: float) -> Place:
        """``me``'s place in the line now, among those waiting for the same capacity."""
        return self._line_for(policy, now).place(me, now)

    async def _restand_while_waiting(self, policy: Policy) -> None:
        """Every ``ORDER_KEPT`` while anyone waits: every waiter's standing worked out
        for one moment, ``STANDINGS_PER_TURN`` between two turns of the event loop,
        then the line filed anew at once."""
        book = self.fair_book(policy)
        while True:
            await asyncio.sleep(ORDER_KEPT)
            waiters = list(self.line)
            if not waiters:
                return
            now = self.clock()
            standings = []
            for i, w in enumerate(waiters):
                if i and i % STANDINGS_PER_TURN == 0:
                    await asyncio.sleep(0)
                standings.append(book.order_key(w.user, w.group, now, self.ledger.charges))
            for w, standing in zip(waiters, standings, strict=True):
                self.line.restand(w, standing, now)  # one that left meanwhile: passed over
            self._standings_at = now

    def _line_for(self, policy: Policy, now: float) -> Line:
        """The line, ordered with ``policy``'s ``max_wait`` (filed anew for another)."""
        fair = policy.fair_share
        max_wait = fair.max_wait if fair is not None else None
        if self.line.max_wait != max_wait:
            waiters, self.line = list(self.line), Line(max_wait)
            for w in waiters:
                self.line.join(w, now)
        return self.line

    @staticmethod
    def _wait_message(
        policy: Policy, group: Group, me: Waiter, where: Place, reason: str | None, now: float
    ) -> str:
        """What the spawn page says of a waiting server's place, and why."""
        return wait_message(policy, group, me, where, reason, now)

    @property
    def waiting(self) -> dict[str, deque[str]]:
        """Group -> the keys of its servers waiting, in the order they go."""
        lines: defaultdict[str, deque[str]] = defaultdict(deque)
        policy, now = self._policy, self.clock()
        line = self._line_for(policy, now) if policy is not None else self.line
        for w in line.ordered(now):
            lines[w.group].append(w.key)
        return lines

    def start_ended(self, key: str) -> None:
        """The start of ``key`` finished (its pod exists) or failed."""
        self.starting.discard(key)
        self.touched[key] = time.monotonic()

    async def release(self, policy: Policy, key: str, only: Charge | None = None) -> None:
        """Free the charge of ``key`` (its pod is gone); with ``only``, just that charge."""
        charge = self.charge(key)
        if charge is not None and (only is None or charge is only):
            self.ledger.release(policy, key)
            # a resync listing taken before may still show the pod (terminating then):
            # it must not count it again
            self.touched[key] = time.monotonic()
            await self._notify()

    def charge(self, key: str) -> Charge | None:
        return self.ledger.charges.get(key) if self.loaded else None

    def finish_in_background(self, work: Awaitable[None]) -> None:
        """Keep a deletion that outlives its stop running (and referenced) to its end."""
        task = asyncio.ensure_future(work)
        self.finishing.add(task)
        task.add_done_callback(self.finishing.discard)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()


class AccountingCollector:
    """The hub's side of GPU usage accounting as Prometheus metrics, for the hub's own
    ``/hub/metrics``: register it once with the shared admission,
    ``prometheus_client.REGISTRY.register(AccountingCollector(admission))``."""

    PREFIX = "jupyterhub_gpu_hub_accounting"

    def __init__(self, admission: SpawnAdmission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        lag, now = self.admission.accounting(), self.admission.clock()
        gauges = [
            (
                "up",
                "1 when the usage database was last written and read, 0 while it fails",
                1.0 if lag.ok else 0.0,
            ),
            (
                "unwritten_servers",
                "servers whose starts or ends are kept, not written yet",
                lag.unwritten,
            ),
            (
                "oldest_unwritten_age_seconds",
                "age of the oldest start or end not written yet (0: none)",
                0.0 if lag.oldest_unwritten is None else max(now - lag.oldest_unwritten, 0.0),
            ),
            (
                "last_write_timestamp_seconds",
                "when the usage database was last written",
                lag.last_write,
            ),
            ("last_read_timestamp_seconds", "when the usage database was last read", lag.last_read),
        ]
        for name, help_text, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(f"{self.PREFIX}_{name}", help_text, value=float(value))
        yield CounterMetricFamily(
            f"{self.PREFIX}_dropped_events",
            "starts and ends dropped because what was kept was full",
            value=lag.dropped,
        )


def register_hub_metrics(admission: SpawnAdmission) -> None:
    """Show the hub's side of GPU-hour accounting on the hub's own ``/hub/metrics``."""
    import prometheus_client

    with contextlib.suppress(ValueError):  # already registered by an earlier hub in-process
        prometheus_client.REGISTRY.register(AccountingCollector(admission))


def wait_message(
    policy: Policy, group: Group, me: Waiter, where: Place, reason: str | None, now: float
) -> str:
    """What the spawn page says of a server waiting in its group's line: its place, why
    (fair share's order, what the group holds), and that it starts by itself."""
    text = f"Waiting for {group.display_name}: position {where.position} of {where.of}"
    fair = policy.fair_share
    why = []
    if fair is not None and where.of > 1:
        why.append(why_placed(me, where, now, fair.max_wait))
    elif where.position > 1:
        text += f", {words.count(where.position - 1, 'spawn')} ahead of you"
    if reason:
        why.append(reason)
    if why:
        text += ": " + "; ".join(why)
    return f"{text}. {STARTS_BY_ITSELF}"
