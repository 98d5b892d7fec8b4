"""Showback kept as records change: each billing month's sums, and its measured hours.

``ShowbackTally`` answers what ``showback.showback`` sums over every record, from
sums kept per month as records are put, so a request costs the running servers and
the month's rows per group, user and flavor, not every record kept.

Utilisation is each session's (one pod's life, by its record's uid): a session's
mean over the days its pod ran, from DCGM samples read a day at a time
(``utilisation.Chunks``); so is its mean power, and its energy. Once a session has
ended and every day it ran in the month has been read for good, its means no longer
change: ``finalise`` adds its measured and utilised hours, its metered hours and its
energy to the month's sums, once. A request measures only the sessions
not final yet (the running servers and those that ended in a day still being read),
so a month of 150,000 sessions costs what a day's do. Pure: no I/O; epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, tzinfo

from .billing import Billing
from .energy import kwh
from .showback import (
    NO_FLAVOR,
    Showback,
    busy_hours,
    month_bounds,
    month_of,
    showback,
    showback_of,
)
from .usage import HOUR, UsageRecord

#: (group, user, flavor): the rows of a showback
Row = tuple[str, str, str]


def _next_month(month: str) -> str:
    year, number = int(month[:4]), int(month[5:7])
    return f"{year + number // 12:04d}-{number % 12 + 1:02d}"


def _previous_month(month: str) -> str:
    year, number = int(month[:4]), int(month[5:7])
    return f"{year - 1:04d}-12" if number == 1 else f"{year:04d}-{number - 1:02d}"


@dataclass(slots=True)
class _MonthTally:
    """The closed records of one billing month: their GPU-hours, each entry ``[hours,
    billed units, cost, records]`` (the count says when an entry is empty again,
    whatever the rounding of adding and taking away left), and their utilisation."""

    #: by group, then row: a member's answer reads its groups' only
    detail: dict[str, dict[Row, list]] = field(default_factory=dict)
    #: the records whose session's mean is not final yet, by group, then uid
    unfinal: dict[str, dict[str, UsageRecord]] = field(default_factory=dict)
    #: each final session's mean (None: no samples), by uid
    final: dict[str, float | None] = field(default_factory=dict)
    #: the final sessions' hours, by group, then row: ``[measured, utilised, sessions]``
    measured: dict[str, dict[Row, list]] = field(default_factory=dict)
    #: each final session's mean power (watts), by uid: those metered with samples
    watts: dict[str, float] = field(default_factory=dict)
    #: the final sessions' energy, by group, then row: ``[metered hours, kWh, sessions]``
    energy: dict[str, dict[Row, list]] = field(default_factory=dict)


class ShowbackTally:
    """``showback`` kept up to date as records change, instead of summed over every
    record at each request.

    A closed record's GPU-hours are added to each billing month it overlaps (split at
    the months' bounds in ``zone`` exactly as ``showback`` cuts them) when it is put,
    and taken away again when it is put anew (an inferred end reopened, or changed)
    or pruned; so are its measured hours once its session's mean is final. Open
    records, and closed ones ending after the latest ``now`` seen (a clock ahead of
    this one), are summed at each request: the work of a request is bounded by the
    running servers and the month's rows, not by all records.

    The answer is ``showback`` over the records put, with the means of the final
    sessions and those given (the same per-record GPU-hours; the sums may differ in
    the last bits, being added in another order). A record put must not be changed
    in place once it is closed: put a new one with its uid (``UsageBook`` only ever
    ends an open record in place; such a record is summed at the next request that
    sees it ended).
    """

    def __init__(
        self,
        zone: tzinfo = UTC,
        shared: Collection[str] = (),
        billing: Billing | None = None,
        unmetered: Collection[str] = (),
    ) -> None:
        self.zone = zone
        #: the rates hours are billed at: a record's units and cost are worked out as it
        #: is summed, so the rates must not change while the tally lives (a new policy
        #: is a new service, and a new tally)
        self.billing = billing if billing is not None else Billing()
        #: the flavors whose GPUs are shared: a device's utilisation is all its sharers',
        #: so their sessions are never measured
        self.shared = frozenset(shared)
        #: the flavors whose sessions' power is never theirs alone (the shared ones, and
        #: MIG slices, whose series give their parent GPU's power): no energy measured
        self.unmetered = self.shared | frozenset(unmetered)
        self._months: dict[str, _MonthTally] = {}
        self._bounds: dict[str, tuple[float, float]] = {}
        self._rows: dict[Row, Row] = {}
        #: records summed into ``_months``, by uid, as they were summed
        self._closed: dict[str, UsageRecord] = {}
        #: records summed at each request: open, or ending after ``settled``
        self._open: dict[str, UsageRecord] = {}
        self._open_by_group: dict[str, dict[str, UsageRecord]] = {}
        #: every closed record ending by then is in ``_months`` (the latest ``now`` seen)
        self.settled = -math.inf
        #: months starting before this were pruned: no longer complete
        self.pruned = -math.inf

    def __len__(self) -> int:
        return len(self._closed) + len(self._open)

    def month_bounds(self, month: str) -> tuple[float, float]:
        bounds = self._bounds.get(month)
        if bounds is None:
            bounds = self._bounds[month] = month_bounds(month, self.zone)
        return bounds

    # ---- records ----------------------------------------------------------------------

    def put(self, record: UsageRecord, now: float) -> None:
        """Add a record as known at ``now``, or replace the one with its uid (its
        session's mean is then no longer final)."""
        self._remove(record.uid)
        if now > self.settled:
            self.settled = now
        if record.ended is not None and record.ended <= self.settled:
            self._closed[record.uid] = record
            self._add(record, 1)
        else:
            self._open[record.uid] = record
            self._open_by_group.setdefault(record.group, {})[record.uid] = record

    def discard(self, uid: str) -> None:
        """Forget the record with this uid (if any)."""
        self._remove(uid)

    def prune(self, before: float) -> int:
        """Forget the closed records that ended before the billing month of ``before``
        began, and every month before it: ``showback`` is not asked for those months
        any more (``UsageBook.prune`` forgets the same records). A scan of the records,
        made once a month."""
        start = self.month_bounds(month_of(before, self.zone))[0]
        if start <= self.pruned:
            return 0
        self.pruned = start
        gone = [r for r in self._closed.values() if r.ended < start]  # type: ignore[operator]
        for record in gone:
            del self._closed[record.uid]
        # what those records added is in the months dropped here and nowhere else
        for month in [m for m in self._months if self.month_bounds(m)[0] < start]:
            del self._months[month]
        return len(gone)

    def _remove(self, uid: str) -> None:
        old = self._closed.pop(uid, None)
        if old is not None:
            self._add(old, -1)
        else:
            self._unopen(uid)

    def _unopen(self, uid: str) -> UsageRecord | None:
        record = self._open.pop(uid, None)
        if record is not None:
            owned = self._open_by_group[record.group]
            del owned[uid]
            if not owned:
                del self._open_by_group[record.group]
        return record

    def _settle(self, now: float) -> None:
        """Sum the open records that have ended by ``now`` into their months (ended in
        place by ``UsageBook``, or ending after an earlier ``now``)."""
        if now > self.settled:
            self.settled = now
        done = [r for r in self._open.values() if r.ended is not None and r.ended <= now]
        for record in done:
            self._unopen(record.uid)
            self._closed[record.uid] = record
            self._add(record, 1)

    def _months_of(self, record: UsageRecord) -> Iterator[tuple[str, float, float, float, float]]:
        """Each month a closed record has GPU-hours in (not pruned), with those hours,
        its seconds there, their billed units and cost: the arithmetic of ``showback``,
        step for step, so what is added is what is taken away, and what ``showback``
        adds."""
        billed = self.billing.billed if self.billing.rates else None
        end, start = record.ended, record.started
        if end is None or not end > start:
            return
        month = month_of(start, self.zone)
        if self.month_bounds(month)[0] > start:  # a midnight that a clock change skipped
            month = _previous_month(month)
        while True:
            since, until = self.month_bounds(month)
            if since >= end:
                return
            if since >= self.pruned:
                lo = start if start > since else since
                hi = end if end < until else until
                seconds = record.gpus * (hi - lo) if hi > lo else 0.0
                if seconds > 0:
                    hours = seconds / HOUR
                    if billed is None:
                        yield month, hours, hi - lo, hours, 0.0
                    else:
                        flavor = record.flavor or NO_FLAVOR
                        yield month, hours, hi - lo, *billed(flavor, record.gpus, lo, hi)
            month = _next_month(month)

    def _add(self, record: UsageRecord, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) a closed record in each month it has
        GPU-hours in: its hours, and its measured hours if its mean was final."""
        row = None
        for month, hours, seconds, units, cost in self._months_of(record):
            if row is None:
                row = self._row(record)
            tally = self._months.get(month)
            if tally is None:
                tally = self._months[month] = _MonthTally()
            _count(tally.detail, row, sign, month, record, hours, units, cost)
            if sign > 0:
                if (record.flavor or NO_FLAVOR) in self.shared:
                    tally.final[record.uid] = None  # never measured
                else:
                    tally.unfinal.setdefault(record.group, {})[record.uid] = record
            elif record.uid in tally.final:
                busy = tally.final.pop(record.uid)
                if busy is not None:
                    _count(tally.measured, row, -1, month, record, hours, busy_hours(hours, busy))
                watts = tally.watts.pop(record.uid, None)
                if watts is not None:
                    _count(tally.energy, row, -1, month, record, hours, kwh(watts, seconds))
            else:
                _pop(tally.unfinal, record.group, record.uid)
            if not tally.detail:
                del self._months[month]

    def _row(self, record: UsageRecord) -> Row:
        row = (record.group, record.user, record.flavor or NO_FLAVOR)
        return self._rows.setdefault(row, row)  # one tuple per row, kept

    # ---- utilisation ------------------------------------------------------------------

    def unmeasured(
        self, month: str, now: float, groups: Collection[str] | None = None
    ) -> list[UsageRecord]:
        """The records of ``month`` up to ``now`` (of ``groups`` only; None: all) whose
        session's utilisation ``showback`` still needs: the open ones, and the closed
        ones whose mean is not final; none of a shared flavor. Every record when the
        clock went back (``showback`` then sums every record). ``showback.sessions_of``
        makes their sessions (a month's are many: on a thread)."""
        since, until = self.month_bounds(month)
        if min(until, now) <= since:
            return []
        if now < self.settled:
            indexes = [self._closed_by_group(), self._open_by_group]
        else:
            self._settle(now)
            tally = self._months.get(month)
            indexes = [tally.unfinal if tally is not None else {}, self._open_by_group]
        shared = self.shared
        return [
            r
            for index in indexes
            for owned in (index.values() if groups is None else _owned(index, groups))
            for r in owned.values()
            if not shared or (r.flavor or NO_FLAVOR) not in shared
        ]

    def _closed_by_group(self) -> dict[str, dict[str, UsageRecord]]:
        found: dict[str, dict[str, UsageRecord]] = {}
        for r in self._closed.values():
            found.setdefault(r.group, {})[r.uid] = r
        return found

    def finalise(
        self,
        month: str,
        means: Iterable[tuple[str, float | None, float]],
        power: Mapping[str, float] | None = None,
    ) -> None:
        """These closed sessions' mean utilisation in ``month`` is final (their pods'
        days there all read for good): (uid, percent or None without samples, the end
        the mean was worked out to); so is their mean power, where ``power`` has one
        (watts, by uid). Their measured hours and energy are summed from now on; an
        open record's mean is not final, nor one whose record has ended otherwise since
        (both passed over). A month's worth at a time after a restart: one loop."""
        tally = self._months.get(month)
        if tally is None:
            return
        since, until = self.month_bounds(month)
        closed, unfinal, final = self._closed.get, tally.unfinal, tally.final
        watts_of = power.get if power else None
        added: dict[Row, list[float]] = {}
        used: dict[Row, list[float]] = {}
        for uid, busy, ended in means:
            record = closed(uid)
            if record is None or record.ended != ended:
                continue
            owned = unfinal.get(record.group)
            if owned is None or owned.pop(uid, None) is None:
                continue  # final already, or no GPU-hours in that month
            if not owned:
                del unfinal[record.group]
            final[uid] = busy
            row = (record.group, record.user, record.flavor or NO_FLAVOR)
            watts = watts_of(uid) if watts_of is not None else None
            if watts is not None and row[2] in self.unmetered:
                watts = None
            if busy is None and watts is None:
                continue
            span = _closed_span(record, since, until)
            assert span is not None  # it was summed into the month
            hours, seconds = span
            if busy is not None:
                _gather(added, row, hours, busy_hours(hours, busy))
            if watts is not None:
                tally.watts[uid] = watts
                _gather(used, row, hours, kwh(watts, seconds))
        for index, gathered in ((tally.measured, added), (tally.energy, used)):
            for row, (hours, amount, count) in gathered.items():
                row = self._rows.setdefault(row, row)
                entries = index.setdefault(row[0], {})
                entry = entries.get(row)
                if entry is None:
                    entries[row] = [hours, amount, count]
                else:
                    entry[0] += hours
                    entry[1] += amount
                    entry[2] += count

    # ---- answers ----------------------------------------------------------------------

    def showback(
        self,
        month: str,
        now: float,
        running: Container[str] = (),
        utilisation: Mapping[str, float] | None = None,
        groups: Collection[str] | None = None,
        power: Mapping[str, float] | None = None,
    ) -> Showback:
        """``showback`` of the records put, for ``month`` up to ``now``, of ``groups``
        only (None: all; a parent's children are not implied): the final sessions
        measured with their means, the others with ``utilisation`` and ``power`` (each
        session's mean, by uid: ``showback``'s), except a session of a shared flavor
        (nor, for power, of an ``unmetered`` one)."""
        since, until = self.month_bounds(month)
        if since < self.pruned:
            raise ValueError(
                f"showback tally: {month} begins before the records kept; "
                "sum it from the usage database's records (showback)"
            )
        until = min(until, now)
        if until <= since:
            return Showback(since, until, {}, {}, {}, {})
        if now < self.settled:
            # the clock went back: some records summed end after now, and count up to
            # now only; every record is summed, as showback does
            return self._summed(since, until, now, running, utilisation, groups, power)
        self._settle(now)
        tally = self._months.get(month)
        detail: dict[Row, float] = {}
        units: dict[Row, float] = {}
        cost: dict[Row, float] = {}
        measured: dict[Row, float] = {}
        utilised: dict[Row, float] = {}
        metered: dict[Row, float] = {}
        energy: dict[Row, float] = {}
        final: Container[str] = ()
        priced = self.billing.priced
        if tally is not None:
            final = tally.final
            index = tally.detail
            for entries in index.values() if groups is None else _owned(index, groups):
                for row, entry in entries.items():
                    detail[row], units[row] = entry[0], entry[1]
                    if priced(row[2]):
                        cost[row] = entry[2]
            for index, hours_of, amount_of in (
                (tally.measured, measured, utilised),
                (tally.energy, metered, energy),
            ):
                for entries in index.values() if groups is None else _owned(index, groups):
                    for row, entry in entries.items():
                        hours_of[row], amount_of[row] = entry[0], entry[1]
        # the open records (the running servers, a few thousand at most): ``showback``
        # of them, their sessions measured with their means as given
        opens = [
            r
            for owned in (
                self._open_by_group.values()
                if groups is None
                else _owned(self._open_by_group, groups)
            )
            for r in owned.values()
        ]
        busy_open = {
            r.uid: utilisation[r.uid]
            for r in opens
            if utilisation and r.uid in utilisation and (r.flavor or NO_FLAVOR) not in self.shared
        }
        watts_open = {r.uid: power[r.uid] for r in opens if power and r.uid in power}
        running_part = showback(
            opens, since, until, now, running, busy_open, self.billing, watts_open, self.unmetered
        )
        for into, part in (
            (detail, running_part.detail),
            (units, running_part.units),
            (cost, running_part.cost),
            (measured, running_part.measured),
            (utilised, running_part.utilised),
            (metered, running_part.metered),
            (energy, running_part.energy),
        ):
            for row, hours in part.items():
                into[row] = into.get(row, 0.0) + hours
        # the closed sessions not final: their means as given
        month_until = self.month_bounds(month)[1]
        closed = self._closed
        busy_of, watts_of = utilisation or {}, power or {}
        for uid in dict.fromkeys([*busy_of, *watts_of]):
            r = closed.get(uid)
            if r is None or uid in final or (groups is not None and r.group not in groups):
                continue
            row = self._row(r)
            span = _closed_span(r, since, month_until)
            if span is None:
                continue
            busy, watts = busy_of.get(uid), watts_of.get(uid)
            if busy is not None and row[2] not in self.shared:
                measured[row] = measured.get(row, 0.0) + span[0]
                utilised[row] = utilised.get(row, 0.0) + busy_hours(span[0], busy)
            if watts is not None and row[2] not in self.unmetered:
                metered[row] = metered.get(row, 0.0) + span[0]
                energy[row] = energy.get(row, 0.0) + kwh(watts, span[1])
        return showback_of(since, until, detail, measured, utilised, units, cost, metered, energy)

    def _summed(
        self,
        since: float,
        until: float,
        now: float,
        running: Container[str],
        utilisation: Mapping[str, float] | None,
        groups: Container[str] | None,
        power: Mapping[str, float] | None,
    ) -> Showback:
        records = [
            r
            for r in (*self._closed.values(), *self._open.values())
            if groups is None or r.group in groups
        ]
        if utilisation and self.shared:
            # the sessions that held a shared flavor
            sharing = {r.uid for r in records if (r.flavor or NO_FLAVOR) in self.shared}
            utilisation = {k: v for k, v in utilisation.items() if k not in sharing}
        return showback(
            records, since, until, now, running, utilisation, self.billing, power, self.unmetered
        )


def _count(
    index: dict[str, dict[Row, list]],
    row: Row,
    sign: int,
    month: str,
    record: UsageRecord,
    *amounts: float,
) -> None:
    """Add (``sign`` 1) or take away (-1) ``amounts`` in ``index``'s entry for ``row``
    (``[*amounts, count]``), the entry gone once its count is 0."""
    entries = index.get(row[0])
    if entries is None:
        entries = index[row[0]] = {}
    entry = entries.get(row)
    if entry is None:
        if sign < 0:
            # what is taken away was added, by the same arithmetic: only a record
            # changed in place after it was summed can break this
            raise AssertionError(
                f"showback tally: {row} has no GPU-hours in {month} to take away for "
                f"{record.uid}; was a closed record changed in place after it was put?"
            )
        entries[row] = [*amounts, 1]
    elif entry[-1] + sign == 0:
        del entries[row]
        if not entries:
            del index[row[0]]
    else:
        for i, amount in enumerate(amounts):
            entry[i] += amount * sign
        entry[-1] += sign


def _pop(index: dict[str, dict[str, UsageRecord]], group: str, uid: str) -> UsageRecord | None:
    owned = index.get(group)
    found = owned.pop(uid, None) if owned is not None else None
    if owned is not None and not owned:
        del index[group]
    return found


def _closed_span(record: UsageRecord, since: float, until: float) -> tuple[float, float] | None:
    """A closed record's GPU-hours from ``since`` to ``until`` and its seconds there
    (``showback``'s arithmetic, step for step); None for no GPU-hours."""
    end, start = record.ended, record.started
    assert end is not None
    lo = start if start > since else since
    hi = end if end < until else until
    seconds = record.gpus * (hi - lo) if hi > lo else 0.0
    return (seconds / HOUR, hi - lo) if seconds > 0 else None


def _gather(into: dict[Row, list[float]], row: Row, hours: float, amount: float) -> None:
    """Add a session's hours and amount (utilised hours, kWh) to its row's ``[hours,
    amount, sessions]``."""
    entry = into.get(row)
    if entry is None:
        entry = into[row] = [0.0, 0.0, 0]
    entry[0] += hours
    entry[1] += amount
    entry[2] += 1


def _owned(index: dict[str, dict], groups: Collection[str]) -> list[dict]:
    """The entries of ``groups`` in an index by group."""
    return [index[group] for group in groups if group in index]
