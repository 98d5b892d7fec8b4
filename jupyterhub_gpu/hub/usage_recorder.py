"""The hub's GPU time: each GPU server's start and end written to the usage database,
and the book of usage every budget is checked against.

Writes go through a ``Backlog``, so a write the database refuses is kept (bounded) and
written, with its true time, at the next chance: a retry soon after, every ledger
resync, every later write. After any failed read or write, GPU spawns of groups with a
budget follow ``accounting_fail_open`` (refused by default) until everything kept is
written and the rows are read again: never admitted on numbers that could not be
refreshed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..accounting.backlog import DEFAULT_LIMIT, AccountingLag, Backlog
from ..accounting.store import AccountingUnavailable, UsageStore, collector_paused
from ..core.admission import Charge, Ledger
from ..core.billed_book import BilledBook, billed_book_for
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
from ..core.fairshare import FairShareBook, burst_band, read_window
from ..core.model import Group, Policy
from ..core.selection import Request
from ..core.shaping import usage_record_from_pod

#: what a GPU spawn of a group with a budget is told while budgets cannot be checked
BUDGETS_UNCHECKED = (
    "GPU-hour budgets cannot be checked now, as the usage database is unavailable, so "
    "GPU servers of groups with a budget cannot start: try again in a few minutes, or "
    "start one without GPUs"
)


class UsageRecorder:
    """This hub's starts and ends written to the usage database, and the usage book
    (with fair share, the standings' book) read back from it."""

    def __init__(
        self,
        log: logging.Logger,
        clock: Callable[[], float],
        in_background: Callable[[Awaitable[None]], None],
        *,
        loaded: bool = False,
    ) -> None:
        self.log = log
        self.clock = clock
        self.in_background = in_background
        #: the usage records budgets are checked against, read from the usage database
        #: (``store``) and kept current by this hub's own starts and stops
        self.usage = UsageBook()
        #: with budgets in billed units on weighted flavors: the same records in billed
        #: units (``billed_book``), fed as ``usage`` is
        self.billed: BilledBook | None = None
        self._billed_policy: Policy | None = None
        #: with fair share: each group's and member's decayed GPU time, fed the same
        #: records as ``usage``
        self.fair: FairShareBook | None = None
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
        #: starts and ends not written yet (while the database cannot be written)
        self.backlog = Backlog(DEFAULT_LIMIT, self.log, lambda: self.clock())
        #: the longest wait between two retries after a failure (seconds)
        self.retry_max = 30.0
        self.policy: Policy | None = None
        self._database: asyncio.Lock | None = None
        self._retrying: asyncio.Task | None = None

    def use_store(self, store: UsageStore, fail_open: bool) -> None:
        """Record GPU time in ``store`` and check budgets against what it holds."""
        self.store = store
        self.fail_open = fail_open
        self.usage_loaded = False

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

    # ---- reading ----------------------------------------------------------------------

    async def read_usage(self, policy: Policy) -> None:
        """Write what is kept, then bring the usage book up to date with the database
        (only rows changed since the last read, after the first). A failure is kept,
        shown and retried; budgets are checked again once a read succeeds."""
        self.policy = policy
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
                if self.billed is not None:
                    self.billed.prune(policy, now)
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

        def build() -> tuple[UsageBook, FairShareBook | None, BilledBook | None]:
            with collector_paused():
                return build_book()

        def build_book() -> tuple[UsageBook, FairShareBook | None, BilledBook | None]:
            book = UsageBook.for_policy(policy)
            fair = FairShareBook(policy) if policy.fair_share is not None else None
            billed = billed_book_for(policy, book.horizon)
            for record in records:
                earlier = book.open_by_key.get(record.key)
                book.put(policy, record)
                if billed is not None:
                    billed.put(policy, record)
                if fair is not None:
                    if earlier is not None and earlier is not record and earlier.ended is not None:
                        fair.ended(earlier)  # the book ended the pod this one replaced
                    fair.put(record)
            book.prune(policy, now)
            if billed is not None:
                billed.prune(policy, now)
            return book, fair, billed

        book, fair, billed = await asyncio.to_thread(build)
        mine = [r for r in self.usage.records.values() if r.uid not in book.records]
        self.usage, self.fair, self.billed = book, fair, billed
        self._billed_policy = policy
        for record in mine:
            # this hub's own starts and stops since it started (the database's row of
            # one, where there is one, is the later word, as it always was)
            self.count_usage(policy, record)
        for record in records if len(self.backlog) else ():
            pending = self.backlog.get(record.uid)
            if pending is not None:
                self.count_usage(policy, pending.applied(record))

    # ---- writing ----------------------------------------------------------------------

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
                if self.policy is not None:
                    await self.read_usage(self.policy)
                else:
                    async with self._database_lock():
                        if await self._write_kept():
                            self.usage_failing_since = None
            except Exception:
                self.log.exception("GPU usage: retrying the usage database failed")

    def _write_soon(self) -> None:
        """Write what is kept now, in the background; while the database is failing,
        the retry writes it."""
        if self.usage_failing_since is not None:
            return

        async def work() -> None:
            async with self._database_lock():
                await self._write_kept()

        self.in_background(work())

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

    # ---- a server's start and end -------------------------------------------------------

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
        self.policy = policy
        record.last_seen = max(self.clock(), record.started)
        if self.store is not None:
            self.backlog.add(record.uid, record=record)
            self._write_soon()
        self.count_usage(policy, record)

    def billed_book(self, policy: Policy) -> BilledBook | None:
        """The book of billed units budgets in units read (None: not needed, see
        ``billed_book_for``), made for the policy the first time it is asked for."""
        if policy is not self._billed_policy:
            self._billed_policy = policy
            made = billed_book_for(policy, self.usage.horizon)
            for record in self.usage.records.values() if made is not None else ():
                made.put(policy, record)
            self.billed = made
        return self.billed

    def count_usage(self, policy: Policy, record: Any) -> None:
        """Put a usage record in the budgets' book and, with fair share, the standings'."""
        earlier = self.usage.open_by_key.get(record.key)
        self.usage.put(policy, record)
        billed = self.billed_book(policy)
        if billed is not None:
            billed.put(policy, record)
        if policy.fair_share is None:
            return
        fair = self.fair_book(policy)
        if earlier is not None and earlier is not record and earlier.ended is not None:
            fair.ended(earlier)  # the book ended the pod this one replaced, in place
        fair.put(record)

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
            if self.billed is not None and self.policy is not None:
                self.billed.end(self.policy, key, at)
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

    # ---- what budgets and fair share say --------------------------------------------------

    def budget_refusal(
        self, policy: Policy, user: str, group: Group, request: Request, ledger: Ledger
    ) -> str | None:
        """Why a GPU budget forbids this server now, or None (synchronous: it is part of
        the atomic admission against ``ledger``)."""
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
            policy,
            self.usage,
            user,
            group,
            float(request.gpus),
            self.clock(),
            ledger,
            self.billed_book(policy),
            request.devices,
        )

    def budgets(
        self, policy: Policy, user: str, group: Group, running: Mapping[str, Charge]
    ) -> list[BudgetState]:
        """The budgets a GPU server of ``user`` in ``group`` would count against, now
        (none while the usage database cannot be read)."""
        if not self.usage_current or not has_budget(policy, group):
            return []
        return budgets_of(
            policy, self.usage, user, group, self.clock(), running, self.billed_book(policy)
        )

    def usable_again(
        self, states: list[BudgetState], running: Mapping[str, Charge]
    ) -> float | None:
        """When every used-up budget of ``states`` has room again, as a refusal says
        (None: none is used up, or when is not known)."""
        now = self.clock()
        times = []
        for state in states:
            if not state.exhausted:
                continue
            book = state.book if state.book is not None else self.usage
            room = book.room_returns(state.group, state.user, state.budget, now, running)
            if room is None:
                return None
            times.append(room[0])
        return max(times, default=None)

    def burst_band(
        self, policy: Policy, user: str, group: str, running: Mapping[str, Charge]
    ) -> str | None:
        """With fair share, the band of a server of ``user`` bursting above ``group``'s
        quota, by their standing now (``fairshare.burst_band``); None without it."""
        if policy.fair_share is None:
            return None
        book = self.fair_book(policy)
        now = self.clock()
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
