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

from .core.admission import Charge, Decision, Ledger
from .core.model import Group, Policy
from .core.selection import Request

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
        while True:
            await asyncio.sleep(interval)
            try:
                listed_at = time.monotonic()
                charges = await list_charges(policy)
            except Exception as e:  # the API server restarting: try again next time
                self.log.warning("GPU ledger resync skipped: %r", e)
                continue
            # spawns under way, and servers admitted or started since the listing
            keep = self.starting | {k for k, at in self.touched.items() if at >= listed_at}
            added, released = self.ledger.resync(policy, charges, keep)
            for key, what in [(k, "counted") for k in added] + [(k, "released") for k in released]:
                self.log.warning("GPU ledger resync: %s %s (the hub had missed it)", what, key)
            if released:
                await self._notify()
            horizon = time.monotonic() - 10 * max(interval, 1)
            for key in [k for k, at in self.touched.items() if at < horizon]:
                del self.touched[key]

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
                    # check and reserve happen in this one synchronous call: atomic
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
