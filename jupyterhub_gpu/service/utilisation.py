"""Reading GPU utilisation and power for showback from Prometheus, a chunk at a time.

What to read and how the month's mean and coverage follow from the chunks is
``core.utilisation`` (pure); this adapter sends one instant query per chunk to
read and hands the answer back. A chunk's query returns, per server pod and DCGM
metric, the sum and the count of its samples over the chunk (``@`` its end), and
in how many one-minute steps any DCGM series had samples at all.

Power is read the same way, as a pod's mean power, its GPUs' together: from the
total-energy counter where the exporter has it, else from the power gauge. The
counter's mean is exact, the energy between two of its samples over the time
between them (what a gauge's samples miss between scrapes is counted): per chunk,
each series' increase from the sample its first step sees to the one its last step
sees, and the time between those two samples; a pod with a series that was reset
in the chunk (a driver reloaded) is left out of it. The gauge's is the sum of a pod's
series' samples over the most samples one of them has. A session's energy is
that mean times its time (``core.energy``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

from ..core.utilisation import Chunks, Coverage, Reading, Session, step_for
from .idle import ENGINE_ACTIVE, GPU_UTIL, Prometheus, PrometheusError

log = logging.getLogger("jupyterhub_gpu.service")

#: the metrics read, the first with samples for a pod winning (a whole GPU's own
#: utilisation over a MIG slice's), and the factor that makes each a percentage
METRICS = ((GPU_UTIL, 1.0), (ENGINE_ACTIVE, 100.0))
#: dcgm-exporter's GPU power (watts) and total energy since boot (a counter, mJ)
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
#: the power metrics, the counter winning, and the factor that makes each watts (the
#: counter's increase over seconds is in mJ/s)
POWER_METRICS = ((TOTAL_ENERGY, 0.001), (POWER_USAGE, 1.0))


def _duration(seconds: float) -> str:
    # a range ends on the chunk's end and, being a millisecond short, leaves the sample
    # on the start to the chunk before (Prometheus 2 includes both ends of a range)
    return f"{max(round(seconds * 1000) - 1, 1)}ms"


def chunk_query(start: float, end: float) -> str:
    """The one query reading a chunk (``start``, ``end``]: each pod's sum and count of
    samples per metric, labelled ``part``, and the steps with any DCGM sample.

    Utilisation: the samples of all a pod's GPUs (their mean). Power (its GPUs'
    together): the energy counter's increase over its series, and the longest time
    one of them spans; the gauge's samples summed over its series, and the most
    samples one of them has."""
    window, at = _duration(end - start), f"{end:.3f}"
    step = step_for(end - start)
    parts = []

    def part(name: str, expression: str) -> None:
        parts.append(f'label_replace({expression}, "part", "{name}", "", "")')

    for metric, _ in METRICS:
        for fn in ("sum", "count"):
            series = f'{metric}{{pod!=""}}[{window}] @ {at}'
            part(f"{metric}:{fn}", f"sum by (namespace, pod) ({fn}_over_time({series}))")
    # the counter: at each step the latest sample and its time (a subquery), so the
    # increase from the first step's sample to the last's and the time between them
    # are those of two real samples; not a pod with a series reset in the chunk (its
    # other GPUs' alone would halve it)
    energy = f'{TOTAL_ENERGY}{{pod!=""}}'
    reset = f"resets({energy}[{window}] @ {at}) > 0"
    for fn, series in (("sum", energy), ("count", f"timestamp({energy})")):
        steps = f"{series}[{window}:{step}s] @ {at}"
        spread = f"max_over_time({steps}) - min_over_time({steps})"
        total = "sum" if fn == "sum" else "max"
        part(
            f"{TOTAL_ENERGY}:{fn}",
            f"{total} by (namespace, pod) ({spread}) unless on (namespace, pod) ({reset})",
        )
    power = f'{POWER_USAGE}{{pod!=""}}[{window}] @ {at}'
    part(f"{POWER_USAGE}:sum", f"sum by (namespace, pod) (sum_over_time({power}))")
    part(f"{POWER_USAGE}:count", f"max by (namespace, pod) (count_over_time({power}))")
    # a step has data when any series had a sample within two steps before it
    present = " or ".join(f"count(count_over_time({m}[{2 * step}s]))" for m, _ in METRICS)
    parts.append(
        f"label_replace(count_over_time(({present})[{window}:{step}s] @ {at}), "
        f'"part", "covered", "", "")'
    )
    return " or ".join(parts)


def parse_reading(series: list[dict], start: float, end: float, read_at: float) -> Reading:
    scale = dict(METRICS + POWER_METRICS)
    sums: dict[str, dict[str, float]] = {m: {} for m in scale}
    counts: dict[str, dict[str, float]] = {m: {} for m in scale}
    covered = 0.0
    for item in series:
        labels = item.get("metric") or {}
        value = float(item["value"][1])
        part = labels.get("part", "")
        if part == "covered":
            covered = min(value * step_for(end - start), end - start)
            continue
        metric, _, fn = part.partition(":")
        if metric not in scale:
            continue
        key = f"{labels.get('namespace')}/{labels.get('pod')}"
        if fn == "sum":
            sums[metric][key] = value * scale[metric]
        else:
            counts[metric][key] = value
    return Reading(start, end, sums, counts, covered, read_at)


@dataclass(frozen=True)
class Measured:
    """Each session's (or pod's) mean utilisation (percent) and mean power (watts, its
    GPUs' together), and which part of the range the readings cover."""

    utilisation: dict[str, float]
    power: dict[str, float]
    coverage: Coverage


class UtilisationReader:
    """The chunks read so far, and the reading of those still to read."""

    def __init__(
        self, prometheus: Prometheus, chunks: Chunks, clock: Callable[[], float] = time.time
    ) -> None:
        self.prometheus = prometheus
        self.chunks = chunks
        self.clock = clock
        #: queries sent (shown in the logs; a test counts them in Prometheus' own log)
        self.queries = 0
        # two showbacks at once read each chunk once
        self._lock = asyncio.Lock()

    async def read(
        self,
        since: float,
        until: float,
        sessions: Mapping[str, Session] | None = None,
        executor: Executor | None = None,
    ) -> tuple[dict[str, float], Coverage]:
        """Each pod's mean utilisation (percent) over [since, until) and what part of it
        the chunks read cover: ``measure``'s utilisation."""
        measured = await self.measure(since, until, sessions, executor)
        return measured.utilisation, measured.coverage

    async def measure(
        self,
        since: float,
        until: float,
        sessions: Mapping[str, Session] | None = None,
        executor: Executor | None = None,
    ) -> Measured:
        """Each pod's mean utilisation (percent) and power (watts) over [since, until)
        and what part of it the chunks read cover (``sessions``: each session's, by its
        id, over its own life: see ``Chunks.means``). Reads what ``Chunks.wanted`` asks
        for; when Prometheus fails, what was read is kept and the rest is reported as
        not read. The answers read and the means are worked out on ``executor`` (a
        day's answer names every pod that ran that day, a month's sessions are many)."""
        error = None
        async with self._lock:
            now = self.clock()
            for start, end in self.chunks.wanted(since, until, now):
                self.queries += 1
                try:
                    series = await self.prometheus.query(chunk_query(start, end))
                except PrometheusError as e:
                    log.warning("showback: GPU utilisation not read for now: %s", e)
                    error = str(e)
                    break
                reading = await asyncio.get_running_loop().run_in_executor(
                    executor, parse_reading, series, start, end, now
                )
                self.chunks.put(reading)
            figures = [[m for m, _ in METRICS], [m for m, _ in POWER_METRICS]]
            if sessions:
                # under the lock: no reading is put meanwhile
                found, coverage = await asyncio.get_running_loop().run_in_executor(
                    executor, self.chunks.means, since, until, figures, sessions
                )
            else:
                found, coverage = self.chunks.means(since, until, figures, sessions)
        if error is not None:
            coverage = dataclasses.replace(coverage, error=error)
        return Measured(found[0], found[1], coverage)
