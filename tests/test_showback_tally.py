"""The showback month tally (pure): kept as records arrive, end, reopen and change, it
answers what ``showback`` sums from all the records, in any billing time zone."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from jupyterhub_gpu.core.budgets import UsageBook, UsageRecord, used_seconds
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.showback import (
    NO_FLAVOR,
    ShowbackTally,
    month_bounds,
    month_of,
    showback,
)
from jupyterhub_gpu.service.time_views import showback_json
from jupyterhub_gpu.service.views import Viewer

H = 3600.0
DAY = 86400.0
POLICY = parse_policy(
    flavors={"a100": {"kind": "gpu"}, "mig": {"kind": "mig", "profile": "1g.5gb"}},
    profiles={"gpu": {"gpu": {"flavor": "a100"}}, "small": {"gpu": {"flavor": "mig"}}},
    groups={
        "faculty": {"quota": {"gpus": 64}, "profiles": ["gpu", "small"]},
        "lab": {"parent": "faculty", "quota": {"gpus": 8}, "profiles": ["gpu", "small"]},
        "course": {"parent": "faculty", "quota": {"gpus": 8}, "profiles": ["small"]},
        "other": {"quota": {"gpus": 8}, "profiles": ["gpu"]},
    },
)
GROUPS = ["faculty", "lab", "course", "other"]
FAMILIES = [None, {"faculty", "lab", "course"}, {"lab"}, {"course"}, {"other"}]
ZONES = ["UTC", "Europe/Berlin", "America/Sao_Paulo", "Australia/Lord_Howe", "America/Santiago"]


def expected(records, month, zone, now, running, busy, groups, shared):
    """What the service answered before the tally: ``showback`` over every record,
    the servers that held a shared flavor in the month unmeasured."""
    since, until = month_bounds(month, zone)
    until = min(until, now)
    if until <= since:
        records = []
    records = [r for r in records if groups is None or r.group in groups]
    if busy and shared:
        sharing = {
            r.key
            for r in records
            if (r.flavor or NO_FLAVOR) in shared and used_seconds(r, since, until, now, running) > 0
        }
        busy = {k: v for k, v in busy.items() if k not in sharing}
    return showback(records, since, until, now, running, busy)


def same(got, want) -> None:
    assert (got.since, got.until) == (want.since, want.until)
    for name in ("groups", "users", "flavors", "detail", "measured", "utilised"):
        mine, theirs = getattr(got, name), getattr(want, name)
        assert mine.keys() == theirs.keys(), name
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (name, key)


def months_around(start: float, end: float, zone) -> list[str]:
    months, at = [], start - 40 * DAY
    while at < end + 40 * DAY:
        if month_of(at, zone) not in months:
            months.append(month_of(at, zone))
        at += 10 * DAY
    return months


@pytest.mark.parametrize("seed", range(24))
def test_the_tally_answers_what_showback_sums_from_every_record(seed):
    rng = random.Random(seed)
    zone = ZoneInfo(ZONES[seed % len(ZONES)])
    # a quarter of some year: month ends and daylight saving changes inside
    begin = datetime(2026, rng.randrange(1, 12), rng.randrange(1, 28), tzinfo=zone).timestamp()
    now = begin
    book, tally = UsageBook(horizon=400 * DAY), ShowbackTally(zone)
    pods = [f"ns/jupyter-{i}" for i in range(12)]
    serial = 0

    def put(record: UsageRecord) -> None:
        book.put(POLICY, record)
        tally.put(record, now)

    for step in range(250):
        now += rng.choice((60.0, 600.0, 3 * H, DAY, 4 * DAY))
        records = list(book.records.values())
        action = rng.random()
        if action < 0.35 or not records:
            # a new server, sometimes on a pod key still open (its earlier end missed)
            serial += 1
            group = rng.choice(GROUPS)
            flavor = rng.choice(("a100", "mig", None))
            started = now - rng.uniform(0, 50 * DAY)
            gpus = rng.choice((1.0, 2.0, 1 / 7, 0.25, 0.0))
            ended = None
            if rng.random() < 0.5:
                ended = started + rng.uniform(-H, 40 * DAY)  # ends even before it starts
                if rng.random() < 0.1:
                    ended = now + rng.uniform(1, 3 * DAY)  # a clock ahead of ours
            seen = min(now, started + rng.uniform(0, 30 * DAY))
            put(
                UsageRecord(
                    f"u{serial}",
                    rng.choice(pods),
                    rng.choice(("ann", "bob", "cat")),
                    group,
                    "gpu",
                    flavor,
                    gpus,
                    started,
                    seen,
                    ended,
                )
            )
        else:
            old = rng.choice(records)
            if old.ended is None and action < 0.6:  # seen again
                put(replace(old, last_seen=now))
            elif old.ended is None:  # found gone (inferred) or stopped (witnessed)
                put(replace(old, ended=max(old.started, old.last_seen + rng.uniform(0, H))))
            elif action < 0.8:  # an inferred end undone: it runs on
                put(replace(old, ended=None, last_seen=now))
            else:  # a witnessed end replaces an inferred one
                put(replace(old, ended=old.ended - rng.uniform(0, 2 * H)))
        if step % 10 == 0:
            running = {k for k in pods if rng.random() < 0.5}
            busy = {k: rng.uniform(-10, 120) for k in pods if rng.random() < 0.6}
            shared = rng.choice(((), {"mig"}))
            groups = rng.choice(FAMILIES)
            every = list(book.records.values())
            for month in months_around(begin, now, zone):
                args = (month, now, running, busy, groups, shared)
                want = expected(every, month, zone, *args[1:])
                same(tally.showback(*args), want)
                # the clock gone back: every record summed
                back = now - rng.uniform(1, 5 * DAY)
                want = expected(every, month, zone, back, running, busy, groups, shared)
                same(tally.showback(month, back, running, busy, groups, shared), want)


def test_a_month_across_a_daylight_saving_change_is_cut_at_local_midnight():
    zone = ZoneInfo("Europe/Berlin")
    # 25 October 2026 has 25 hours in Berlin: a server from 30 October 20:00 local to
    # 1 November 04:00 local holds its GPU 28 hours in October and 4 in November
    start = datetime(2026, 10, 30, 20, tzinfo=zone).timestamp()
    end = datetime(2026, 11, 1, 4, tzinfo=zone).timestamp()
    tally = ShowbackTally(zone)
    record = UsageRecord("a", "ns/jupyter-a", "ann", "lab", "gpu", "a100", 2.0, start, end, end)
    tally.put(record, end + DAY)
    assert tally.showback("2026-10", end + DAY).groups == {"lab": 56.0}
    assert tally.showback("2026-11", end + DAY).groups == {"lab": 8.0}
    assert month_bounds("2026-10", zone)[1] - month_bounds("2026-10", zone)[0] == 31 * DAY + H


def test_a_reopened_end_is_taken_away_and_the_server_counts_up_to_now():
    zone = ZoneInfo("UTC")
    nov = month_bounds("2026-11", zone)[0]
    tally = ShowbackTally(zone)
    ended = UsageRecord("a", "ns/jupyter-a", "ann", "lab", "gpu", "a100", 1.0, nov, nov, nov + H)
    tally.put(ended, nov + 2 * H)
    assert tally.showback("2026-11", nov + 2 * H).groups == {"lab": 1.0}
    # seen again after its inferred end: it runs on, and counts up to now
    tally.put(replace(ended, ended=None, last_seen=nov + 3 * H), nov + 3 * H)
    result = tally.showback("2026-11", nov + 5 * H, running={"ns/jupyter-a"})
    assert result.groups == {"lab": 5.0}
    # then gone for good: only its ended hours, nothing left of the first end
    tally.put(replace(ended, ended=nov + 4 * H, last_seen=nov + 4 * H), nov + 5 * H)
    assert tally.showback("2026-11", nov + 6 * H).detail == {("lab", "ann", "a100"): 4.0}
    tally.discard("a")
    assert tally.showback("2026-11", nov + 6 * H).groups == {}


def test_a_parents_total_includes_its_childrens_from_the_tally():
    zone = ZoneInfo("UTC")
    nov = month_bounds("2026-11", zone)[0]
    tally = ShowbackTally(zone)
    for uid, group, hours in (("a", "lab", 3), ("b", "course", 2), ("c", "other", 7)):
        end = nov + hours * H
        tally.put(
            UsageRecord(uid, f"ns/{uid}", "ann", group, "p", "a100", 1.0, nov, end, end), nov + DAY
        )
    family = {"faculty", "lab", "course"}
    result = tally.showback("2026-11", nov + DAY, groups=family)
    view = showback_json(
        "2026-11", result, Viewer(name="root", admin=True), True, family, {}, POLICY.charged_groups
    )
    totals = {row["group"]: row["gpu_hours"] for row in view["groups"]}
    assert totals == {"faculty": 5.0, "lab": 3.0, "course": 2.0}


def test_a_pruned_month_is_refused_by_name():
    zone = ZoneInfo("UTC")
    tally = ShowbackTally(zone)
    tally.prune(month_bounds("2026-11", zone)[0] + DAY)
    with pytest.raises(ValueError, match="2026-10 begins before the records kept"):
        tally.showback("2026-10", month_bounds("2026-12", zone)[0])
