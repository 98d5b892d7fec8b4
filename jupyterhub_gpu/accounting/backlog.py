"""What could not be written to the usage database yet, kept in memory until it can.

The hub and the service each keep one ``Backlog``: per pod (by uid) its start if
it may have no row yet, its latest sighting and its end, each with its true time.
Every write goes through it: in normal operation it is written at once and the
backlog is empty again; while the database cannot be written it grows, and at
the next chance it is written oldest first (``write``), in the order the store
needs (start, sighting, end: one transaction per chunk). Nothing is written
twice: a start is an insert-if-absent, a sighting only moves a row's
``last_seen`` forward, and an end names its pod's uid.

It is bounded (``limit`` pods). When it is full, the log says so and the oldest
pod with no end loses its start and sighting: a running pod is seen again, and
its start is recorded again from the pod, once the database is back. Ends are
kept, as they are what billing needs most; only a backlog of nothing but ends
drops its oldest end (logged as an error).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..core.budgets import UsageRecord

if TYPE_CHECKING:
    from .store import UsageStore

#: pods kept at most; a pod's events are about 300 bytes in memory
DEFAULT_LIMIT = 50_000
#: pods written per transaction
CHUNK = 5_000


@dataclass
class Pending:
    """One pod's events not written yet."""

    uid: str
    #: when its oldest unwritten event happened (epoch seconds)
    since: float
    #: its start: written as a new row unless the pod has one
    record: UsageRecord | None = None
    #: its latest sighting
    seen: float | None = None
    #: its end, and whether inferred (found gone, at its last sighting) or witnessed
    end: float | None = None
    inferred: bool = False

    def merge(self, newer: Pending) -> None:
        """Add the events of ``newer`` (same pod, later) as the store would apply them."""
        if self.record is None:
            self.record = newer.record
        if newer.seen is not None:
            if self.end is not None and self.inferred and newer.seen > self.end:
                # seen after the end inferred for it: it runs on
                self.end, self.inferred = None, False
            self.seen = newer.seen if self.seen is None else max(self.seen, newer.seen)
        if newer.end is not None and (self.end is None or (self.inferred and not newer.inferred)):
            # a witnessed end is final; an inferred one only ends an open row
            self.end, self.inferred = newer.end, newer.inferred
        self.since = min(self.since, newer.since)

    def applied(self, record: UsageRecord) -> UsageRecord:
        """``record`` (as read from the database) with these events applied: what its
        row will say once they are written."""
        record = replace(record)
        if self.seen is not None and record.ended is None:
            record.last_seen = max(record.last_seen, self.seen)
        if self.end is not None:
            if not self.inferred:
                record.ended = max(self.end, record.started)
            elif record.ended is None:
                record.ended = max(self.end, record.last_seen, record.started)
        return record


@dataclass(frozen=True)
class AccountingLag:
    """How far the usage database is behind what one writer has seen (for the
    dashboard and metrics)."""

    #: the last write and read succeeded: the numbers are current
    ok: bool = True
    #: why not, in the database's words (names its host: admins only)
    error: str | None = None
    #: since when the database has failed (epoch seconds)
    failing_since: float | None = None
    #: pods with events not written yet, and when the oldest of them happened
    unwritten: int = 0
    oldest_unwritten: float | None = None
    #: when a write and a read last succeeded
    last_write: float | None = None
    last_read: float | None = None
    #: events dropped because the backlog was full (since start)
    dropped: int = 0

    @property
    def behind(self) -> bool:
        return not self.ok or self.unwritten > 0

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "behind": self.behind,
            "unwritten": self.unwritten,
            "oldest_unwritten": self.oldest_unwritten,
            "oldest_unwritten_age_seconds": (
                None if self.oldest_unwritten is None else max(now - self.oldest_unwritten, 0.0)
            ),
            "failing_since": self.failing_since,
            "last_write": self.last_write,
            "last_read": self.last_read,
            "dropped": self.dropped,
        }


class Backlog:
    """One writer's usage events not written yet, bounded, oldest first."""

    def __init__(
        self,
        limit: int = DEFAULT_LIMIT,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limit = max(limit, 1)
        self.log = log or logging.getLogger("jupyterhub_gpu")
        self.clock = clock
        #: pods with an end, and pods without (the ones dropped first when full)
        self._ended: OrderedDict[str, Pending] = OrderedDict()
        self._open: OrderedDict[str, Pending] = OrderedDict()
        #: events dropped since start because the backlog was full
        self.dropped = 0
        self._full = False
        #: when a write last succeeded
        self.last_write: float | None = None
        self._writing: asyncio.Lock | None = None

    def __len__(self) -> int:
        return len(self._ended) + len(self._open)

    def get(self, uid: str) -> Pending | None:
        return self._ended.get(uid) or self._open.get(uid)

    def entries(self) -> list[Pending]:
        return [*self._ended.values(), *self._open.values()]

    def unended(self) -> list[Pending]:
        """Pods with no end kept (running, as far as this writer knows)."""
        return list(self._open.values())

    def oldest(self) -> float | None:
        """When the oldest unwritten event happened."""
        return min((p.since for p in self.entries()), default=None)

    # ---- adding --------------------------------------------------------------------

    def add(
        self,
        uid: str,
        at: float | None = None,
        *,
        record: UsageRecord | None = None,
        seen: float | None = None,
        end: float | None = None,
        inferred: bool = False,
    ) -> None:
        """Keep an event of pod ``uid`` that happened at ``at`` (now): its start
        (``record``, copied), a sighting at ``seen``, its end at ``end``."""
        at = self.clock() if at is None else at
        event = Pending(
            uid,
            at,
            record=replace(record) if record is not None else None,
            seen=seen,
            end=end,
            inferred=inferred,
        )
        self._put(event, front=False)
        self._bound()

    def _put(self, event: Pending, *, front: bool) -> None:
        """Keep ``event``, merged with what is kept of its pod. ``front``: it is older
        than what is kept (put back by a failed write) and goes first."""
        uid = event.uid
        was = self._ended if uid in self._ended else self._open if uid in self._open else None
        if was is not None:
            kept = was[uid]
            if front:
                event.merge(kept)
            else:
                kept.merge(event)
                event = kept
        place = self._ended if event.end is not None else self._open
        if was is not None and was is not place:
            del was[uid]
        place[uid] = event  # a pod kept already keeps its place
        if front:
            place.move_to_end(uid, last=False)

    def _bound(self) -> None:
        while len(self) > self.limit:
            if self._open:
                uid, dropped = self._open.popitem(last=False)
                what = "start and sighting" if dropped.record is not None else "sighting"
                if not self._full:
                    self.log.warning(
                        "GPU usage backlog full (%d servers' events not written while the "
                        "usage database is unavailable): the oldest servers' starts and "
                        "sightings are dropped, their ends kept (first: the %s of pod %s)",
                        self.limit,
                        what,
                        uid,
                    )
            else:
                uid, dropped = self._ended.popitem(last=False)
                self.log.error(
                    "GPU usage backlog full of ends (%d): the end of pod %s at %.0f is "
                    "dropped, its row ends at its last sighting written",
                    self.limit,
                    uid,
                    dropped.end,
                )
            self._full = True
            self.dropped += 1

    # ---- writing -------------------------------------------------------------------

    def take(self, count: int) -> list[Pending]:
        """Remove and return up to ``count`` pods' events, oldest first."""
        oldest = sorted(self.entries(), key=lambda p: p.since)[:count]
        for pending in oldest:
            (self._ended if pending.end is not None else self._open).pop(pending.uid, None)
        return oldest

    def put_back(self, entries: Iterable[Pending]) -> None:
        """Return events a write could not write: older than any kept meanwhile."""
        for pending in reversed(list(entries)):
            self._put(pending, front=True)
        self._bound()

    async def write(self, store: UsageStore, chunk: int = CHUNK) -> int:
        """Write everything kept, oldest first, a chunk per transaction; returns how
        many rows were new. Raises ``AccountingUnavailable`` with what was not
        written kept. One write at a time: a pod's end never overtakes its start."""
        if self._writing is None:
            self._writing = asyncio.Lock()
        new = 0
        async with self._writing:
            while len(self):
                batch = self.take(chunk)
                try:
                    new += await asyncio.to_thread(store.write, batch)
                except BaseException:
                    self.put_back(batch)
                    raise
                self.last_write = self.clock()
            if self._full:
                self._full = False
                self.log.warning(
                    "GPU usage backlog written; %d events had been dropped while it was full",
                    self.dropped,
                )
        return new
