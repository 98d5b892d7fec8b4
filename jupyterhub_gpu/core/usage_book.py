"""The usage book: the records that can still count towards a budget, by owner.

The ``UsageBook`` keeps them indexed by every group they are charged to (a server
counts for its group and each parent) and by (user, group), so a spawn's budget
check reads only its own owners' records. What an owner used in its window, and
when room returns: one sweep over the owner's records, kept by the book between
calls (only the records that change are looked at again, and the open ones, whose
use moves with the clock); every owner's use in a window, kept as the window moves
on. Pure: no I/O; times are epoch seconds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Container, Iterable
from itertools import chain

from .model import Budget, Policy
from .room import Room, UsageAfter, first_room
from .usage import HOUR, UsageRecord, gpu_hours, gpu_seconds, open_end

#: records closed since an owner's ``Room`` was made before it is made again (each
#: call sums the ones closed since, once per change)
ROOM_REMAKE_AFTER = 256
#: owners whose ``Room`` the book keeps (each holds ~56 bytes per record of its owner)
MAX_ROOMS = 1000
#: ``UsageBook.used`` sums an owner with at most this many records (a member's own, a
#: small group's) instead of keeping a ``Room`` for it: a sum of 1,000 records takes
#: ~0.07 ms, making their ``Room`` ten times that
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
        self._rooms: dict[tuple[str, str | None], Room] = {}
        #: each period's window of closed records, kept as the clock moves (made when
        #: ``window_seconds`` is first asked about that period)
        self._windows: dict[float, _Window] = {}
        #: the owners of the records of each (group, user), one tuple shared by all
        self._owner_tuples: dict[tuple[str, str], tuple[Owner, ...]] = {}
        #: when closed records end, and their uids: the next to prune first (stale
        #: entries, of records changed or gone since, are skipped)
        self._ends: list[tuple[float, str]] = []

    def _room(self, group: str, member: str | None, period: float, now: float) -> Room | None:
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
            room = Room.of(records.values())
        self._rooms[owner] = room
        return room

    @staticmethod
    def _added_after(room: Room, now: float, running: Container[str]) -> UsageAfter:
        if room.added_after is None:
            room.added_after = UsageAfter.of(
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
                UsageAfter.of((r.started, r.end(now, running), r.gpus) for r in room.open.values())
            )
        return first_room(parts, budget, now)

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
        """Keep each ``Room`` in step with ``put``: ``record`` replaced ``old`` (if
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

    def discard(self, policy: Policy, uid: str) -> None:
        """Forget the record with this uid (if any): it no longer counts anywhere."""
        record = self.records.pop(uid, None)
        if record is None:
            return
        self._unindex(policy, record)
        for window in self._windows.values():
            window.remove(uid)
        for owner in self._owners(policy, record) if self._rooms else ():
            self._rooms.pop(owner, None)  # summed again when next asked

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
            end = open_end(r, now, running)
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


def longest_period(policy: Policy) -> float:
    periods = [
        budget.period
        for group in policy.all_groups
        for budget in (group.budget, group.user_budget)
        if budget is not None
    ]
    return float(max(periods, default=0))
