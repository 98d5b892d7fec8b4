"""GPU time looked back on: use over time, and GPU-hours per group, user and flavor.

``history`` gives a group's GPU-equivalents in use over time, stacked by flavor
(each point is the average over its step, so no short server falls between two
points); ``showback`` sums GPU-hours for a month by group, by user and by flavor
(``showback_tally`` keeps the same sums as records change). Both read usage
records (``usage.UsageRecord``). Pure: no I/O; epoch seconds.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING

from .energy import kwh
from .usage import HOUR, UsageRecord, open_end
from .utilisation import Coverage, Session

if TYPE_CHECKING:
    from .billing import Billing

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
    #: of ``detail``, the billed units (every row) and the cost (the rows of priced
    #: flavors only), each hour at the rate in force then (``billing``)
    units: dict[tuple[str, str, str], float] = field(default_factory=dict)
    cost: dict[tuple[str, str, str], float] = field(default_factory=dict)
    #: of ``detail``, the GPU-hours of servers whose GPUs' power was measured (those
    #: holding whole GPUs: ``energy.holds_whole_devices``), and the kilowatt-hours they
    #: used (each server's mean power, its GPUs' together, times its time in the range)
    metered: dict[tuple[str, str, str], float] = field(default_factory=dict)
    energy: dict[tuple[str, str, str], float] = field(default_factory=dict)


def showback(
    records: Iterable[UsageRecord],
    since: float,
    until: float,
    now: float,
    running: Container[str] = (),
    utilisation: Mapping[str, float] | None = None,
    billing: Billing | None = None,
    power: Mapping[str, float] | None = None,
    unmetered: Container[str] = (),
) -> Showback:
    """GPU-hours used from ``since`` to ``until`` by group, by user and by flavor.

    ``utilisation``: each measured session's mean GPU utilisation (percent) in the
    range, by its record's uid (one pod's life: two pods of one name, one after the
    other, are two sessions); those sessions' hours are also counted as measured,
    and as utilised in proportion. ``billing``: the rates the hours are billed at
    (None: a unit per GPU-hour, no price). ``power``: each measured session's mean
    power in the range (watts, its GPUs' together), by uid: its hours are metered
    and its energy is that power over its time, except for a session of an
    ``unmetered`` flavor (a shared device's power is all its users')."""
    measured: dict[tuple[str, str, str], float] = {}
    utilised: dict[tuple[str, str, str], float] = {}
    detail: dict[tuple[str, str, str], float] = {}
    units: dict[tuple[str, str, str], float] = {}
    cost: dict[tuple[str, str, str], float] = {}
    metered: dict[tuple[str, str, str], float] = {}
    energy: dict[tuple[str, str, str], float] = {}
    billed = billing.billed if billing is not None and billing.rates else None
    # ``budgets.used_seconds`` inlined, and each record's key made once: this loop runs
    # over every record of the month (~155,000 at 5,000 servers), where a call and
    # repeated lookups per record were most of the time. The arithmetic is the same,
    # in the same order, so the sums are the same to the last bit.
    get = detail.get
    busy_of = utilisation.get if utilisation else None
    power_of = power.get if power else None
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
        if billed is not None:
            bill, price = billed(key[2], r.gpus, start, end)
            units[key] = units.get(key, 0.0) + bill
            if billing.priced(key[2]):  # type: ignore[union-attr]
                cost[key] = cost.get(key, 0.0) + price
        if busy_of is not None:
            busy = busy_of(r.uid)
            if busy is not None:
                measured[key] = measured.get(key, 0.0) + hours
                utilised[key] = utilised.get(key, 0.0) + busy_hours(hours, busy)
        if power_of is not None:
            watts = power_of(r.uid)
            if watts is not None and key[2] not in unmetered:
                metered[key] = metered.get(key, 0.0) + hours
                energy[key] = energy.get(key, 0.0) + kwh(watts, end - start)
    return showback_of(
        since,
        until,
        detail,
        measured,
        utilised,
        units if billed else None,
        cost,
        metered,
        energy,
    )


def busy_hours(hours: float, busy: float) -> float:
    """The GPU-hours a session's ``hours`` were busy at its mean utilisation ``busy``
    (percent, taken within 0-100)."""
    return hours * min(max(busy, 0.0), 100.0) / 100


def sessions_of(
    records: Iterable[UsageRecord],
    since: float,
    until: float,
    now: float,
    running: Container[str] = (),
    shared: Container[str] = (),
) -> dict[str, Session]:
    """The sessions whose utilisation ``showback`` uses from ``since`` to ``until``, by
    their record's uid: each pod's key, start and end (as known at ``now``); none
    that held a ``shared`` flavor (a shared GPU's utilisation is every sharer's) or
    no GPUs."""
    found: dict[str, Session] = {}
    for r in records:
        if r.gpus <= 0 or (r.flavor or NO_FLAVOR) in shared:
            continue
        end = r.end(now, running)
        if min(end, until) > max(r.started, since):
            found[r.uid] = (r.key, r.started, end)
    return found


def showback_of(
    since: float,
    until: float,
    detail: dict[tuple[str, str, str], float],
    measured: dict[tuple[str, str, str], float],
    utilised: dict[tuple[str, str, str], float],
    units: dict[tuple[str, str, str], float] | None = None,
    cost: dict[tuple[str, str, str], float] | None = None,
    metered: dict[tuple[str, str, str], float] | None = None,
    energy: dict[tuple[str, str, str], float] | None = None,
) -> Showback:
    """The showback of GPU-hours by (group, user, flavor): with each group's, user's and
    flavor's totals; ``units`` None: a unit per GPU-hour."""
    groups: dict[str, float] = defaultdict(float)
    users: dict[tuple[str, str], float] = defaultdict(float)
    flavors: dict[tuple[str, str], float] = defaultdict(float)
    for (group, user, flavor), hours in detail.items():
        groups[group] += hours
        users[(group, user)] += hours
        flavors[(group, flavor)] += hours
    return Showback(
        since,
        until,
        dict(groups),
        dict(users),
        dict(flavors),
        detail,
        measured,
        utilised,
        units=dict(detail) if units is None else units,
        cost=cost or {},
        metered=metered or {},
        energy=energy or {},
    )


def of_groups(result: Showback, groups: Container[str]) -> Showback:
    """``result``'s rows of ``groups`` alone, with their totals: the showback of those
    groups' records (each row's hours are its records', whatever other groups there
    are; the rows are taken in their order, so the totals are added in the same order)."""
    detail = {k: v for k, v in result.detail.items() if k[0] in groups}
    measured = {k: v for k, v in result.measured.items() if k[0] in groups}
    utilised = {k: v for k, v in result.utilised.items() if k[0] in groups}
    units = {k: v for k, v in result.units.items() if k[0] in groups}
    cost = {k: v for k, v in result.cost.items() if k[0] in groups}
    metered = {k: v for k, v in result.metered.items() if k[0] in groups}
    energy = {k: v for k, v in result.energy.items() if k[0] in groups}
    part = showback_of(
        result.since, result.until, detail, measured, utilised, units, cost, metered, energy
    )
    return replace(part, coverage=result.coverage)
