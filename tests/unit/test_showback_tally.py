"""The showback month tally (pure): kept as records arrive, end, reopen and change, it
answers what ``showback`` sums from all the records, in any billing time zone."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from jupyterhub_gpu.core.billing import Billing
from jupyterhub_gpu.core.model import Rate, parse_policy
from jupyterhub_gpu.core.showback import (
    NO_FLAVOR,
    month_bounds,
    month_of,
    sessions_of,
    showback,
)
from jupyterhub_gpu.core.showback_tally import ShowbackTally
from jupyterhub_gpu.core.usage import UsageRecord
from jupyterhub_gpu.core.usage_book import UsageBook
from jupyterhub_gpu.core.utilisation import Chunks, Reading
from jupyterhub_gpu.service.time_views import showback_json
from jupyterhub_gpu.service.views import Viewer

H = 3600.0
DAY = 86400.0
UTIL = "DCGM_FI_DEV_GPU_UTIL"
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


#: the flavors whose sessions' energy is never measured (a MIG slice's power is its
#: parent GPU's)
UNMETERED = {"mig"}


def expected(records, month, zone, now, running, busy, groups, shared, billing=None, power=None):
    """What the service answers from the usage database's records: ``showback`` over
    every record, the sessions of a shared flavor unmeasured, those of an unmetered one
    without energy."""
    since, until = month_bounds(month, zone)
    until = min(until, now)
    if until <= since:
        records = []
    records = [r for r in records if groups is None or r.group in groups]
    if busy and shared:
        sharing = {r.uid for r in records if (r.flavor or NO_FLAVOR) in shared}
        busy = {k: v for k, v in busy.items() if k not in sharing}
    return showback(records, since, until, now, running, busy, billing, power, UNMETERED)


def same(got, want) -> None:
    assert (got.since, got.until) == (want.since, want.until)
    names = ("groups", "users", "flavors", "detail", "measured", "utilised", "units", "cost")
    for name in (*names, "metered", "energy"):
        mine, theirs = getattr(got, name), getattr(want, name)
        assert mine.keys() == theirs.keys(), name
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (name, key)


def rates_changing(begin: float) -> Billing:
    """a100 at three rates (changing 10 and 40 days after ``begin``), mig at one."""
    return Billing(
        {
            "a100": (
                Rate(weight=2.0, price=3.5),
                Rate(since=begin + 10 * DAY, weight=2.5, price=4.25),
                Rate(since=begin + 40 * DAY, weight=1.5, price=2.0),
            ),
            "mig": (Rate(weight=0.2, price=0.5),),
        },
        "EUR",
    )


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
    shared = rng.choice(((), {"mig"}))  # the policy's shared flavors
    # odd seeds: rates that change twice inside the quarter (a server's hours across a
    # change are billed at each rate in force then); even: none (a unit per GPU-hour)
    billing = Billing() if seed % 2 == 0 else rates_changing(begin)
    book = UsageBook(horizon=400 * DAY)
    tally = ShowbackTally(zone, shared, billing, UNMETERED)
    pods = [f"ns/jupyter-{i}" for i in range(12)]
    serial = 0
    #: each session's mean utilisation (None: no samples), as the chunks would give it
    means: dict[str, float | None] = {}
    #: each session's mean power in watts (None: no power series)
    watts: dict[str, float | None] = {}
    #: the sessions whose mean was made final, by month (a record put anew is not)
    finalised: dict[str, set[str]] = {}

    def put(record: UsageRecord) -> None:
        book.put(POLICY, record)
        tally.put(record, now)
        for uids in finalised.values():
            uids.discard(record.uid)

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
            every = list(book.records.values())
            for r in every:
                if r.uid not in means:
                    means[r.uid] = rng.uniform(-10, 120) if rng.random() < 0.6 else None
                    watts[r.uid] = rng.uniform(-5, 1400) if rng.random() < 0.7 else None
            # each session's utilisation, by uid (one unknown: another month's, gone)
            busy = {uid: mean for uid, mean in means.items() if mean is not None}
            busy[f"u{serial + 1}"] = 50.0
            power = {uid: mean for uid, mean in watts.items() if mean is not None}
            power[f"u{serial + 2}"] = 300.0
            groups = rng.choice(FAMILIES)
            for month in months_around(begin, now, zone):
                args = (month, now, running, busy, groups, power)
                want = expected(every, month, zone, *args[1:5], shared, billing, power)
                same(tally.showback(*args), want)
                # the sessions still to measure: those showback uses, less the final ones
                since, until = month_bounds(month, zone)
                mine = [r for r in every if groups is None or r.group in groups]
                want_sessions = sessions_of(mine, since, min(until, now), now, running, shared)
                done = finalised.setdefault(month, set())
                unmeasured = tally.unmeasured(month, now, groups)
                assert sessions_of(unmeasured, since, min(until, now), now, running) == {
                    uid: session for uid, session in want_sessions.items() if uid not in done
                }
                # some ended sessions' means become final: summed from now on
                for r in mine:
                    ended = r.ended is not None and r.ended <= now
                    if ended and r.uid in want_sessions and rng.random() < 0.5:
                        tally.finalise(month, [(r.uid, means[r.uid], r.ended)], power)
                        done.add(r.uid)
                same(tally.showback(*args), want)
                # the clock gone back: every record summed
                back = now - rng.uniform(1, 5 * DAY)
                want = expected(
                    every, month, zone, back, running, busy, groups, shared, billing, power
                )
                same(tally.showback(month, back, running, busy, groups, power), want)
                want_sessions = sessions_of(mine, since, min(until, back), back, running, shared)
                unmeasured = tally.unmeasured(month, back, groups)
                assert sessions_of(unmeasured, since, min(until, back), back, running) == (
                    want_sessions
                )


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


def test_two_sessions_of_one_pod_name_each_get_their_own_utilisation():
    """ann's server ran idle in lab on the 2nd, was stopped, and ran busy in course on
    the 4th as a pod of the same name, then again idle in lab on the 6th: each session
    is billed with its own days' utilisation, never the pod name's month mean (which
    gave both groups 35 %)."""
    zone = ZoneInfo("UTC")
    nov = month_bounds("2026-11", zone)[0]
    key = "jhub/jupyter-ann"
    chunks = Chunks(zone=zone)
    for day, busy in ((1, 5.0), (3, 90.0), (5, 10.0)):
        start = nov + day * DAY
        chunks.put(
            Reading(
                start,
                start + DAY,
                {UTIL: {key: busy * 100}},
                {UTIL: {key: 100}},
                DAY,
                nov + 9 * DAY,
            )
        )
    records = [
        UsageRecord("s1", key, "ann", "lab", "gpu", "a100", 1.0, nov + DAY, nov, nov + DAY + 4 * H),
        UsageRecord(
            "s2", key, "ann", "course", "gpu", "a100", 2.0, nov + 3 * DAY, nov, nov + 3 * DAY + H
        ),
        # the third runs on: its pod is running now
        UsageRecord("s3", key, "ann", "lab", "gpu", "a100", 1.0, nov + 5 * DAY, nov, None),
    ]
    now = nov + 5 * DAY + 2 * H
    running = {key}
    tally = ShowbackTally(zone)
    for r in records:
        tally.put(r, now)
    since, until = month_bounds("2026-11", zone)
    sessions = sessions_of(tally.unmeasured("2026-11", now), since, min(until, now), now, running)
    assert sessions == {
        "s1": (key, nov + DAY, nov + DAY + 4 * H),
        "s2": (key, nov + 3 * DAY, nov + 3 * DAY + H),
        "s3": (key, nov + 5 * DAY, now),
    }
    means, _ = chunks.mean(since, min(until, now), [UTIL], sessions)
    assert means == {"s1": 5.0, "s2": 90.0, "s3": 10.0}
    result = tally.showback("2026-11", now, running, means)
    # lab: 4 GPU-hours at 5 % and 2 at 10 %; course: 2 GPU-hours at 90 %
    assert result.measured == {("lab", "ann", "a100"): 6.0, ("course", "ann", "a100"): 2.0}
    assert result.utilised == {
        ("lab", "ann", "a100"): pytest.approx(4 * 0.05 + 2 * 0.10),
        ("course", "ann", "a100"): pytest.approx(2 * 0.90),
    }
    # a month summed from the database's records: the same sessions, the same answer
    assert sessions_of(records, since, min(until, now), now, running) == sessions
    summed = showback(records, since, min(until, now), now, running, means)
    same(result, summed)
    # the pod name's month mean (what was billed before) would give both groups 35 %
    by_pod, _ = chunks.mean(since, min(until, now), [UTIL])
    assert by_pod[key] == pytest.approx(35.0)
    # s1's and s2's days are read for good: their means kept, measured no more
    stale = nov + DAY + 3 * H  # an end s1 no longer has: passed over
    tally.finalise("2026-11", [("s1", 5.0, stale), ("s3", 10.0, now)])  # s3 runs on
    assert {r.uid for r in tally.unmeasured("2026-11", now)} == {"s1", "s2", "s3"}
    tally.finalise("2026-11", [("s1", 5.0, nov + DAY + 4 * H), ("s2", 90.0, nov + 3 * DAY + H)])
    assert [r.uid for r in tally.unmeasured("2026-11", now)] == ["s3"]
    same(tally.showback("2026-11", now, running, {"s3": 10.0}), summed)
    # a member's answer: their group's sessions only
    assert [r.uid for r in tally.unmeasured("2026-11", now, {"lab"})] == ["s3"]
    assert tally.showback("2026-11", now, running, {"s3": 10.0}, {"course"}).measured == {
        ("course", "ann", "a100"): 2.0
    }
