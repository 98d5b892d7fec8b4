"""The waiting line kept in order as servers join and leave, instead of sorted at each look.

``fairshare.line_order`` sorts the whole line, and ``fairshare.place`` walks it,
whenever anyone looks: at a thousand waiters (a whole course asking at once) that is
a millisecond per spawn. A ``Line`` keeps the same order as its servers join, leave,
are given a new standing or start to wait for a group, each in O(log n) comparisons
(a list insert on top, a memory move): the line sorted by the key ``line_order``
sorts by, and, per group, the waiters that wait for it and those charged to it, so a
server's place is found by bisection among those waiting for the same capacity, not
by a walk of everyone.

The answers are ``line_order``'s and ``place``'s exactly (tests/unit/test_line.py checks it
against them): a server past ``max_wait`` moves to the front, by arrival, at the first
look after it crossed it; ties go by arrival, then by joining order.

Pure: no I/O; times are epoch seconds.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator

from .fairshare import Place, Waiter

#: a waiter's place in the sorted lists: (0 past max_wait | 1, standing, seq, joined),
#: the waiter itself last (never compared: ``joined`` is unique)
_Entry = tuple


class Line:
    """Waiting servers in the order they go, kept as they change.

    A waiter's ``standing`` and ``blocked_on`` are set through the line
    (``restand``, ``block``), never on the waiter directly once it has joined: the
    line files it by them."""

    def __init__(self, max_wait: float | None = None) -> None:
        self.max_wait = max_wait
        self._joined = itertools.count()
        #: by server key: the waiter's entry as filed
        self._entries: dict[str, _Entry] = {}
        self._order: list[_Entry] = []
        #: group -> entries of the waiters that wait for it (``blocked_on``)
        self._blocking: dict[str, list[_Entry]] = {}
        #: group -> entries of the waiters charged to it (their ``chain``)
        self._charged: dict[str, list[_Entry]] = {}
        #: (arrived, joined, key) of waiters not yet past max_wait, earliest first
        self._arrivals: list[tuple[float, int, str]] = []
        #: the latest time looked at (an earlier one: the clock went back)
        self._now = float("-inf")

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Waiter]:
        """The waiters in the order they joined."""
        return (entry[4] for entry in self._entries.values())

    def get(self, key: str) -> Waiter | None:
        entry = self._entries.get(key)
        return entry[4] if entry is not None else None

    # ---- changes --------------------------------------------------------------------

    def join(self, waiter: Waiter, now: float) -> None:
        """``waiter`` joins (with its ``standing`` as worked out at ``standing_at``);
        one with the same key is replaced, keeping its place among equals (as a
        dict keeps a replaced key's)."""
        old = self._entries.get(waiter.key)
        joined = old[3] if old is not None else next(self._joined)
        if old is not None:
            self._unfile(old)
        long = self.max_wait is not None and waiter.waited_long(now, self.max_wait)
        entry = self._entry(waiter, long, joined)
        self._file(entry)
        if not long and self.max_wait is not None:
            heapq.heappush(self._arrivals, (waiter.arrived, joined, waiter.key))

    def leave(self, waiter: Waiter) -> None:
        """``waiter`` leaves (decided, or its spawn given up); another waiter with its
        key stays."""
        entry = self._entries.get(waiter.key)
        if entry is not None and entry[4] is waiter:
            self._unfile(entry)
            del self._entries[waiter.key]

    def restand(self, waiter: Waiter, standing: tuple[float, ...], at: float) -> None:
        """``waiter``'s standing, worked out anew at ``at``."""
        entry = self._filed(waiter)
        waiter.standing_at = at
        if entry is None or standing == waiter.standing:
            waiter.standing = standing
            return
        self._unfile(entry)
        waiter.standing = standing
        self._file(self._entry(waiter, entry[0] == 0, entry[3]))

    def block(self, waiter: Waiter, group: str | None) -> None:
        """``waiter`` waits for ``group``'s capacity (None: not decided yet)."""
        entry = self._filed(waiter)
        if entry is None or group == waiter.blocked_on:
            waiter.blocked_on = group
            return
        self._unfile(entry)
        waiter.blocked_on = group
        self._file(entry)

    def _filed(self, waiter: Waiter) -> _Entry | None:
        """``waiter``'s entry; None if it left or another of its server replaced it."""
        entry = self._entries.get(waiter.key)
        return entry if entry is not None and entry[4] is waiter else None

    # ---- looking --------------------------------------------------------------------

    def ordered(self, now: float) -> list[Waiter]:
        """The waiters in the order they go at ``now``: ``line_order``'s."""
        self._advance(now)
        return [entry[4] for entry in self._order]

    def place(self, me: Waiter, now: float) -> Place:
        """``me``'s place at ``now`` among those waiting for the same capacity:
        ``place(me, line_order(...))``."""
        self._advance(now)
        mine = self._filed(me)
        slices = []
        for group in dict.fromkeys(me.chain):
            filed = self._blocking.get(group)
            if filed:
                # one not in the line (replaced by another of its server) is behind all
                cut = bisect_left(filed, mine) if mine is not None else len(filed)
                if cut:
                    slices.append(filed[:cut])
        if not slices:
            ahead: tuple[Waiter, ...] = ()
        elif len(slices) == 1:
            ahead = tuple(entry[4] for entry in slices[0])
        else:
            ahead = tuple(entry[4] for entry in heapq.merge(*slices))
        behind: tuple[Waiter, ...] = ()
        if me.blocked_on is not None and mine is not None:
            filed = self._charged.get(me.blocked_on)
            if filed:
                behind = tuple(entry[4] for entry in filed[bisect_right(filed, mine) :])
        return Place(len(ahead) + 1, len(ahead) + len(behind) + 1, ahead, behind)

    # ---- keeping the order ----------------------------------------------------------

    @staticmethod
    def _entry(waiter: Waiter, long: bool, joined: int) -> _Entry:
        if long:
            return (0, (), waiter.seq, joined, waiter)
        return (1, waiter.standing, waiter.seq, joined, waiter)

    def _file(self, entry: _Entry) -> None:
        waiter: Waiter = entry[4]
        self._entries[waiter.key] = entry
        insort(self._order, entry)
        if waiter.blocked_on is not None:
            insort(self._blocking.setdefault(waiter.blocked_on, []), entry)
        for group in dict.fromkeys(waiter.chain):
            insort(self._charged.setdefault(group, []), entry)

    def _unfile(self, entry: _Entry) -> None:
        waiter: Waiter = entry[4]
        _remove(self._order, entry)
        if waiter.blocked_on is not None:
            _remove_from(self._blocking, waiter.blocked_on, entry)
        for group in dict.fromkeys(waiter.chain):
            _remove_from(self._charged, group, entry)

    def _advance(self, now: float) -> None:
        """Move those past ``max_wait`` at ``now`` to the front."""
        if self.max_wait is None:
            return
        if now < self._now:
            self._refile(now)
        self._now = now
        arrivals = self._arrivals
        while arrivals:
            _, joined, key = arrivals[0]
            entry = self._entries.get(key)
            if entry is None or entry[3] != joined or entry[0] == 0:
                heapq.heappop(arrivals)  # left, replaced, or moved already
                continue
            if not entry[4].waited_long(now, self.max_wait):
                return
            heapq.heappop(arrivals)
            self._unfile(entry)
            self._file(self._entry(entry[4], True, joined))

    def _refile(self, now: float) -> None:
        """The clock went back: file every waiter again by whether it waited long at
        ``now`` (the few seconds a clock is set back by rarely move anyone)."""
        entries = list(self._entries.values())
        self._entries.clear()
        self._order.clear()
        self._blocking.clear()
        self._charged.clear()
        self._arrivals.clear()
        for _, _, _, joined, waiter in sorted(entries, key=lambda e: e[3]):
            long = waiter.waited_long(now, self.max_wait)
            self._file(self._entry(waiter, long, joined))
            if not long:
                self._arrivals.append((waiter.arrived, joined, waiter.key))
        heapq.heapify(self._arrivals)


def _remove(filed: list[_Entry], entry: _Entry) -> None:
    i = bisect_left(filed, entry)
    if i == len(filed) or filed[i] is not entry:
        raise AssertionError(f"waiting line: {entry[4].key} is not filed where its key says")
    del filed[i]


def _remove_from(index: dict[str, list[_Entry]], group: str, entry: _Entry) -> None:
    filed = index[group]
    _remove(filed, entry)
    if not filed:
        del index[group]
