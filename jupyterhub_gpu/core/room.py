"""When room returns to a budget: what a set of records counts in a window opening at
any moment, and the first moment a window has room again.

``UsageAfter`` sums the records' spans from the latest back once, so what any window
of them counts is two bisections; ``first_room`` bisects the records' ends for the
first moment with room. ``Room`` is what the usage book keeps of one owner's records
between calls. Pure: no I/O; times are epoch seconds.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from itertools import accumulate, chain
from operator import le, mul, neg, sub

from .model import Budget
from .usage import HOUR, UsageRecord


class UsageAfter:
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
    def of(cls, spans: Iterable[tuple[float, float, float]]) -> UsageAfter:
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


def first_room(parts: list[UsageAfter], budget: Budget, now: float) -> tuple[float, float] | None:
    """``room_returns`` over the spans of ``parts`` (together): the first moment, an
    end + the period, with room in the budget, rounded up to the minute, and the room."""
    period = float(budget.period)
    cap = budget.amount
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
class Room:
    """What ``UsageBook.used`` and ``room_returns`` keep of one owner's records between
    calls: the closed records of when it was made, summed up once; the records closed
    since; the open ones (whose end moves with the clock while they run), looked at
    each time."""

    closed: UsageAfter
    #: how many records of the owner it accounts for (a check that none went unseen)
    size: int
    open: dict[str, UsageRecord]
    added: list[UsageRecord] = field(default_factory=list)
    added_after: UsageAfter | None = None
    #: the latest end of the owner's records pruned since: they must not count
    dropped: float = -math.inf

    @classmethod
    def of(cls, records: Collection[UsageRecord]) -> Room:
        closed = [r for r in records if r.ended is not None]
        opened = {r.uid: r for r in records if r.ended is None}
        ends = [r.end(0.0) for r in closed]
        usage = UsageAfter([r.started for r in closed], ends, [r.gpus for r in closed])
        return cls(usage, len(closed) + len(opened), opened)

    def closes(self, record: UsageRecord) -> None:
        """An open record of the owner has ended."""
        if self.open.pop(record.uid, None) is not None:
            self.added.append(record)
            self.added_after = None
