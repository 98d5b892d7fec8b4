"""The hub's one ledger of charges, kept true: rebuilt from the pods' labels the first
time a spawn needs it, then resynced against the pods every ``resync_interval``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ..core.admission import Charge, Ledger
from ..core.model import Policy
from .usage_recorder import UsageRecorder

#: lists the charges on the pods Kubernetes has now (the spawner's own client)
ListCharges = Callable[[Policy], Awaitable[list[Charge]]]


class LedgerKeeper:
    """The ledger every spawn is admitted against, rebuilt and resynced from pods; the
    GPU time of a server found gone ends in ``usage`` at its last sighting."""

    def __init__(
        self,
        log: logging.Logger,
        clock: Callable[[], float],
        usage: UsageRecorder,
        *,
        loaded: bool = False,
    ) -> None:
        self.log = log
        self.clock = clock
        self.usage = usage
        self.ledger = Ledger()
        #: the ledger has been rebuilt from pods (or there is nothing to read: offline)
        self.loaded = loaded
        self._loading: asyncio.Future | None = None
        self._resync: asyncio.Task | None = None
        self._changed: asyncio.Condition | None = None
        #: servers admitted whose start has not finished, and when each server was last
        #: admitted, started or released (monotonic): the resync leaves these as they
        #: are, as their pods may not exist yet, or be too new or too old for its listing
        self.starting: set[str] = set()
        self.touched: dict[str, float] = {}

    @property
    def changed(self) -> asyncio.Condition:
        """Notified whenever a charge is released (created in the running loop)."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def ready(
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
        await self.usage.read_usage(policy)
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
                self.usage.record_stop(key, at=previous_listing, inferred=True)
            previous_listing = listed_wall
            for key, what in [(k, "counted") for k in added] + [(k, "released") for k in released]:
                self.log.warning("GPU ledger resync: %s %s (the hub had missed it)", what, key)
            if released:
                await self.notify()
            await self.usage.read_usage(policy)
            horizon = time.monotonic() - 10 * max(interval, 1)
            for key in [k for k, at in self.touched.items() if at < horizon]:
                del self.touched[key]

    def admitted(self, key: str) -> None:
        """``key`` was admitted: its start is under way."""
        self.starting.add(key)
        self.touched[key] = time.monotonic()

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
            await self.notify()

    def charge(self, key: str) -> Charge | None:
        return self.ledger.charges.get(key) if self.loaded else None
