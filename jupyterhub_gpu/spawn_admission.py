"""The hub's admission of spawns: one ledger, kept true, and the lines spawns wait in.

Every ``GPUKubeSpawner`` of a hub shares one ``SpawnAdmission``: the ``Ledger``
(``core.admission``, pure arithmetic), its first rebuild from pod labels, its
periodic resync against the pods, the per-group first-come-first-served lines of
``when_full: wait``, and the deletions still finishing after failed stops. The
spawner supplies what only it can do (list the charged pods, with its Kubernetes
client and namespaces); everything else about admission lives here, in one
object a test can replace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from .accounting.store import AccountingUnavailable, UsageStore
from .core.admission import Charge, Decision, Ledger
from .core.budgets import BudgetState, UsageBook, budget_refusal, budgets_of, has_budget
from .core.model import Group, Policy
from .core.selection import Request
from .core.shaping import usage_record_from_pod

#: lists the charges on the pods Kubernetes has now (the spawner's own client)
ListCharges = Callable[[Policy], Awaitable[list[Charge]]]


class SpawnAdmission:
    """The ledger every spawn is admitted against, and the lines they wait in."""

    def __init__(self, log: logging.Logger | None = None, *, loaded: bool = False) -> None:
        self.log = log or logging.getLogger("jupyterhub_gpu")
        self.ledger = Ledger()
        #: the ledger has been rebuilt from pods (or there is nothing to read: offline)
        self.loaded = loaded
        self._loading: asyncio.Future | None = None
        self._resync: asyncio.Task | None = None
        #: group -> server keys waiting, first come first served
        self.waiting: dict[str, deque[str]] = {}
        self._changed: asyncio.Condition | None = None
        #: servers admitted whose start has not finished, and when each server was last
        #: admitted or started (monotonic): the resync keeps these, as their pods may
        #: not exist yet or be too new for its listing
        self.starting: set[str] = set()
        self.touched: dict[str, float] = {}
        #: deletions of pods whose stop failed, retried until the pod is gone
        self.finishing: set[asyncio.Future] = set()
        #: GPU time: the usage records budgets are checked against, read from the
        #: usage database (``store``) and kept current by this hub's own starts and stops
        self.usage = UsageBook()
        self.store: UsageStore | None = None
        self.fail_open = False
        self.usage_loaded = loaded
        self.usage_error: str | None = None
        #: the usage database's revision read up to (None: not read yet)
        self._usage_revision: int | None = None
        self.clock: Callable[[], float] = time.time

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

    async def read_usage(self, policy: Policy) -> None:
        """Bring the usage book up to date with the database (only rows changed since
        the last read, after the first). A failure is kept, shown and retried."""
        if self.store is None:
            self.usage_loaded = True  # nothing recorded: offline rendering
            return
        now = self.clock()
        first = self._usage_revision is None
        if first:
            self.usage = UsageBook.for_policy(policy)
        try:
            if first:
                since = now - self.usage.horizon
                records, revision = await asyncio.to_thread(self.store.snapshot, since, now)
            else:
                # every row written since, in the order written (whatever its times)
                records, revision = await asyncio.to_thread(
                    self.store.changed_since, self._usage_revision
                )
        except AccountingUnavailable as e:
            if self.usage_error is None:
                self.log.error("GPU-hour budgets cannot be checked: %s", e)
            self.usage_error = str(e)
            self.usage_loaded = self.usage_loaded and not first
            return
        for record in records:
            self.usage.put(policy, record)
        self.usage.prune(policy, now)
        self._usage_revision = revision
        if self.usage_error is not None:
            self.log.info("GPU usage database readable again")
        self.usage_error = None
        self.usage_loaded = True

    def budget_refusal(
        self, policy: Policy, user: str, group: Group, request: Request
    ) -> str | None:
        """Why a GPU budget forbids this server now, or None (synchronous: it is part of
        the atomic admission)."""
        if not request.gpus or not has_budget(policy, group):
            return None
        if not self.usage_loaded:
            if self.fail_open:
                self.log.warning(
                    "GPU budget of %s not checked (accounting_fail_open): %s",
                    group.name,
                    self.usage_error,
                )
                return None
            return (
                "GPU-hour budgets cannot be checked now (the usage database is unavailable); "
                "GPU servers of groups with a budget start again once it is back"
            )
        return budget_refusal(
            policy, self.usage, user, group, float(request.gpus), self.clock(), self.ledger
        )

    def budgets(self, policy: Policy, user: str, group: Group) -> list[BudgetState]:
        """The budgets a GPU server of ``user`` in ``group`` would count against, now
        (none while the usage database has not been read)."""
        if not self.usage_loaded or not has_budget(policy, group):
            return []
        return budgets_of(
            policy, self.usage, user, group, self.clock(), running=self.ledger.charges
        )

    def record_start(self, policy: Policy, pod: dict[str, Any]) -> None:
        """A GPU server's pod started: count it from its start, and write it down."""
        try:
            record = usage_record_from_pod(pod)
        except ValueError as e:
            self.log.warning("GPU usage not recorded: %s", e)
            return
        if record is None:
            return
        record.last_seen = max(self.clock(), record.started)
        self.usage.put(policy, record)
        if self.store is not None:
            self._write_in_background(self.store.open, [record], what=f"start of {record.key}")

    def record_stop(
        self, key: str, at: float | None = None, *, uid: str | None = None, inferred: bool = False
    ) -> None:
        """A pod of the server ``key`` is gone (now, or ``at``): its GPU time ends.

        ``uid``: that pod's, where the caller knows it; without it, the pod the usage
        book has open for ``key`` (the server's latest start). Only that pod's record
        ends: by the time a deletion is seen through, the key may name a newer pod
        (the user started again after a failed stop), whose record runs on.
        ``inferred``: the pod was found gone and ``at`` is its last sighting (the
        ledger resync): a later sighting of the pod undoes the end.
        """
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
        else:
            # ended already: a newer pod of the server started, which ended it at its
            # last sighting; when this pod went is not known any better
            at, inferred = record.ended if record.ended is not None else at, True
        if self.store is not None:
            self._write_in_background(
                self.store.end, record.uid, at, inferred=inferred, what=f"stop of {key}"
            )

    def _write_in_background(
        self, write: Callable[..., Any], *args: Any, what: str, **kwargs: Any
    ) -> None:
        async def work() -> None:
            try:
                await asyncio.to_thread(write, *args, **kwargs)
            except AccountingUnavailable as e:
                # the service records the pod from Kubernetes when it next looks
                self.log.warning("GPU usage: the %s was not written: %s", what, e)

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
        """Admit or refuse the server ``key``, waiting in its group's line while the
        decision is "wait". ``show_wait`` is told the line position to show (None
        when the wait is over); ``poll_interval`` bounds each wait for a release that
        happened elsewhere (another hub replica, a pod an admin removed)."""
        line = self.waiting.setdefault(group.name, deque())
        show_wait(None)
        try:
            while True:
                reason = None
                if not line or line[0] == key:
                    # check and reserve happen in this one synchronous step: atomic
                    over_budget = self.budget_refusal(policy, user, group, request)
                    if over_budget:
                        return Decision("refuse", reason=over_budget)
                    decision = self.ledger.admit(policy, key, user, group, request)
                    if decision.admitted:
                        self.starting.add(key)
                        self.touched[key] = time.monotonic()
                    if decision.outcome != "wait":
                        return decision
                    reason = decision.reason
                if key not in line:
                    line.append(key)
                position = list(line).index(key) + 1
                reason = reason or f"{position - 1} spawns ahead of you"
                show_wait(
                    f"Waiting for {group.display_name}: position {position} of "
                    f"{len(line)} ({reason})"
                )
                async with self.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), poll_interval)
        finally:
            # the line itself stays: a spawn still holding it must keep its place
            if key in line:
                line.remove(key)
            show_wait(None)

    def start_ended(self, key: str) -> None:
        """The start of ``key`` finished (its pod exists) or failed."""
        self.starting.discard(key)
        self.touched[key] = time.monotonic()

    async def release(self, policy: Policy, key: str, only: Charge | None = None) -> None:
        """Free the charge of ``key`` (its pod is gone); with ``only``, just that charge."""
        charge = self.charge(key)
        if charge is not None and (only is None or charge is only):
            self.ledger.release(policy, key)
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
