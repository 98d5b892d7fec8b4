"""GPU time: usage records, the GPU-hours they add up to, and budgets.

A ``UsageRecord`` is one server pod's hold on GPUs: its GPU-equivalents, from
the pod's start to its end. A record still open counts up to now while its
server runs, and up to the last time it was seen otherwise (an end nobody
witnessed: the error is at most the time between two sightings).

The ``UsageBook`` keeps the records that can still count towards a budget,
indexed by every group they are charged to (a server counts for its group and
each parent) and by (user, group), so a spawn's budget check reads only its own
owners' records. ``budget_refusal`` is the check; it runs in the same
synchronous step as the quota check and reservation. What an owner used in its
window, and when it refuses, when room returns: one sweep over the owner's
records, kept by the book between calls (only the records that change are looked
at again, and the open ones, whose use moves with the clock). Pure: no I/O; times
are epoch seconds.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Container, Iterable
from dataclasses import dataclass, field
from itertools import accumulate, chain
from operator import le, mul, neg, sub

from . import words
from .admission import Ledger
from .model import Budget, Group, Policy

HOUR = 3600.0


@dataclass(slots=True)  # the service keeps two months of them: a few hundred thousand
class UsageRecord:
    uid: str  # the pod's uid: one record per pod
    key: str  # "<namespace>/<pod name>", the server's key in the admission ledger
    user: str
    group: str
    profile: str
    flavor: str | None
    gpus: float  # GPU-equivalents held
    started: float
    last_seen: float
    ended: float | None = None

    def end(self, now: float, running: Container[str] = ()) -> float:
        """When its use ends, as far as is known at ``now``."""
        if self.ended is not None:
            return self.ended
        return now if self.key in running else max(self.last_seen, self.started)


def used_seconds(
    r: UsageRecord, since: float, until: float, now: float, running: Container[str] = ()
) -> float:
    """GPU-equivalent-seconds ``r`` used between ``since`` and ``until`` (as known at
    ``now``). ``UsageRecord.end`` inlined: a month's showback calls this for every
    record (~150,000 at a large site), where the call costs a quarter of the time."""
    end = r.ended
    if end is None:
        end = now if r.key in running else max(r.last_seen, r.started)
    if end > until:
        end = until
    start = r.started if r.started > since else since
    return r.gpus * (end - start) if end > start else 0.0


def gpu_hours(
    records: Iterable[UsageRecord], since: float, now: float, running: Container[str] = ()
) -> float:
    """GPU-equivalent-hours the records used from ``since`` to ``now``."""
    return gpu_seconds(records, since, now, running) / HOUR


def gpu_seconds(
    records: Iterable[UsageRecord], since: float, now: float, running: Container[str] = ()
) -> float:
    """``gpu_hours`` in GPU-equivalent-seconds."""
    # ``used_seconds`` with until = now and ``UsageRecord.end`` inlined: a call per
    # record would be a third of it
    total = 0.0
    for r in records:
        end = r.ended
        if end is None:
            end = now if r.key in running else max(r.last_seen, r.started)
        elif end > now:
            end = now
        start = r.started if r.started > since else since
        if end > start:
            total += r.gpus * (end - start)
    return total


class _UsageAfter:
    """What a fixed set of spans counts in a window opening at any moment ``x``: the
    GPU-equivalent-seconds ``sum(gpus * (end - max(start, x)))`` over the spans with
    ``end > x``, in O(log n) per moment after one sort.

    A span adds its GPUs to the rate of use from its start to its end, so what it
    counts after ``x`` is the integral of the rate from ``x`` on: kept at every start
    and end, summed from the latest back. A span that ends before it starts (a pod's
    start time ahead of the hub's clock) counts ``gpus * (end - start)`` until it
    ends, a step of its own.
    """

    __slots__ = ("ends", "nonnegative", "rates", "step_after", "step_ends", "tail", "times")

    def __init__(self, starts: list[float], ends: list[float], gpus: list[float]) -> None:
        steps: list[tuple[float, float]] = []
        if not all(map(le, starts, ends)):
            proper = [i for i, (s, e) in enumerate(zip(starts, ends, strict=True)) if s <= e]
            steps = sorted(
                (ends[i], gpus[i] * (ends[i] - starts[i]))
                for i in range(len(ends))
                if ends[i] < starts[i]
            )
            starts, gpus = [starts[i] for i in proper], [gpus[i] for i in proper]
            ends, spans_ends = [ends[i] for i in proper], ends
        else:
            spans_ends = ends
        # (built as lists, kept as arrays: a third of the memory, for a year of records)
        #: the spans' ends in order: the moments room can return (each + the period)
        self.ends = array("d", sorted(spans_ends))
        #: no span holds fewer than no GPUs: between the steps' ends, less is counted the
        #: later the window opens, and the first moment with room can be bisected for
        self.nonnegative = not gpus or min(gpus) >= 0
        # each span's start raises the rate by its GPUs, its end lowers it again
        times = starts + ends
        changes = [*gpus, *map(neg, gpus)]
        order = sorted(range(len(times)), key=times.__getitem__)
        times = list(map(times.__getitem__, order))
        rates = list(accumulate(map(changes.__getitem__, order)))
        # the use from each time to the next, then summed from the latest back:
        # tail[i] is everything counted after times[i]
        tail = list(accumulate(reversed(list(map(mul, rates, map(sub, times[1:], times))))))
        tail.reverse()
        tail.append(0.0)
        #: every start and end, in order; the rate of use from each to the next
        self.times = array("d", times)
        self.rates = array("d", rates)
        self.tail = array("d", tail)
        self.step_ends = [end for end, _ in steps]
        after = list(accumulate(reversed([amount for _, amount in steps])))
        after.reverse()
        after.append(0.0)
        #: step_after[j]: the steps of the spans ending after step_ends[j - 1]
        self.step_after = after

    @classmethod
    def of(cls, spans: Iterable[tuple[float, float, float]]) -> _UsageAfter:
        starts: list[float] = []
        ends: list[float] = []
        gpus: list[float] = []
        for start, end, g in spans:
            starts.append(start)
            ends.append(end)
            gpus.append(g)
        return cls(starts, ends, gpus)

    def at(self, x: float) -> float:
        """GPU-equivalent-seconds counted in a window opening at ``x``."""
        used = self._rate_after(x)
        if self.step_ends:
            used += self.step_after[bisect_right(self.step_ends, x)]
        return used

    def _rate_after(self, x: float) -> float:
        """The spans' use from ``x`` on (the integral of the rate after ``x``)."""
        times = self.times
        i = bisect_right(times, x)
        if i == len(times):
            return 0.0
        if i == 0:
            return self.tail[0]
        return self.tail[i] + self.rates[i - 1] * (times[i] - x)

    def between(self, since: float, until: float) -> float:
        """GPU-equivalent-seconds the spans used from ``since`` to ``until``: each span's
        GPUs times its overlap with them, what ``gpu_seconds`` sums for closed records
        (a span that ends before it starts counts nothing there), in O(log n)."""
        if until <= since:
            return 0.0
        return self._rate_after(since) - self._rate_after(until)


def _first_room(parts: list[_UsageAfter], budget: Budget, now: float) -> tuple[float, float] | None:
    """``room_returns`` over the spans of ``parts`` (together): the first moment, an
    end + the period, with room in the budget, rounded up to the minute, and the room."""
    period = float(budget.period)
    cap = float(budget.gpu_hours)
    floor = now - period
    # only spans ending inside the window now can leave it later
    firsts = [bisect_right(part.ends, floor) for part in parts]
    if all(first == len(part.ends) for first, part in zip(firsts, parts, strict=True)):
        return None

    def free_at(end: float) -> float:
        since = (end + period) - period  # the window at ``end + period`` opens here
        return cap - sum(part.at(since) for part in parts) / HOUR

    best: float | None = None
    if not all(part.nonnegative for part in parts):
        # a span with fewer than no GPUs (never recorded): every moment in turn
        moments = chain.from_iterable(
            part.ends[first:] for part, first in zip(parts, firsts, strict=True)
        )
        best = next((end for end in sorted(moments) if free_at(end) > 1e-9), None)
    else:
        # room only grows as the window moves on, except where a span that ended before
        # it started (counted negative) leaves the window: between those moments, bisect
        # each part's ends for its first moment with room; the earliest is the first of all
        cuts = sorted(
            chain.from_iterable(
                part.step_ends[bisect_right(part.step_ends, floor) :] for part in parts
            )
        )
        bounds = [*cuts, math.inf]
        for i, high in enumerate(bounds):
            low = floor if i == 0 else bounds[i - 1]
            for part in parts:
                ends = part.ends
                lo = bisect_right(ends, low) if i == 0 else bisect_left(ends, low)
                stop = bisect_left(ends, high if best is None else min(high, best), lo)
                hi = stop
                while lo < hi:
                    mid = (lo + hi) // 2
                    if free_at(ends[mid]) > 1e-9:
                        hi = mid
                    else:
                        lo = mid + 1
                if lo < stop:
                    best = ends[lo]
            if best is not None:
                break
    if best is None:
        return None
    return math.ceil((best + period) / 60) * 60.0, free_at(best)


@dataclass(slots=True)
class _Room:
    """What ``UsageBook.used`` and ``room_returns`` keep of one owner's records between
    calls: the closed records of when it was made, summed up once; the records closed
    since; the open ones (whose end moves with the clock while they run), looked at
    each time."""

    closed: _UsageAfter
    #: how many records of the owner it accounts for (a check that none went unseen)
    size: int
    open: dict[str, UsageRecord]
    added: list[UsageRecord] = field(default_factory=list)
    added_after: _UsageAfter | None = None
    #: the latest end of the owner's records pruned since: they must not count
    dropped: float = -math.inf

    @classmethod
    def of(cls, records: Collection[UsageRecord]) -> _Room:
        closed = [r for r in records if r.ended is not None]
        opened = {r.uid: r for r in records if r.ended is None}
        ends = [r.end(0.0) for r in closed]
        usage = _UsageAfter([r.started for r in closed], ends, [r.gpus for r in closed])
        return cls(usage, len(closed) + len(opened), opened)

    def closes(self, record: UsageRecord) -> None:
        """An open record of the owner has ended."""
        if self.open.pop(record.uid, None) is not None:
            self.added.append(record)
            self.added_after = None


#: records closed since an owner's ``_Room`` was made before it is made again (each
#: call sums the ones closed since, once per change)
ROOM_REMAKE_AFTER = 256
#: owners whose ``_Room`` the book keeps (each holds ~56 bytes per record of its owner)
MAX_ROOMS = 1000
#: ``UsageBook.used`` sums an owner with at most this many records (a member's own, a
#: small group's) instead of keeping a ``_Room`` for it: a sum of 1,000 records takes
#: ~0.07 ms, making their ``_Room`` ten times that
SUMMED_UP_TO = 1000


#: an owner of GPU-hours: (group, None) for a group (its children's records too), or
#: (group, member) for a member's own in it
Owner = tuple[str, str | None]


def _exact_add(partials: list[float], x: float) -> None:
    """Add ``x`` to a sum kept exactly as non-overlapping partials (Shewchuk's, as
    ``math.fsum`` keeps it): a sum added to and taken from for a year drifts by nothing,
    so a window's total reads as ``math.fsum`` of its records would."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


#: a closed record as a window keeps it: start, end, GPUs, owners, inside the window
_Entry = tuple[float, float, float, tuple[Owner, ...], bool]


class _Window:
    """Every owner's GPU-seconds of closed records in the window of one ``period``
    ending at the latest moment asked, kept as the window moves on: a record inside
    it whole is summed once; one across its start is counted from the start (a few:
    the servers running at that moment); one ending after the moment asked is counted
    up to it. A record leaves the whole-inside sum once, when the window's start
    passes its start, and the window once, when it passes its end: per moment asked,
    the cost is the records that moved, not all of them."""

    __slots__ = (
        "edge",
        "edge_heap",
        "entries",
        "flat",
        "floor",
        "inside",
        "inside_heap",
        "later",
        "now",
        "period",
    )  # fmt: skip

    def __init__(self, period: float, now: float) -> None:
        self.period = period
        self.now = now
        #: the window's start (now - period)
        self.floor = now - period
        #: the records it counts, by uid (those inside it whole, and across its start)
        self.entries: dict[str, _Entry] = {}
        #: each owner's sum of its records inside the window whole (exact partials)
        self.inside: dict[Owner, list[float]] = {}
        #: records across the window's start, by uid
        self.edge: dict[str, _Entry] = {}
        #: records ending after the latest moment asked, by uid (rare: a clock ahead)
        self.later: dict[str, _Entry] = {}
        #: records ending no later than they start, by uid, with their end: they count
        #: nothing, but they are in the window until it passes their end
        self.flat: dict[str, float] = {}
        #: (start, uid) of the records inside whole; (end, uid) of those across the
        #: start: the next to move as the window moves on (stale ones are skipped)
        self.inside_heap: list[tuple[float, str]] = []
        self.edge_heap: list[tuple[float, str]] = []

    def add(
        self, uid: str, start: float, end: float, gpus: float, owners: tuple[Owner, ...]
    ) -> None:
        """A closed record to count (``remove`` it first if it was counted)."""
        if end <= start:
            if end > self.floor:
                self.flat[uid] = end  # counts nothing in any window
            return
        if end > self.now:
            self.later[uid] = (start, end, gpus, owners, False)
        elif end <= self.floor:
            return  # the window has passed it
        elif start >= self.floor:
            self.entries[uid] = (start, end, gpus, owners, True)
            heapq.heappush(self.inside_heap, (start, uid))
            used = gpus * (end - start)
            for owner in owners:
                _exact_add(self.inside.setdefault(owner, []), used)
        else:
            self.entries[uid] = self.edge[uid] = (start, end, gpus, owners, False)
            heapq.heappush(self.edge_heap, (end, uid))

    def remove(self, uid: str) -> None:
        """Count a record no more (changed, reopened, or pruned)."""
        if self.later.pop(uid, None) is not None or self.flat.pop(uid, None) is not None:
            return
        entry = self.entries.pop(uid, None)
        if entry is None:
            return
        start, end, gpus, owners, whole = entry
        if whole:
            for owner in owners:
                _exact_add(self.inside[owner], -gpus * (end - start))
        else:
            del self.edge[uid]

    def advance(self, now: float) -> None:
        """Move the window on to end at ``now`` (not before the last moment asked)."""
        floor = now - self.period
        self.now = now
        self.floor = floor
        heap, entries = self.inside_heap, self.entries
        while heap and heap[0][0] < floor:
            start, uid = heapq.heappop(heap)
            entry = entries.get(uid)
            if entry is None or not entry[4] or entry[0] != start:
                continue  # removed, or counted anew since
            _, end, gpus, owners, _ = entry
            for owner in owners:
                _exact_add(self.inside[owner], -gpus * (end - start))
            if end > floor:
                entries[uid] = self.edge[uid] = (start, end, gpus, owners, False)
                heapq.heappush(self.edge_heap, (end, uid))
            else:
                del entries[uid]
        heap = self.edge_heap
        while heap and heap[0][0] <= floor:
            end, uid = heapq.heappop(heap)
            entry = entries.get(uid)
            if entry is None or entry[4] or entry[1] != end:
                continue
            del entries[uid]
            del self.edge[uid]
        if self.flat:
            self.flat = {uid: end for uid, end in self.flat.items() if end > floor}
        for uid in [u for u, e in self.later.items() if e[1] <= now]:
            start, end, gpus, owners, _ = self.later.pop(uid)
            self.add(uid, start, end, gpus, owners)

    def seconds(self) -> dict[Owner, float]:
        """Every owner's GPU-seconds of closed records in the window now."""
        totals = {owner: math.fsum(partials) for owner, partials in self.inside.items()}
        floor, now = self.floor, self.now
        for _start, end, gpus, owners, _ in self.edge.values():
            used = gpus * (end - floor)
            for owner in owners:
                totals[owner] = totals.get(owner, 0.0) + used
        for start, end, gpus, owners, _ in self.later.values():
            end = min(end, now)
            start = max(start, floor)
            if end > start:
                for owner in owners:
                    totals[owner] = totals.get(owner, 0.0) + gpus * (end - start)
        return totals


class UsageBook:
    """Records that may still count, by owner: each group (parents included) and
    each (user, group)."""

    def __init__(self, horizon: float = 0.0) -> None:
        #: how far back a record can count (the longest budget period), in seconds
        self.horizon = horizon
        self.records: dict[str, UsageRecord] = {}
        self.by_group: dict[str, dict[str, UsageRecord]] = {}
        self.by_user: dict[tuple[str, str], dict[str, UsageRecord]] = {}
        self.open_by_key: dict[str, UsageRecord] = {}
        #: what ``used`` and ``room_returns`` keep of each owner they were asked about,
        #: by (group, member or None), kept in step with the owner's records by every
        #: change; the least recently asked about is forgotten first
        self._rooms: dict[tuple[str, str | None], _Room] = {}
        #: each period's window of closed records, kept as the clock moves (made when
        #: ``window_seconds`` is first asked about that period)
        self._windows: dict[float, _Window] = {}
        #: the owners of the records of each (group, user), one tuple shared by all
        self._owner_tuples: dict[tuple[str, str], tuple[Owner, ...]] = {}
        #: when closed records end, and their uids: the next to prune first (stale
        #: entries, of records changed or gone since, are skipped)
        self._ends: list[tuple[float, str]] = []

    def _room(self, group: str, member: str | None, period: float, now: float) -> _Room | None:
        """What is kept of the records of ``group`` (``member``'s own in it, if given),
        made again from the records if any of its closed records changed; None: no
        records."""
        records = self.by_group.get(group) if member is None else self.by_user.get((member, group))
        if not records:
            return None
        owner = (group, member)
        room = self._rooms.pop(owner, None)  # put back last: the most recently asked
        if (
            room is None
            or room.size != len(records)
            # a record pruned since could still count in this window (a longer period)
            or room.dropped > now - period
            or len(room.added) > ROOM_REMAKE_AFTER
        ):
            while len(self._rooms) >= MAX_ROOMS:
                del self._rooms[next(iter(self._rooms))]
            room = _Room.of(records.values())
        self._rooms[owner] = room
        return room

    @staticmethod
    def _added_after(room: _Room, now: float, running: Container[str]) -> _UsageAfter:
        if room.added_after is None:
            room.added_after = _UsageAfter.of(
                (r.started, r.end(now, running), r.gpus) for r in room.added
            )
        return room.added_after

    def used(
        self,
        group: str,
        member: str | None,
        period: int,
        now: float,
        running: Container[str] = (),
    ) -> float:
        """GPU-hours of the records of ``group`` (``member``'s own in it, if given) in
        the ``period`` before ``now``: ``gpu_hours`` of them, the same sum.

        An owner with up to ``SUMMED_UP_TO`` records is summed; a larger one's closed
        records are read from what ``room_returns`` keeps of them (summed from the
        latest back once, so any window of them is two bisections), and only its open
        records (servers running or unseen lately, whose use moves with the clock) are
        summed each time.
        """
        records = self.by_group.get(group) if member is None else self.by_user.get((member, group))
        if not records:
            return 0.0
        since = now - period
        if (group, member) not in self._rooms and (
            len(records) <= SUMMED_UP_TO or len(self._rooms) >= MAX_ROOMS
        ):
            # as quick; or as many owners kept as the book keeps (only a refusal makes
            # way for another: rooms made and forgotten in turn would cost a sort a call)
            return gpu_hours(records.values(), since, now, running)
        room = self._room(group, member, float(period), now)
        assert room is not None
        seconds = room.closed.between(since, now)
        if room.added:
            seconds += self._added_after(room, now, running).between(since, now)
        if room.open:
            seconds += gpu_seconds(room.open.values(), since, now, running)
        return seconds / HOUR

    def room_returns(
        self,
        group: str,
        member: str | None,
        budget: Budget,
        now: float,
        running: Container[str] = (),
    ) -> tuple[float, float] | None:
        """``room_returns`` of the records of ``group`` (``member``'s own in it, if
        given), the same answer, from what was summed up at an earlier call as long as
        none of the owner's closed records changed (a record closing is added to it)."""
        room = self._room(group, member, float(budget.period), now)
        if room is None:
            return None
        parts = [room.closed]
        if room.added:
            parts.append(self._added_after(room, now, running))
        if room.open:
            parts.append(
                _UsageAfter.of((r.started, r.end(now, running), r.gpus) for r in room.open.values())
            )
        return _first_room(parts, budget, now)

    def _owners(self, policy: Policy, record: UsageRecord) -> list[tuple[str, str | None]]:
        """The owners' keys in ``_rooms`` a record counts for."""
        owners: list[tuple[str, str | None]] = [
            (name, None) for name in policy.charged_groups(record.group)
        ]
        owners.append((record.group, record.user))
        return owners

    def _rooms_put(
        self,
        policy: Policy,
        old: UsageRecord | None,
        record: UsageRecord,
        closed: UsageRecord | None,
    ) -> None:
        """Keep each ``_Room`` in step with ``put``: ``record`` replaced ``old`` (if
        any) and ended the open record ``closed`` (if any)."""
        rooms = self._rooms
        if closed is not None:
            for owner in self._owners(policy, closed):
                room = rooms.get(owner)
                if room is not None:
                    room.closes(closed)
        if old is not None:
            if old is not record and old.ended is not None and old == record:
                return  # the same closed record read again
            for owner in self._owners(policy, old):
                room = rooms.get(owner)
                if room is None:
                    continue
                if old.ended is None and room.open.pop(old.uid, None) is not None:
                    room.size -= 1
                else:
                    del rooms[owner]  # a closed record changed (or reopened): sum again
        for owner in self._owners(policy, record):
            room = rooms.get(owner)
            if room is None:
                continue
            room.size += 1
            if record.ended is None:
                room.open[record.uid] = record
            else:
                room.added.append(record)
                room.added_after = None

    @classmethod
    def for_policy(cls, policy: Policy) -> UsageBook:
        return cls(horizon=longest_period(policy))

    def put(self, policy: Policy, record: UsageRecord) -> None:
        """Add a record, or replace the one with its uid."""
        old = self.records.get(record.uid)
        if old is not None:
            self._unindex(policy, old)
        closed = None
        if record.ended is None:
            earlier = self.open_by_key.get(record.key)
            if earlier is not None and earlier.uid != record.uid:
                # a new pod for the same server: the old one's end was missed
                if earlier.started <= record.started:
                    earlier.ended = min(earlier.end(record.started), record.started)
                    del self.open_by_key[record.key]
                    closed = earlier
                else:
                    record.ended = min(record.end(earlier.started), earlier.started)
        self.records[record.uid] = record
        for name in policy.charged_groups(record.group):
            self.by_group.setdefault(name, {})[record.uid] = record
        self.by_user.setdefault((record.user, record.group), {})[record.uid] = record
        if record.ended is None:
            self.open_by_key[record.key] = record
        if self._rooms:
            self._rooms_put(policy, old, record, closed)
        owners = self._owner_tuples.get((record.group, record.user))
        if owners is None:
            owners = self._owner_tuples[(record.group, record.user)] = tuple(
                self._owners(policy, record)
            )
        if record.ended is not None:
            heapq.heappush(self._ends, (record.ended, record.uid))
        if closed is not None and closed.ended is not None:
            heapq.heappush(self._ends, (closed.ended, closed.uid))
        for window in self._windows.values():
            if old is not None:
                window.remove(old.uid)
            if record.ended is not None:
                window.add(record.uid, record.started, record.ended, record.gpus, owners)
            if closed is not None and closed.ended is not None:
                window.remove(closed.uid)
                window.add(
                    closed.uid,
                    closed.started,
                    closed.ended,
                    closed.gpus,
                    self._owner_tuples[(closed.group, closed.user)],
                )

    def _unindex(self, policy: Policy, record: UsageRecord) -> None:
        for name in policy.charged_groups(record.group):
            self.by_group.get(name, {}).pop(record.uid, None)
        self.by_user.get((record.user, record.group), {}).pop(record.uid, None)
        if self.open_by_key.get(record.key) is record:
            del self.open_by_key[record.key]

    def end(self, key: str, at: float) -> UsageRecord | None:
        """The open record of server ``key`` ends at ``at``."""
        record = self.open_by_key.pop(key, None)
        if record is not None:
            record.ended = max(at, record.started)
            for room in self._rooms.values():
                room.closes(record)
            heapq.heappush(self._ends, (record.ended, record.uid))
            owners = self._owner_tuples.get((record.group, record.user))
            for window in self._windows.values() if owners is not None else ():
                window.remove(record.uid)
                window.add(record.uid, record.started, record.ended, record.gpus, owners)
        return record

    def prune(self, policy: Policy, now: float) -> int:
        """Drop records that ended before any budget's window: they never count again."""
        cutoff = now - self.horizon
        # the records in the order they end: only those leaving are looked at, not
        # every record (a year's, at a large site) at every pass
        found: dict[str, UsageRecord] = {}
        ends = self._ends
        while ends and ends[0][0] < cutoff:
            _, uid = heapq.heappop(ends)
            record = self.records.get(uid)
            if record is not None and record.ended is not None and record.ended < cutoff:
                found[uid] = record
        gone = list(found.values())
        for record in gone:
            self._unindex(policy, record)
            del self.records[record.uid]
            for window in self._windows.values():
                window.remove(record.uid)
            for owner in self._owners(policy, record) if self._rooms else ():
                room = self._rooms.get(owner)
                if room is not None:
                    room.size -= 1
                    room.dropped = max(room.dropped, record.end(now))
        for index in (self.by_group, self.by_user) if gone else ():
            for owner in [o for o, owned in index.items() if not owned]:
                del index[owner]
        return len(gone)

    def _window(self, period: float, now: float) -> _Window:
        """The window of ``period`` ending at ``now``, made or moved on."""
        window = self._windows.get(period)
        if window is None or now < window.now:
            window = _Window(period, now)
            owner_tuples = self._owner_tuples
            for r in self.records.values():
                if r.ended is not None:
                    window.add(r.uid, r.started, r.ended, r.gpus, owner_tuples[(r.group, r.user)])
            self._windows[period] = window
        elif now != window.now:
            window.advance(now)
        return window

    def window_records(self, period: float, now: float) -> list[UsageRecord]:
        """At least every record whose end (as ``UsageRecord.end`` tells it, whatever
        servers run) is after ``now - period``: the closed ones the window holds, and
        every open one; a few besides, at most (those ending after ``now``)."""
        window = self._window(period, now)
        records = self.records
        found = [records[uid] for uid in chain(window.entries, window.later, window.flat)]
        found.extend(self.open_by_key.values())
        return found

    def window_seconds(
        self, period: float, now: float, running: Container[str] = ()
    ) -> dict[Owner, float]:
        """Every owner's GPU-equivalent-seconds in the ``period`` before ``now``: by
        (group, None) what ``gpu_seconds`` sums of ``group_records(group)``, by (group,
        member) of ``user_records(member, group)``, the same sums (an owner without
        records in the window may be missing: none).

        The closed records are kept summed as the window moves on (``_Window``), so
        asking again later costs the records that changed or moved through the window's
        ends since, and the open ones (servers running or unseen lately), summed each
        time: a pass at a year of records costs what a pass at a day's does. Asking
        about an earlier ``now`` than the last (a clock set back) sums them all again."""
        totals = self._window(period, now).seconds()
        since = now - period
        owner_tuples = self._owner_tuples
        # ``gpu_seconds`` of an open record, inlined
        for r in self.open_by_key.values():
            end = now if r.key in running else max(r.last_seen, r.started)
            start = r.started if r.started > since else since
            if end > start:
                used = r.gpus * (end - start)
                for owner in owner_tuples[(r.group, r.user)]:
                    totals[owner] = totals.get(owner, 0.0) + used
        return totals

    def group_records(self, group: str) -> Iterable[UsageRecord]:
        return self.by_group.get(group, {}).values()

    def user_records(self, user: str, group: str) -> Iterable[UsageRecord]:
        return self.by_user.get((user, group), {}).values()


def has_budget(policy: Policy, group: Group) -> bool:
    """Whether any budget applies to a GPU server charged to ``group``."""
    return group.user_budget is not None or any(
        level.budget is not None and not level.unlimited for level in policy.ancestors(group.name)
    )


def longest_period(policy: Policy) -> float:
    periods = [
        budget.period
        for group in policy.all_groups
        for budget in (group.budget, group.user_budget)
        if budget is not None
    ]
    return float(max(periods, default=0))


@dataclass(frozen=True)
class BudgetState:
    """One owner's budget at one instant."""

    owner: str  # "research", or "alice in research"
    budget: Budget
    used: float  # GPU-equivalent-hours in the window
    #: the owner's records (a live view of the book, not a copy)
    records: Iterable[UsageRecord] = field(default=(), compare=False, repr=False)
    group: str = ""  # the group whose budget it is (for a member's own: their group)
    user: str | None = None  # the member, for a member's own budget

    @property
    def exhausted(self) -> bool:
        return self.used >= float(self.budget.gpu_hours)

    @property
    def remaining(self) -> float:
        return max(float(self.budget.gpu_hours) - self.used, 0.0)


def budgets_of(
    policy: Policy,
    book: UsageBook,
    user: str,
    group: Group,
    now: float,
    running: Container[str] = (),
) -> list[BudgetState]:
    """The budgets a GPU server of ``user`` charged to ``group`` counts against: the
    group's, each parent's, and the user's own in the group; nearest first."""
    owners = [
        (level.display_name, level.budget, book.group_records(level.name), level.name, None)
        for level in policy.ancestors(group.name)
        if level.budget is not None and not level.unlimited
    ]
    if group.user_budget is not None:
        owners.append(
            (
                f"{user} in {group.display_name}",
                group.user_budget,
                book.user_records(user, group.name),
                group.name,
                user,
            )
        )
    return [
        BudgetState(
            owner,
            budget,
            book.used(group_name, member, budget.period, now, running),
            records,
            group_name,
            member,
        )
        for owner, budget, records, group_name, member in owners
    ]


def room_returns(
    records: Iterable[UsageRecord],
    budget: Budget,
    now: float,
    running: Container[str] = (),
) -> tuple[float, float] | None:
    """When some of an exhausted budget is free again, and how much: (time, GPU-hours).

    Counts what was used up to now and nothing after (as if the owner's servers
    stopped now): the first moment a whole record has left the window with room
    to show, rounded up to the minute (room may start to return a little earlier,
    as a record leaves in part). None if nothing ever leaves (no records).

    One sort of the records' starts and ends, then each moment a record leaves is
    weighed in O(log n) (``_UsageAfter``); ``UsageBook.room_returns`` keeps the sort
    between calls.
    """
    floor = now - float(budget.period)
    starts: list[float] = []
    ends: list[float] = []
    gpus: list[float] = []
    for r in records:
        end = r.end(now, running)
        if end > floor:
            starts.append(r.started)
            ends.append(end)
            gpus.append(r.gpus)
    if not ends:
        return None
    return _first_room([_UsageAfter(starts, ends, gpus)], budget, now)


def format_period(seconds: int) -> str:
    """ "30 days", "7 days", "12 hours", "1 hour 30 minutes": a window in words."""
    return words.duration(seconds)


def format_hours(value: float, *, grouped: bool = False) -> str:
    """GPU-hours as every message writes them (``words.number``): 2000, 20.5, 0.0125.

    ``grouped``: thousands separated, for tables ("12,345.6"); a message keeps the
    plain number ("12345.6"), which reads the same in a log line and a refusal."""
    return words.number(value, grouped=grouped)


def format_cap(value: float) -> str:
    return words.number(value)


def format_time(epoch: float) -> str:
    return words.moment(epoch)


def used_line(owner: str, used: float, budget: Budget) -> str:
    """``Research used 1999.96 of 2000 GPU-hours in the last 30 days``."""
    return (
        f"{owner} used {_hours_of(used, float(budget.gpu_hours))} "
        f"in the last {words.period(budget.period)}"
    )


def _hours_of(part: float, whole: float) -> str:
    """``12.5 of 100 GPU-hours``, ``0.5 of 1 GPU-hour``."""
    a, b = words.numbers([part, whole])
    return f"{a} of {b} {words.noun(b, words.GPU_HOUR, words.GPU_HOURS)}"


def exhausted_reason(
    state: BudgetState,
    now: float,
    running: Container[str] = (),
    book: UsageBook | None = None,
) -> str:
    """``Research used 2000 of 2000 GPU-hours in the last 30 days: GPU servers can start
    again at 2026-12-01 14:00 UTC, when 12.5 GPU-hours are free again; until then, start
    one without GPUs, or ask an admin to raise the budget``. With the ``book`` the
    state's records are in, when room returns is worked out from what the book kept of
    an earlier refusal."""
    if book is not None:
        room = book.room_returns(state.group, state.user, state.budget, now, running)
    else:
        room = room_returns(state.records, state.budget, now, running)
    return used_up_refusal(state.owner, state.used, state.budget, room)


def used_up_refusal(
    owner: str, used: float, budget: Budget, room: tuple[float, float] | None
) -> str:
    """A GPU spawn refused for a used-up budget: the numbers, when it can start again
    (``room``: when, and how many GPU-hours are free then; None: not known), and what
    to do meanwhile."""
    text = used_line(owner, used, budget)
    if room is not None:
        when, free = room
        free_text = words.gpu_hours(free)
        text += (
            f": GPU servers can start again at {format_time(when)}, when {free_text} "
            f"{'is' if free_text.startswith('1 ') else 'are'} free again"
        )
    else:
        text += ": GPU servers can start again once some of it is free"
    return text + "; until then, start one without GPUs, or ask an admin to raise the budget"


def grace_refusal(owner: str, budget: Budget, remaining: float, held: float, gpus: float) -> str:
    """A GPU spawn refused by a ``when_exhausted: stop`` budget whose rest cannot cover
    the grace of every GPU its servers hold and this server's."""
    promised = (held + gpus) * budget.grace / HOUR
    left, cap, need = words.numbers([remaining, float(budget.gpu_hours), promised])
    return (
        f"{owner} has {left} of {cap} {words.noun(cap, words.GPU_HOUR, words.GPU_HOURS)} "
        f"left in the last {words.period(budget.period)}, less than the {need} "
        f"{words.noun(need, words.GPU_HOUR, words.GPU_HOURS)} its servers' "
        f"{words.gpus(held)} and this server's {words.number(gpus)} would use in the "
        f"{format_period(budget.grace)} each may still run once they are used up: try again "
        "when one of its servers stops, or choose fewer GPUs"
    )


def budget_refusal(
    policy: Policy,
    book: UsageBook,
    user: str,
    group: Group,
    gpus: float,
    now: float,
    ledger: Ledger | None = None,
) -> str | None:
    """Why a server with ``gpus`` GPU-equivalents may not start now, or None.

    Refused when a budget it counts against is used up. A ``when_exhausted: stop``
    budget promises every server it admits its ``grace`` of run time: it admits a
    server only while what is left covers the grace of every GPU the owner's servers
    hold in ``ledger`` (running, starting, reserved) and this one's, so servers
    admitted together can never jointly promise more than the budget has. A server
    without GPUs is never refused for GPU time.
    """
    if not gpus:
        return None
    running: Container[str] = ledger.charges if ledger is not None else ()
    for state in budgets_of(policy, book, user, group, now, running):
        if state.exhausted:
            return exhausted_reason(state, now, running, book)
        if state.budget.when_exhausted != "stop" or ledger is None:
            continue
        held = float(
            ledger.user_usage(state.user, state.group).gpus
            if state.user is not None
            else ledger.usage(state.group).gpus
        )
        promised = (held + gpus) * state.budget.grace / HOUR
        if state.remaining < promised:
            return grace_refusal(state.owner, state.budget, state.remaining, held, gpus)
    return None


# ---- what a server running on used-up budgets is told, and when it stops ------------------

#: a budget by who owns it: (group, "") for a group's own, (group, member) for a
#: member's own budget in that group
BudgetKey = tuple[str, str]


@dataclass(frozen=True)
class UsedUp:
    """A used-up budget a running server counts against."""

    key: BudgetKey
    owner: str  # "research", or "alice in research"
    budget: Budget
    used: float  # GPU-equivalent-hours in its window

    @property
    def stops(self) -> bool:
        return self.budget.when_exhausted == "stop"


@dataclass(frozen=True)
class Told:
    """What one server was told of one used-up budget: when, and the stop it announced
    (None: a ``warn`` budget, which stops nothing); ``stop_said``: when the server was
    told it is being stopped now (the stop this announcement set)."""

    key: BudgetKey
    at: float
    stop_at: float | None
    stop_said: float | None = None


@dataclass(frozen=True)
class BudgetNotices:
    """What to do about one server at one run (``budget_notices``)."""

    #: new notices, one per budget not told yet, each with its own stop (or none)
    tell: tuple[Told, ...] = ()
    #: budgets told before that are no longer used up, or whose kind (warn or stop)
    #: changed: forgotten, so a later exhaustion tells anew
    forget: tuple[BudgetKey, ...] = ()
    #: the earliest stop announced for a budget still used up (None: no stop is due
    #: ever for what is used up now), and the announcement that set it
    stop: Told | None = None
    #: that stop's time has come
    due: bool = False


def budget_notices(used_up: Iterable[UsedUp], told: Iterable[Told], now: float) -> BudgetNotices:
    """Which of a server's used-up budgets to tell, and whether it stops now.

    Each used-up budget is told once, with its own notice: a ``stop`` budget
    announces its stop ``grace`` after its own notice, a ``warn`` budget announces
    none (and so shortens no stop budget's grace). The server stops at the earliest
    stop announced for a budget still used up, never earlier; a budget with room
    again is forgotten, so its next exhaustion is told anew with a fresh grace. A
    budget whose ``when_exhausted`` changed since it was told (a new policy) is told
    anew as what it is now. ``told`` is what was told before, read back from where it
    is kept: a restart neither tells again nor gives a fresh grace.
    """
    now_used = {u.key: u for u in used_up}
    kept: dict[BudgetKey, Told] = {}
    forget: list[BudgetKey] = []
    for t in told:
        u = now_used.get(t.key)
        if u is None or u.stops != (t.stop_at is not None):
            forget.append(t.key)
        else:
            kept[t.key] = t
    tell = tuple(
        Told(key, now, now + u.budget.grace if u.stops else None)
        for key, u in now_used.items()
        if key not in kept
    )
    stopping = [t for t in (*kept.values(), *tell) if t.stop_at is not None]
    # the earliest; between equal times, one already told (it may have said the stop)
    stop = min(stopping, key=lambda t: (t.stop_at, t in tell), default=None)
    due = stop is not None and stop.stop_at is not None and stop.stop_at <= now
    return BudgetNotices(tell, tuple(forget), stop, due)


def earliest_stop(told: Iterable[Told]) -> Told | None:
    """The announcement with the earliest stop among ``told`` (None: none stops)."""
    return min((t for t in told if t.stop_at is not None), key=lambda t: t.stop_at, default=None)
