"""Utilisation for showback, a chunk at a time (pure): the edges, what is read when,
the month's mean from the chunks, and what is reported missing."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

from jupyterhub_gpu.core.showback import month_bounds
from jupyterhub_gpu.core.utilisation import DAY, Chunks, Reading, chunk_edges

BERLIN = ZoneInfo("Europe/Berlin")
UTIL, MIG = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def reading(start, until, sums=None, counts=None, covered=None, read_at=None) -> Reading:
    return Reading(
        start,
        until,
        {UTIL: sums or {}},
        {UTIL: counts or {}},
        until - start if covered is None else covered,
        until if read_at is None else read_at,
    )


def test_a_month_is_cut_at_midnights_in_the_billing_zone_a_dst_day_included():
    since, until = month_bounds("2026-10", BERLIN)
    edges = chunk_edges(since, until, BERLIN)
    assert len(edges) == 32  # 31 days
    assert all(datetime.fromtimestamp(e, BERLIN).hour == 0 for e in edges)
    lengths = {b - a for a, b in itertools.pairwise(edges)}
    assert lengths == {DAY, DAY + 3600}  # 25 October 2026 has 25 hours


def test_fixed_length_edges_are_multiples_of_the_length():
    assert chunk_edges(95, 130, BERLIN, 10) == [95, 100, 110, 120, 130]
    assert chunk_edges(5, 5, BERLIN, 10) == []


def test_finished_chunks_are_read_once_and_the_current_one_at_most_every_refresh():
    chunks = Chunks(length=100, refresh=30, settle=5, max_reads=10)
    # 3 finished chunks and the one under way
    assert chunks.wanted(0, 1000, now=350) == [(300, 350), (200, 300), (100, 200), (0, 100)]
    for start, end in chunks.wanted(0, 1000, now=350):
        chunks.put(reading(start, end, read_at=350))
    assert chunks.wanted(0, 1000, now=370) == []  # the current one was read 20 s ago
    assert chunks.wanted(0, 1000, now=380) == [(300, 380)]
    chunks.put(reading(300, 380, read_at=380))
    # 300-400 ends: the next chunk is read at once; 300-400 again once settled, to its
    # end, and never after
    assert chunks.wanted(0, 1000, now=403) == [(400, 403)]
    chunks.put(reading(400, 403, read_at=403))
    assert chunks.wanted(0, 1000, now=411) == [(300, 400)]
    chunks.put(reading(300, 400, read_at=411))
    assert chunks.wanted(0, 1000, now=420) == []
    assert chunks.wanted(0, 1000, now=440) == [(400, 440)]


def test_a_call_reads_at_most_max_reads_finished_chunks_newest_first():
    chunks = Chunks(length=100, refresh=30, settle=0, max_reads=2)
    assert chunks.wanted(0, 10_000, now=1050) == [(1000, 1050), (900, 1000), (800, 900)]
    for start, end in chunks.wanted(0, 10_000, now=1050):
        chunks.put(reading(start, end, read_at=1050))
    _, coverage = chunks.mean(0, 1050, [UTIL])
    assert coverage.unread == 800
    assert coverage.note() == "utilised: 13 min not read yet (read a few days per pass)"
    assert chunks.wanted(0, 10_000, now=1051) == [(700, 800), (600, 700)]


def test_the_mean_is_the_samples_mean_across_chunks_the_whole_gpu_metric_first():
    chunks = Chunks(length=100, settle=0)
    chunks.put(reading(0, 100, {"ns/a": 50 * 10}, {"ns/a": 10}))
    sums = {UTIL: {"ns/a": 100 * 30, "ns/b": 20}, MIG: {"ns/b": 80, "ns/c": 40}}
    counts = {UTIL: {"ns/a": 30, "ns/b": 1}, MIG: {"ns/b": 1, "ns/c": 1}}
    chunks.put(Reading(100, 200, sums, counts, 100, 200))
    found, coverage = chunks.mean(0, 200, [UTIL, MIG])
    # a's 40 samples: 10 at 50 %, 30 at 100 %; b's whole-GPU figure wins over its MIG one
    assert found == {"ns/a": (500 + 3000) / 40, "ns/b": 20.0, "ns/c": 40.0}
    assert coverage.complete
    assert coverage.note() is None


def test_chunks_without_samples_are_reported_as_days_without_data():
    chunks = Chunks(settle=0)  # days in UTC
    since, until = month_bounds("2026-11")
    edges = chunk_edges(since, until, chunks.zone)
    for a, b in itertools.pairwise(edges):
        # Prometheus keeps 15 days: the month's first 15 have no samples
        covered = 0.0 if a < since + 15 * DAY else DAY
        chunks.put(reading(a, b, {"ns/a": 10.0 if covered else 0.0}, {"ns/a": 1}, covered, until))
    _found, coverage = chunks.mean(since, until, [UTIL])
    assert coverage.gaps == ((since, since + 15 * DAY),)
    assert coverage.covered == 15 * DAY
    assert coverage.unread == 0
    assert coverage.note() == "utilised: no data for 15 days"
    # a retention that ends inside a day: that day's missing hours, from its start
    chunks.put(reading(edges[15], edges[16], {"ns/a": 1.0}, {"ns/a": 1}, DAY - 6 * 3600, until))
    _, coverage = chunks.mean(since, until, [UTIL])
    assert coverage.gaps == ((since, since + 15 * DAY + 6 * 3600),)


def test_a_short_gap_is_sampling_not_missing_data():
    chunks = Chunks(length=DAY, settle=0)
    chunks.put(reading(0, DAY, {"ns/a": 1.0}, {"ns/a": 1}, DAY - 120))
    _, coverage = chunks.mean(0, DAY, [UTIL])
    assert coverage.complete


def test_old_readings_are_dropped_beyond_keep():
    chunks = Chunks(length=10, keep=3)
    for start in range(0, 50, 10):
        chunks.put(reading(start, start + 10))
    assert sorted(chunks.readings) == [(20, 30), (30, 40), (40, 50)]


def test_pods_of_one_name_one_after_the_other_each_get_their_own_mean():
    """A server stopped and started again (here in another group) is a pod of the same
    name: each session's mean comes from its own days, not the month's."""
    chunks = Chunks(length=100)
    key = "ns/jupyter-ann"
    # days 0-2: an idle session (5 %); days 2-4: a busy one (90 %); MIG samples for a
    # third session of another pod name, read when no whole-GPU sample is there
    chunks.put(reading(0, 100, {key: 50.0}, {key: 10}))
    chunks.put(reading(100, 200, {key: 50.0}, {key: 10}))
    chunks.put(reading(200, 300, {key: 900.0}, {key: 10}))
    chunks.put(reading(300, 400, {key: 900.0}, {key: 10}))
    chunks.put(
        Reading(
            400,
            500,
            {UTIL: {}, MIG: {"ns/jupyter-bob": 40.0}},
            {MIG: {"ns/jupyter-bob": 2}},
            100,
            500,
        )
    )
    sessions = {
        "idle": (key, 10.0, 190.0),
        "busy": (key, 210.0, 390.0),
        "mig": ("ns/jupyter-bob", 400.0, 500.0),
        "unmeasured": ("ns/jupyter-cid", 0.0, 500.0),
        "outside": (key, 600.0, 700.0),
    }
    by_session, coverage = chunks.mean(0, 500, [UTIL, MIG], sessions)
    assert by_session == {"idle": 5.0, "busy": 90.0, "mig": 20.0}
    # the pod name's mean over the month mixes both, as it did for every session
    by_pod, same = chunks.mean(0, 500, [UTIL, MIG])
    assert by_pod["ns/jupyter-ann"] == 47.5
    # every day of the sessions inside the span is read for good: their means are final
    assert coverage.final == {"idle", "busy", "mig", "unmeasured"}
    assert replace(coverage, final=frozenset()) == same
    # a day read while under way is not: the sessions that ran in it may still change
    chunks.put(reading(200, 250, {key: 450.0}, {key: 5}))
    assert chunks.mean(0, 500, [UTIL, MIG], sessions)[1].final == {"idle", "mig"}
    # a session cut by the range counts only its days inside it
    assert chunks.mean(100, 500, [UTIL], {"idle": (key, 10.0, 190.0)})[0] == {"idle": 5.0}
    assert chunks.mean(200, 500, [UTIL], {"idle": (key, 10.0, 190.0)})[0] == {}
