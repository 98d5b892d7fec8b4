"""GPU time looked back on: use over time, and GPU-hours per group, user and flavor.

``history`` gives a group's GPU-equivalents in use over time, stacked by flavor
(each point is the average over its step, so no short server falls between two
points); ``showback`` sums GPU-hours for a month by group, by user and by flavor.
Both read usage records (``budgets.UsageRecord``). Pure: no I/O; epoch seconds.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Collection, Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo

from .usage import HOUR, UsageRecord, open_end, used_seconds
from .utilisation import Coverage

_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")
#: the most points one history answer has (a year at one-hour steps is 8,760)
MAX_POINTS = 10_000
#: the longest range one history request reads (a year and a day)
MAX_HISTORY_SECONDS = 366 * 86400
NO_FLAVOR = "(none)"


class ShowbackError(ValueError):
    """A bad request: its text says what to send instead."""


def month_bounds(month: str, zone: tzinfo = UTC) -> tuple[float, float]:
    """``2026-11`` -> (start, end) of that month in the billing time zone ``zone``, as
    epoch seconds: from its first midnight to the next month's (a month with a daylight
    saving change is an hour shorter or longer)."""
    match = _MONTH.match(month or "")
    if not match:
        raise ShowbackError(f"month: expected YYYY-MM, such as 2026-11, got {month[:20]!r}")
    year, number = int(match.group(1)), int(match.group(2))
    start = datetime(year, number, 1, tzinfo=zone)
    end = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=zone)
    return start.timestamp(), end.timestamp()


def month_of(epoch: float, zone: tzinfo = UTC) -> str:
    """The ``YYYY-MM`` a moment falls in, in the billing time zone."""
    return datetime.fromtimestamp(epoch, zone).strftime("%Y-%m")


@dataclass(frozen=True)
class Series:
    """GPU-equivalents in use per step, per flavor: ``values[flavor][i]`` for ``times[i]``."""

    times: list[float]
    step: float
    values: dict[str, list[float]]

    def to_json(self) -> dict:
        return {
            "from": self.times[0] if self.times else None,
            "step_seconds": self.step,
            "times": self.times,
            "flavors": {f: [round(v, 4) for v in vs] for f, vs in sorted(self.values.items())},
        }


def check_history(since: float, until: float, step: float) -> int:
    """The number of points of a history from ``since`` to ``until`` in ``step``s, or a
    ``ShowbackError`` saying what to ask instead: checked before any record is read."""
    if step <= 0 or until <= since:
        raise ShowbackError("step must be positive and from before to")
    if until - since > MAX_HISTORY_SECONDS:
        raise ShowbackError(
            f"at most {MAX_HISTORY_SECONDS // 86400} days of history at once: "
            "ask for a later from, or several ranges"
        )
    count = int((until - since + step - 1) // step)
    if count > MAX_POINTS:
        raise ShowbackError(
            f"{count} points asked for; at most {MAX_POINTS}: use a larger step or a shorter range"
        )
    return count


def history(
    records: Iterable[UsageRecord],
    since: float,
    until: float,
    step: float,
    now: float,
    running: Container[str] = (),
) -> Series:
    """GPU-equivalents in use from ``since`` to ``until`` in steps of ``step`` seconds,
    each the average over its step, stacked by flavor."""
    count = check_history(since, until, step)
    times = [since + i * step for i in range(count)]
    values: dict[str, list[float]] = defaultdict(lambda: [0.0] * count)
    for record in records:
        start = max(record.started, since)
        end = min(record.end(now, running), until)
        if end <= start:
            continue
        series = values[record.flavor or NO_FLAVOR]
        first, last = int((start - since) // step), int((end - since - 1e-9) // step)
        for i in range(first, min(last, count - 1) + 1):
            lo, hi = times[i], times[i] + step
            overlap = min(end, hi) - max(start, lo)
            if overlap > 0:
                series[i] += record.gpus * overlap / step
    return Series(times=times, step=step, values=dict(values))


@dataclass(frozen=True)
class Showback:
    since: float
    until: float
    groups: dict[str, float]  # GPU-hours
    users: dict[tuple[str, str], float]  # (group, user)
    flavors: dict[tuple[str, str], float]  # (group, flavor)
    detail: dict[tuple[str, str, str], float]  # (group, user, flavor)
    #: of ``detail``, the GPU-hours of servers whose utilisation was measured, and how
    #: many of those GPU-hours the GPUs were busy (allocated x mean utilisation)
    measured: dict[tuple[str, str, str], float] = field(default_factory=dict)
    utilised: dict[tuple[str, str, str], float] = field(default_factory=dict)
    #: which part of the range the utilisation covers (None: none was read)
    coverage: Coverage | None = None


def showback(
    records: Iterable[UsageRecord],
    since: float,
    until: float,
    now: float,
    running: Container[str] = (),
    utilisation: Mapping[str, float] | None = None,
) -> Showback:
    """GPU-hours used from ``since`` to ``until`` by group, by user and by flavor.

    ``utilisation``: each measured server's mean GPU utilisation (percent) in the
    range, by its key; those servers' hours are also counted as measured, and
    as utilised in proportion."""
    measured: dict[tuple[str, str, str], float] = {}
    utilised: dict[tuple[str, str, str], float] = {}
    detail: dict[tuple[str, str, str], float] = {}
    # ``budgets.used_seconds`` inlined, and each record's key made once: this loop runs
    # over every record of the month (~155,000 at 5,000 servers), where a call and
    # repeated lookups per record were most of the time. The arithmetic is the same,
    # in the same order, so the sums are the same to the last bit.
    get = detail.get
    busy_of = utilisation.get if utilisation else None
    for r in records:
        end = r.ended
        if end is None:
            end = open_end(r, now, running)
        if end > until:
            end = until
        start = r.started
        if start < since:
            start = since
        if end <= start:
            continue
        seconds = r.gpus * (end - start)
        if seconds <= 0:
            continue
        key = (r.group, r.user, r.flavor or NO_FLAVOR)
        hours = seconds / HOUR
        detail[key] = get(key, 0.0) + hours
        if busy_of is not None:
            busy = busy_of(r.key)
            if busy is not None:
                measured[key] = measured.get(key, 0.0) + hours
                utilised[key] = utilised.get(key, 0.0) + hours * min(max(busy, 0.0), 100.0) / 100
    groups: dict[str, float] = defaultdict(float)
    users: dict[tuple[str, str], float] = defaultdict(float)
    flavors: dict[tuple[str, str], float] = defaultdict(float)
    for (group, user, flavor), hours in detail.items():
        groups[group] += hours
        users[(group, user)] += hours
        flavors[(group, flavor)] += hours
    return Showback(
        since, until, dict(groups), dict(users), dict(flavors), dict(detail), measured, utilised
    )


def _next_month(month: str) -> str:
    year, number = int(month[:4]), int(month[5:7])
    return f"{year + number // 12:04d}-{number % 12 + 1:02d}"


def _previous_month(month: str) -> str:
    year, number = int(month[:4]), int(month[5:7])
    return f"{year - 1:04d}-12" if number == 1 else f"{year:04d}-{number - 1:02d}"


@dataclass(slots=True)
class _MonthTally:
    """The GPU-hours of the closed records of one billing month, each entry
    ``[hours, records]`` (the count says when an entry is empty again, whatever the
    rounding of adding and taking away left)."""

    #: by group, then (group, user, flavor): a member's answer reads its groups' only
    detail: dict[str, dict[tuple[str, str, str], list]] = field(default_factory=dict)
    #: the same by server (``UsageRecord.key``), for its utilisation: a flat list
    #: ``[key, hours, records, key, ...]``, one key in most (a list, not a dict, per
    #: server and month: a year of them at 5,000 servers is a million)
    pods: dict[str, list] = field(default_factory=dict)


class ShowbackTally:
    """``showback`` kept up to date as records change, instead of summed over every
    record at each request.

    A closed record's GPU-hours are added to each billing month it overlaps (split at
    the months' bounds in ``zone`` exactly as ``showback`` cuts them) when it is put,
    and taken away again when it is put anew (an inferred end reopened, or changed)
    or pruned. Open records, and closed ones ending after the latest ``now`` seen
    (a clock ahead of this one), are summed at each request: the work of a request
    is bounded by the running servers and the month's rows, not by all records.

    The answer is ``showback`` over the records put (the same per-record GPU-hours;
    the sums may differ in the last bits, being added in another order). A record put
    must not be changed in place once it is closed: put a new one with its uid
    (``UsageBook`` only ever ends an open record in place; such a record is summed
    at the next request that sees it ended).
    """

    def __init__(self, zone: tzinfo = UTC) -> None:
        self.zone = zone
        self._months: dict[str, _MonthTally] = {}
        self._bounds: dict[str, tuple[float, float]] = {}
        self._keys: dict[tuple[str, str, str], tuple[str, str, str]] = {}
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

    def put(self, record: UsageRecord, now: float) -> None:
        """Add a record as known at ``now``, or replace the one with its uid."""
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

    def _add(self, record: UsageRecord, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) a closed record's GPU-hours in each month
        it overlaps: the arithmetic of ``showback``, step for step, so the hours added
        are the hours taken away, and those ``showback`` adds."""
        end = record.ended
        start = record.started
        if end is None or not end > start:
            return
        month = month_of(start, self.zone)
        if self.month_bounds(month)[0] > start:  # a midnight that a clock change skipped
            month = _previous_month(month)
        key = None
        while True:
            since, until = self.month_bounds(month)
            if since >= end:
                return
            if since >= self.pruned:
                lo = start if start > since else since
                hi = end if end < until else until
                seconds = record.gpus * (hi - lo) if hi > lo else 0.0
                if seconds > 0:
                    if key is None:
                        key = (record.group, record.user, record.flavor or NO_FLAVOR)
                        key = self._keys.setdefault(key, key)  # one tuple per row, kept
                    self._count(month, record.key, key, seconds / HOUR, sign)
            month = _next_month(month)

    def _count(
        self, month: str, pod: str, key: tuple[str, str, str], hours: float, sign: int
    ) -> None:
        tally = self._months.get(month)
        if tally is None:
            tally = self._months[month] = _MonthTally()
        detail = tally.detail.get(key[0])
        if detail is None:
            detail = tally.detail[key[0]] = {}
        entry = detail.get(key)
        if entry is None:
            self._missing(sign, month, pod, key)
            detail[key] = [hours, 1]
        elif entry[1] + sign == 0:
            del detail[key]
            if not detail:
                del tally.detail[key[0]]
                if not tally.detail:
                    del self._months[month]
        else:
            entry[0] += hours * sign
            entry[1] += sign
        slots = tally.pods.get(pod)
        if slots is None:
            self._missing(sign, month, pod, key)
            tally.pods[pod] = [key, hours, 1]
            return
        for i in range(0, len(slots), 3):
            if slots[i] == key:
                if slots[i + 2] + sign == 0:
                    del slots[i : i + 3]
                    if not slots:
                        del tally.pods[pod]
                else:
                    slots[i + 1] += hours * sign
                    slots[i + 2] += sign
                return
        self._missing(sign, month, pod, key)
        slots.extend((key, hours, 1))

    @staticmethod
    def _missing(sign: int, month: str, pod: str, key: tuple[str, str, str]) -> None:
        if sign < 0:
            # what is taken away was added, by the same arithmetic: only a record
            # changed in place after it was summed can break this
            raise AssertionError(
                f"showback tally: {key} has no GPU-hours in {month} to take away for "
                f"{pod}; was a closed record changed in place after it was put?"
            )

    def showback(
        self,
        month: str,
        now: float,
        running: Container[str] = (),
        utilisation: Mapping[str, float] | None = None,
        groups: Collection[str] | None = None,
        shared: Container[str] = (),
    ) -> Showback:
        """``showback`` of the records put, for ``month`` up to ``now``, of ``groups``
        only (None: all; a parent's children are not implied), with each measured
        server's utilisation (``showback``'s) except a server's that held a ``shared``
        flavor in the month (its GPU's utilisation is every sharer's)."""
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
            return self._summed(since, until, now, running, utilisation, groups, shared)
        self._settle(now)
        tally = self._months.get(month)
        detail: dict[tuple[str, str, str], float] = {}
        if tally is not None:
            for entries in (
                tally.detail.values() if groups is None else _owned(tally.detail, groups)
            ):
                for key, entry in entries.items():
                    detail[key] = entry[0]
        # the open records: showback's loop, over them only
        get = detail.get
        opened: dict[str, list[tuple[tuple[str, str, str], float]]] = {}
        opens = self._open_by_group
        for owned in opens.values() if groups is None else _owned(opens, groups):
            for r in owned.values():
                end = r.ended
                if end is None:
                    end = open_end(r, now, running)
                if end > until:
                    end = until
                start = r.started
                if start < since:
                    start = since
                if end <= start:
                    continue
                seconds = r.gpus * (end - start)
                if seconds <= 0:
                    continue
                key = (r.group, r.user, r.flavor or NO_FLAVOR)
                hours = seconds / HOUR
                detail[key] = get(key, 0.0) + hours
                if utilisation:
                    opened.setdefault(r.key, []).append((key, hours))
        measured: dict[tuple[str, str, str], float] = {}
        utilised: dict[tuple[str, str, str], float] = {}
        pods = tally.pods if tally is not None else {}
        for pod, busy in (utilisation or {}).items():
            slots = pods.get(pod)
            entries = opened.get(pod, [])
            if slots:
                entries = [
                    (slots[i], slots[i + 1])
                    for i in range(0, len(slots), 3)
                    if groups is None or slots[i][0] in groups
                ] + entries
            if not entries or any(key[2] in shared for key, _ in entries):
                continue
            for key, hours in entries:
                measured[key] = measured.get(key, 0.0) + hours
                utilised[key] = utilised.get(key, 0.0) + hours * min(max(busy, 0.0), 100.0) / 100
        return _totals(since, until, detail, measured, utilised)

    def _summed(
        self,
        since: float,
        until: float,
        now: float,
        running: Container[str],
        utilisation: Mapping[str, float] | None,
        groups: Container[str] | None,
        shared: Container[str],
    ) -> Showback:
        records = [
            r
            for r in (*self._closed.values(), *self._open.values())
            if groups is None or r.group in groups
        ]
        if utilisation and shared:
            # the servers that held a shared flavor for some of the month
            sharing = {
                r.key
                for r in records
                if (r.flavor or NO_FLAVOR) in shared
                and used_seconds(r, since, until, now, running) > 0
            }
            utilisation = {k: v for k, v in utilisation.items() if k not in sharing}
        return showback(records, since, until, now, running, utilisation)


def _owned(index: dict[str, dict], groups: Collection[str]) -> list[dict]:
    """The entries of ``groups`` in an index by group."""
    return [index[group] for group in groups if group in index]


def _totals(
    since: float,
    until: float,
    detail: dict[tuple[str, str, str], float],
    measured: dict[tuple[str, str, str], float],
    utilised: dict[tuple[str, str, str], float],
) -> Showback:
    groups: dict[str, float] = defaultdict(float)
    users: dict[tuple[str, str], float] = defaultdict(float)
    flavors: dict[tuple[str, str], float] = defaultdict(float)
    for (group, user, flavor), hours in detail.items():
        groups[group] += hours
        users[(group, user)] += hours
        flavors[(group, flavor)] += hours
    return Showback(
        since, until, dict(groups), dict(users), dict(flavors), detail, measured, utilised
    )
