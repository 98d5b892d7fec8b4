"""GPU utilisation over a showback month, read in chunks that are kept once finished.

A month's "utilised" GPU-hours need each server pod's mean GPU utilisation over
the month. One query over the whole month reads every sample of every GPU (above
Prometheus' default sample limit at a few hundred GPUs) and says nothing when
Prometheus no longer holds part of the month. So the month is cut into chunks
(days in the billing time zone), each read once it is over and kept: a finished
chunk never changes. Only the chunk under way is read again, at most every
``refresh`` seconds, and at most ``max_reads`` finished chunks are read per call,
so a call costs the same on the 2nd and on the 30th of the month.

Each chunk keeps, per pod and metric, the sum and the count of its samples, so the
month's mean is the same as one query over the month would give; and for how many
seconds any DCGM series had samples, so what Prometheus does not hold (retention,
an exporter down) is reported as missing instead of silently under-reported.

The GPUs' power, for showback's energy, is read in the same chunks: a reading holds
every metric's sums and counts, and ``Chunks.means`` works out each figure (the
utilisation, the power) from them in one pass.

Pure: no I/O; epoch seconds. The adapter (``service/utilisation.py``) asks
``Chunks.wanted`` what to read, reads it, and hands it back with ``Chunks.put``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo

DAY = 86400.0

#: one pod's life: its ``<namespace>/<pod>`` key (what Prometheus names it by), its
#: start and its end (epoch seconds)
Session = tuple[str, float, float]


def chunk_edges(
    since: float, until: float, zone: tzinfo, length: float | None = None
) -> list[float]:
    """The chunk boundaries from ``since`` to ``until`` (both included): midnights in
    ``zone`` (a day with a daylight saving change is 23 or 25 hours long), or, with
    ``length``, multiples of it from the epoch (the same edges for every caller)."""
    if until <= since:
        return []
    edges = [since]
    if length is not None:
        edge = (since // length + 1) * length
        while edge < until:
            edges.append(edge)
            edge += length
    else:
        day = datetime.fromtimestamp(since, zone).date()
        while True:
            day += timedelta(days=1)
            edge = datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()
            if edge >= until:
                break
            edges.append(edge)
    edges.append(until)
    return edges


def step_for(seconds: float) -> int:
    """The resolution a chunk's coverage is measured at: a minute, finer for short chunks."""
    return max(1, min(60, int(seconds // 20)))


@dataclass(frozen=True)
class Reading:
    """What Prometheus held for one chunk (from ``start``, exclusive, to ``until``):
    per metric, per pod key, the sum and the count of its samples, and for how many
    seconds any DCGM series had samples."""

    start: float
    until: float
    sums: Mapping[str, Mapping[str, float]]  # metric -> pod key -> sum of percents
    counts: Mapping[str, Mapping[str, float]]  # metric -> pod key -> samples
    covered: float
    read_at: float

    @property
    def missing(self) -> float:
        return max(self.until - self.start - self.covered, 0.0)


@dataclass(frozen=True)
class Coverage:
    """Which part of a span the utilisation was read for: ``covered`` seconds with
    samples, ``gaps`` (from, to) read without any, ``unread`` seconds not read yet."""

    since: float
    until: float
    covered: float
    gaps: tuple[tuple[float, float], ...] = ()
    unread: float = 0.0
    #: how far the samples reach (the chunk under way is read every ``refresh``)
    read_until: float | None = None
    #: why the rest was not read this time (Prometheus did not answer)
    error: str | None = None
    #: the sessions asked about whose every chunk has been read for good: their means
    #: will not change (a session still running is never among them: its chunk is
    #: under way)
    final: frozenset[str] = frozenset()

    @property
    def missing(self) -> float:
        return sum(b - a for a, b in self.gaps)

    @property
    def complete(self) -> bool:
        return not self.gaps and not self.unread

    def parts(self) -> list[str]:
        """What a reader of a figure from these readings must know, in words."""
        parts = []
        if self.gaps:
            parts.append(f"no data for {_days(self.missing)}")
        if self.unread:
            why = "Prometheus did not answer" if self.error else "read a few days per pass"
            parts.append(f"{_days(self.unread)} not read yet ({why})")
        return parts

    def note(self) -> str | None:
        """What a reader of the utilised figure must know, in words; None when it is
        whole."""
        parts = self.parts()
        return "utilised: " + ", ".join(parts) if parts else None


def _days(seconds: float) -> str:
    days = seconds / DAY
    if days >= 0.95:
        return f"{days:.0f} day{'s' if round(days) != 1 else ''}"
    hours = seconds / 3600
    if hours >= 0.95:
        return f"{hours:.0f} hour{'s' if round(hours) != 1 else ''}"
    return f"{max(seconds / 60, 1):.0f} min"


@dataclass
class Chunks:
    """Readings kept by chunk; what to read next; the mean over a span."""

    zone: tzinfo = UTC
    #: chunk length in seconds; None: days in ``zone``
    length: float | None = None
    #: the chunk under way is read again at most this often (seconds)
    refresh: float = 300.0
    #: a chunk is final this long after its end (the last scrapes are in by then)
    settle: float = 120.0
    #: the most finished chunks read per call (the chunk under way comes on top)
    max_reads: int = 4
    #: the most readings kept (older ones are dropped first)
    keep: int = 400
    readings: dict[tuple[float, float], Reading] = field(default_factory=dict)

    def spans(self, since: float, until: float) -> list[tuple[float, float]]:
        edges = chunk_edges(since, until, self.zone, self.length)
        return list(itertools.pairwise(edges))

    def _full(self, start: float) -> tuple[float, float]:
        """The whole chunk ``start`` begins (the last one of a span may be cut by now)."""
        edges = chunk_edges(start, start + 2 * (self.length or 2 * DAY), self.zone, self.length)
        return (edges[0], edges[1])

    def wanted(self, since: float, until: float, now: float) -> list[tuple[float, float]]:
        """The (start, end) chunks to read now for [since, until): the chunk under way
        when its reading is older than ``refresh`` (read up to ``now``), and the
        newest ``max_reads`` finished chunks not read for good."""
        finished, current = [], []
        for start, _ in self.spans(since, min(until, now)):
            full = self._full(start)
            if full[1] <= now - self.settle:
                if not self._final(full):
                    finished.append(full)
            else:
                reading = self.readings.get(full)
                if reading is None or now - reading.read_at >= self.refresh:
                    current.append((full[0], min(full[1], now)))
        return current + finished[::-1][: self.max_reads]

    def _final(self, chunk: tuple[float, float]) -> bool:
        reading = self.readings.get(chunk)
        return reading is not None and reading.until >= chunk[1]

    def put(self, reading: Reading) -> None:
        """Keep a reading of the chunk beginning at its ``start`` (its ``until`` may be
        before the chunk's end: the chunk under way, read so far)."""
        self.readings[self._full(reading.start)] = reading
        while len(self.readings) > self.keep:
            self.readings.pop(min(self.readings))

    def mean(
        self,
        since: float,
        until: float,
        metrics: Iterable[str],
        sessions: Mapping[str, Session] | None = None,
    ) -> tuple[dict[str, float], Coverage]:
        """``means`` of one figure (``metrics``, the first with samples winning)."""
        (found,), coverage = self.means(since, until, [list(metrics)], sessions)
        return found, coverage

    def means(
        self,
        since: float,
        until: float,
        figures: Sequence[Sequence[str]],
        sessions: Mapping[str, Session] | None = None,
    ) -> tuple[list[dict[str, float]], Coverage]:
        """Each pod's mean of each figure over [since, until) from the chunks read (a
        figure's metrics in order, the first with samples for a pod winning: a whole
        GPU's utilisation before a MIG slice's engine activity), and the coverage.
        Several figures from one reading (utilisation, power) are worked out in one
        pass over the sessions.

        ``sessions``: each session's mean instead (by its id, a pod's uid), from the
        chunks its own life overlaps: pods of the same name one after the other (a
        server stopped and started again, maybe in another group) never share one
        mean across the month. Two of them within one chunk share that chunk's
        samples, which Prometheus keeps by pod name only. (The pods' own means are not
        worked out then: a month has many more sessions than pods.)"""
        orders = [list(metrics) for metrics in figures]
        order = list(dict.fromkeys(m for metrics in orders for m in metrics))
        sums: dict[str, dict[str, float]] = {m: {} for m in order}
        counts: dict[str, dict[str, float]] = {m: {} for m in order}
        covered = unread = 0.0
        gaps: list[tuple[float, float]] = []
        read_until = None
        read: list[tuple[float, float, Reading]] = []
        #: every chunk's end, and how many of those up to it are not read for good
        ends: list[float] = []
        not_final = [0]
        for start, end in self.spans(since, until):
            full = self._full(start)
            reading = self.readings.get(full)
            ends.append(end)
            not_final.append(not_final[-1] + (reading is None or reading.until < full[1]))
            if reading is None:
                unread += end - start
                continue
            read.append((start, end, reading))
            read_until = max(read_until or reading.until, reading.until)
            for metric in order if sessions is None else ():
                into_s, into_c = sums[metric], counts[metric]
                for key, value in reading.sums.get(metric, {}).items():
                    into_s[key] = into_s.get(key, 0.0) + value
                for key, value in reading.counts.get(metric, {}).items():
                    into_c[key] = into_c.get(key, 0.0) + value
            covered += min(reading.covered, end - start)
            # a gap of up to two steps is the steps' alignment, not missing data
            if reading.missing > 2 * step_for(full[1] - full[0]) + 1:
                # the part without samples, where it is: a whole chunk, or its start
                # (retention ends inside it) - the reading says how much, not where
                gap = (start, min(start + reading.missing, end))
                if gaps and gaps[-1][1] == gap[0]:
                    gaps[-1] = (gaps[-1][0], gap[1])
                else:
                    gaps.append(gap)
            # the chunk under way: the time after its reading is not read yet
            if reading.until < end:
                unread += end - reading.until if end - reading.until > self.refresh * 2 else 0.0
        coverage = Coverage(since, until, covered, tuple(gaps), unread, read_until)
        if sessions is not None:
            found, final = _session_means(read, ends, not_final, sessions, orders, since, until)
            return found, replace(coverage, final=final)
        pods: list[dict[str, float]] = []
        for metrics in orders:
            pods.append({})
            for metric in reversed(metrics):
                for key, count in counts[metric].items():
                    if count > 0:
                        pods[-1][key] = sums[metric].get(key, 0.0) / count
        return pods, coverage


def _session_means(
    read: list[tuple[float, float, Reading]],
    chunk_ends: list[float],
    not_final: list[int],
    sessions: Mapping[str, Session],
    orders: list[list[str]],
    since: float,
    until: float,
) -> tuple[list[dict[str, float]], frozenset[str]]:
    """Each session's mean of each figure (its metrics in ``orders``) from the chunks
    read that its life overlaps, and the sessions whose every chunk (``chunk_ends``:
    every chunk's end, read or not; ``not_final[i]``: how many of the first ``i`` are
    not read for good) is final.

    A month at a large site has some 150,000 sessions, most within a chunk or two:
    each finds its chunks by bisection and reads a chunk's samples of its pod from
    tables made once per chunk and metric."""
    starts = [start for start, _, _ in read]
    ends = [end for _, end, _ in read]
    tables = [
        [
            [(reading.sums.get(metric) or {}, reading.counts.get(metric) or {}) for metric in order]
            for order in orders
        ]
        for _, _, reading in read
    ]
    founds: list[dict[str, float]] = [{} for _ in orders]
    final: list[str] = []
    last_chunk = len(chunk_ends)
    for sid, (key, began, ended) in sessions.items():
        lo = began if began > since else since
        hi = ended if ended < until else until
        if hi <= lo:
            continue
        # every chunk from the first that ends after the session begins to the one it
        # ends in: all read for good?
        a = bisect.bisect_right(chunk_ends, lo)
        b = min(bisect.bisect_left(chunk_ends, hi) + 1, last_chunk)
        if not_final[b] == not_final[a]:
            final.append(sid)
        # the chunks read, from the first that ends after the session begins, up to
        # the last that starts before it ends
        first = bisect.bisect_right(ends, lo)
        last = bisect.bisect_left(starts, hi)
        for f, order in enumerate(orders):
            for m in range(len(order)):
                total = count = 0.0
                for i in range(first, last):
                    table_sums, table_counts = tables[i][f][m]
                    n = table_counts.get(key)
                    if n:
                        count += n
                        total += table_sums.get(key, 0.0)
                if count > 0:
                    founds[f][sid] = total / count
                    break
    return founds, frozenset(final)
