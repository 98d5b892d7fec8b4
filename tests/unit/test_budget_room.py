"""When room returns in an exhausted budget, and how much of a budget is used: the sweep
and the usage book's kept sums give the answers of the plain definitions (a quadratic
pass, and a sum over every record, kept here as the references), on any records and
through any sequence of changes to the book (pure)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from datetime import UTC, datetime
from fractions import Fraction
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyterhub_gpu.core import usage_book
from jupyterhub_gpu.core.budgets import UsageBook, UsageRecord, room_returns
from jupyterhub_gpu.core.model import Budget, parse_policy

HOUR = 3600.0
DAY = 86400.0
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC).timestamp()


def reference(records, budget, now, running=()):
    """``room_returns`` as it was first written (a copy): every moment a record leaves
    the window, each weighed over every record."""
    period = float(budget.period)
    spans = [
        (r.started, r.end(now, running), r.gpus)
        for r in records
        if r.end(now, running) > now - period
    ]
    if not spans:
        return None
    cap = float(budget.gpu_hours)

    def used_at(t: float) -> float:
        since = t - period
        return sum(g * (e - max(s, since)) for s, e, g in spans if e > since) / HOUR

    # usage only leaves the window: each record's end + period is when it is wholly gone
    for moment in sorted({e + period for _, e, _ in spans}):
        free = cap - used_at(moment)
        if free > 1e-9:
            return math.ceil(moment / 60) * 60.0, free
    return None


def reference_used(records, period, now, running=()):
    """GPU-hours used in the ``period`` before ``now``, by the definition: each record's
    GPUs times the part of its span inside the window. A closed record's span ends at its
    end (at most now); an open one's now while its server runs, else at its last
    sighting (never before its start)."""
    since = now - period
    total = 0.0
    for r in records:
        if r.ended is not None:
            end = min(r.ended, now)
        elif r.key in running:
            end = now
        else:
            end = max(r.last_seen, r.started)
        start = max(r.started, since)
        if end > start:
            total += r.gpus * (end - start)
    return total / HOUR


def reference_moments(records, budget, now, running=()):
    """Every moment the first version weighs, in order, with the room it finds there."""
    period = float(budget.period)
    spans = [
        (r.started, r.end(now, running), r.gpus)
        for r in records
        if r.end(now, running) > now - period
    ]
    cap = float(budget.gpu_hours)

    def used_at(t):
        since = t - period
        return sum(g * (e - max(s, since)) for s, e, g in spans if e > since) / HOUR

    return [(moment, cap - used_at(moment)) for moment in sorted({e + period for _, e, _ in spans})]


def record(uid, start, end=None, *, gpus=1.0, seen=None, user="alice", group="research"):
    return UsageRecord(
        uid=uid,
        key=f"ns/jupyter-{uid}",
        user=user,
        group=group,
        profile="gpu",
        flavor="a100",
        gpus=gpus,
        started=start,
        last_seen=start if seen is None else seen,
        ended=end,
    )


# ---- the sweep against the definition --------------------------------------------------

# times on a 15-minute grid and GPUs in quarters: every sum is exact in floating point,
# so the sweep (which adds the same amounts in another order) must give the same bits;
# the grid makes records start, end and leave the window at the same moments
grid_times = st.integers(-45 * 96, 2 * 96).map(lambda q: NOW + 900.0 * q)
grid_lengths = st.integers(0, 4 * 96).map(lambda q: 900.0 * q)
quarter_gpus = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
periods = st.sampled_from([3600, DAY, 7 * DAY, 30 * DAY])
caps = st.sampled_from([0, Fraction(1, 4), 3, 10, 40, 150, 600, 5000])


@st.composite
def usage(draw, times=grid_times, lengths=grid_lengths, gpus=quarter_gpus):
    """Records of every kind, the keys running now, and ``now``."""
    now = draw(st.sampled_from([NOW, NOW + 450.0, NOW - 3 * DAY]))
    running: set[str] = set()
    records = []
    for i in range(draw(st.integers(0, 30))):
        start = draw(times)
        kind = draw(
            st.sampled_from(["closed", "closed", "closed", "zero", "backwards", "running", "seen"])
        )
        g = draw(gpus)
        if kind == "closed":  # overlapping others, or starting before the window
            r = record(str(i), start, start + draw(lengths), gpus=g)
        elif kind == "zero":
            r = record(str(i), start, start, gpus=g)
        elif kind == "backwards":  # an end written before the start
            r = record(str(i), start, start - draw(lengths), gpus=g)
        elif kind == "running":  # counts up to now; a start after now counts negative
            r = record(str(i), start, gpus=g)
            running.add(r.key)
        else:  # open, not running: counts up to its last sighting
            r = record(str(i), start, gpus=g, seen=start + draw(lengths) - 3600.0)
        records.append(r)
    return records, running, now


@settings(max_examples=600, deadline=None)
@given(usage(), periods, caps)
def test_the_sweep_gives_the_definitions_answer_to_the_bit(drawn, period, cap):
    records, running, now = drawn
    budget = Budget(gpu_hours=cap, period=int(period))
    assert room_returns(records, budget, now, running) == reference(records, budget, now, running)


# any times and fractions of a GPU (sevenths: MIG): the sums round differently, so the
# answers may differ where the room at a moment is within rounding of the threshold
any_times = st.floats(-45 * DAY, 2 * DAY).map(lambda t: NOW + t)
any_lengths = st.one_of(st.floats(0, 4 * DAY), st.sampled_from([0.0, 1e-6, 3600.0]))
any_gpus = st.one_of(st.sampled_from([1 / 7, 2 / 7, 3 / 7, 1 / 3, 0.1, 1.0, 2.0]), st.floats(0, 8))
TOLERANCE = 1e-6  # GPU-hours


@settings(max_examples=400, deadline=None)
@given(usage(any_times, any_lengths, any_gpus), periods, st.floats(0, 5000))
def test_the_sweep_agrees_with_the_definition_on_any_times(drawn, period, cap):
    records, running, now = drawn
    budget = Budget(gpu_hours=Fraction(cap), period=int(period))
    # what the definition allows when sums differ in their last bits: any moment before
    # which none has clearly more room than the threshold, and that is not clearly below it
    allowed = []
    for moment, free in reference_moments(records, budget, now, running):
        if free > 1e-9 - TOLERANCE:
            allowed.append((math.ceil(moment / 60) * 60.0, free))
        if free > 1e-9 + TOLERANCE:
            break
    else:
        allowed.append(None)
    answer = room_returns(records, budget, now, running)
    if answer is None:
        assert None in allowed
    else:
        when, free = answer
        assert any(
            a is not None and a[0] == when and abs(a[1] - free) <= TOLERANCE for a in allowed
        ), (answer, allowed)


# ---- what the book says is used, against the sum over every record -----------------------


def book_with(records):
    book = UsageBook(horizon=0.0)
    for r in records:
        book.put(POLICY, r)
    return book


@settings(max_examples=600, deadline=None)
@given(usage(), periods, st.sampled_from([0, 3, 64]), st.booleans())
def test_the_books_used_gives_the_definitions_sum_to_the_bit(drawn, period, summed, room_first):
    """Running records, open ones counted to their last sighting, closed ones ending
    inside the window, before it or after now (counted up to now), ends before starts;
    summed, or from the kept sums (``summed``: the most records an owner has to be
    summed), made by ``used`` or by an earlier ``room_returns``."""
    records, running, now = drawn
    book = book_with(records)
    budget = Budget(gpu_hours=Fraction(1), period=int(period))
    with patch.object(usage_book, "SUMMED_UP_TO", summed):
        for group, member in (("research", None), ("department", None), ("research", "alice")):
            mine = [r for r in records if member is None or r.user == member]
            expected = reference_used(mine, period, now, running)
            if room_first:
                book.room_returns(group, member, budget, now, running)
            assert book.used(group, member, int(period), now, running) == expected
            # asked again, and later, from what the first call kept
            assert book.used(group, member, int(period), now, running) == expected
            later = now + 450.0
            assert book.used(group, member, int(period), later, running) == reference_used(
                mine, period, later, running
            )


@settings(max_examples=400, deadline=None)
@given(usage(any_times, any_lengths, any_gpus), periods, st.sampled_from([0, 64]))
def test_the_books_used_agrees_with_the_definition_on_any_times(drawn, period, summed):
    # summed in another order: equal to rounding
    records, running, now = drawn
    book = book_with(records)
    with patch.object(usage_book, "SUMMED_UP_TO", summed):
        used = book.used("research", None, int(period), now, running)
    expected = reference_used(records, period, now, running)
    assert abs(used - expected) <= 1e-9 + 1e-12 * abs(expected), (used, expected)


def test_a_large_owners_used_sums_only_its_open_records_each_time():
    """A year of a group's records: what is used is the kept sums of the closed ones
    (one sort, at the first call) and a pass over the open ones, at every call."""
    records = [
        record(str(i), NOW - i * 1500.0, NOW - i * 1500.0 + 8 * HOUR, gpus=1.0)
        for i in range(20_000)
    ]
    live = [record(f"live{i}", NOW - (i + 1) * HOUR, seen=NOW - 60.0) for i in range(5)]
    running = {live[0].key, live[1].key}
    book = book_with(records + live)
    summed: list[int] = []
    seconds = usage_book.gpu_seconds

    def counting(records, *args):
        records = list(records)
        summed.append(len(records))
        return seconds(records, *args)

    with patch.object(usage_book, "gpu_seconds", counting):
        for step in range(50):
            now = NOW + step * 1.5
            used = book.used("research", None, int(30 * DAY), now, running)
            expected = reference_used(records + live, 30 * DAY, now, running)
            assert used == expected
        # a server stops: its record joins the closed ones, counted without a pass
        book.end(live[0].key, NOW + 100.0)
        running.discard(live[0].key)
        assert book.used("research", None, int(30 * DAY), NOW + 120.0, running) == (
            reference_used(records + live, 30 * DAY, NOW + 120.0, running)
        )
    assert summed == [5] * 50 + [4]


def test_with_as_many_owners_kept_as_the_book_keeps_another_owners_used_is_summed():
    """No owner is forgotten for ``used`` (rooms made and forgotten in turn would cost a
    sort a call): it is summed, the same answer; a refusal's ``room_returns`` makes way."""
    records = [
        record(f"{user}{i}", NOW - i * 3600.0, NOW - i * 3600.0 + 1800.0, user=user)
        for user in ("alice", "bob")
        for i in range(10)
    ]
    book = book_with(records)
    budget = Budget(gpu_hours=Fraction(1), period=int(30 * DAY))
    with patch.object(usage_book, "SUMMED_UP_TO", 0), patch.object(usage_book, "MAX_ROOMS", 1):
        for member in ("alice", "bob", "alice"):
            mine = [r for r in records if r.user == member]
            used = book.used("research", member, int(30 * DAY), NOW)
            assert used == reference_used(mine, 30 * DAY, NOW)
            assert list(book._rooms) == [("research", "alice")]
        book.room_returns("research", "bob", budget, NOW)
        assert list(book._rooms) == [("research", "bob")]
        alices = [r for r in records if r.user == "alice"]
        assert book.used("research", "alice", int(30 * DAY), NOW) == 4.5  # one ends after now
        assert reference_used(alices, 30 * DAY, NOW) == 4.5


def test_a_year_of_records_is_one_sort_not_a_pass_per_record():
    # 20,000 records took the first version minutes; the sweep takes tens of milliseconds
    # (a bound 100 times that: the machine may be busy)
    records = [
        record(str(i), NOW - i * 1500.0, NOW - i * 1500.0 + 8 * HOUR, gpus=1.0)
        for i in range(20_000)
    ]
    budget = Budget(gpu_hours=Fraction(1000), period=int(365 * DAY))
    t0 = time.perf_counter()
    when, free = room_returns(records, budget, NOW)
    assert time.perf_counter() - t0 < 3.0
    assert free > 0
    assert when > NOW


# ---- the usage book's kept sums, through any changes -------------------------------------


def policy():
    return parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}},
        groups={
            "department": {"budget": {"gpu_hours": 100, "period": "30d"}},
            "research": {
                "parent": "department",
                "quota": {"gpus": 8},
                "profiles": ["gpu"],
                "budget": {"gpu_hours": 80, "period": "30d"},
                "per_user": {"budget": {"gpu_hours": 10, "period": "7d"}},
            },
            "teaching": {"parent": "department", "quota": {"gpus": 8}, "profiles": ["gpu"]},
        },
    )


POLICY = policy()
OWNERS = [
    ("department", None),
    ("research", None),
    ("teaching", None),
    ("research", "alice"),
    ("research", "bob"),
    ("teaching", "alice"),
]
members = st.sampled_from([("alice", "research"), ("bob", "research"), ("alice", "teaching")])

new_pod = (
    # a new pod's record: open (running or not) or closed, maybe for a server that has one
    st.tuples(
        st.just("new"),
        members,
        st.integers(0, 5),  # which server: a new pod of a running one ends the old record
        grid_times,
        st.one_of(st.none(), grid_lengths),
        quarter_gpus,
        st.booleans(),
    )
)
changes = st.one_of(
    st.tuples(st.just("seen"), st.integers(0, 50), grid_lengths),  # an open one seen again
    st.tuples(st.just("end"), st.integers(0, 50), grid_lengths),  # a server stops
    st.tuples(st.just("again"), st.integers(0, 50)),  # the same row read again
    st.tuples(st.just("reopen"), st.integers(0, 50)),  # an inferred end undone
    st.tuples(st.just("rewrite"), st.integers(0, 50), grid_lengths),  # a closed row's end moves
    st.tuples(st.just("stop"), st.integers(0, 5)),  # a server no longer running
    st.tuples(st.just("clock"), st.integers(0, 4 * 96)),  # time passes
    st.tuples(st.just("prune"), st.just(0)),
)
operations = st.one_of(new_pod, changes)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(new_pod, max_size=20),
    st.lists(operations, min_size=5, max_size=40),
    st.sampled_from([DAY, 7 * DAY, 30 * DAY]),
    st.lists(st.tuples(periods, caps), min_size=1, max_size=3),
    st.sampled_from([1, 3, 1000]),
    st.sampled_from([0, 2, 64]),
    st.booleans(),
)
def test_the_books_kept_sums_give_the_definitions_answer_through_any_changes(
    first, ops, horizon, budgets_asked, remake_after, summed, used_first
):
    """Each owner's budgets are asked about after every change (a budget's period may be
    longer than the book's horizon): when room returns and what is used, the one or the
    other first (either makes what the book keeps of the owner)."""
    book = UsageBook(horizon=horizon)
    now = NOW
    running: set[str] = set()
    made = 0

    def nth(i, open_only=None):
        found = [
            r for r in book.records.values() if open_only is None or (r.ended is None) == open_only
        ]
        return found[i % len(found)] if found else None

    def check(owner, period, cap):
        group, member = owner
        budget = Budget(gpu_hours=Fraction(cap), period=int(period))
        view = book.by_group.get(group) if member is None else book.by_user.get((member, group))
        mine = list((view or {}).values())
        used = reference_used(mine, period, now, running)
        if used_first:
            assert book.used(group, member, int(period), now, running) == used
        assert book.room_returns(group, member, budget, now, running) == reference(
            mine, budget, now, running
        )
        assert book.used(group, member, int(period), now, running) == used

    with (
        patch.object(usage_book, "ROOM_REMAKE_AFTER", remake_after),
        patch.object(usage_book, "SUMMED_UP_TO", summed),
    ):
        for op in first + ops:
            kind = op[0]
            if kind == "new":
                _, (user, group), server, start, length, gpus, runs = op
                made += 1
                r = record(f"p{made}", start, gpus=gpus, user=user, group=group)
                r.key = f"ns/jupyter-{user}-{server}"
                if length is not None:
                    r.ended = start + length
                elif runs:
                    running.add(r.key)
                book.put(POLICY, r)
            elif kind == "seen" and (r := nth(op[1], open_only=True)) is not None:
                book.put(POLICY, replace(r, last_seen=r.last_seen + op[2]))
            elif kind == "end" and (r := nth(op[1], open_only=True)) is not None:
                book.end(r.key, r.started + op[2])
            elif kind == "again" and (r := nth(op[1])) is not None:
                book.put(POLICY, replace(r))
            elif kind == "reopen" and (r := nth(op[1], open_only=False)) is not None:
                book.put(POLICY, replace(r, ended=None))
            elif kind == "rewrite" and (r := nth(op[1], open_only=False)) is not None:
                book.put(POLICY, replace(r, ended=r.started + op[2]))
            elif kind == "stop":
                running.discard(sorted(running)[op[1] % len(running)] if running else "")
            elif kind == "clock":
                now += 900.0 * op[1]
            elif kind == "prune":
                book.prune(POLICY, now)
            for owner in OWNERS:
                for period, cap in budgets_asked:
                    check(owner, period, cap)


def test_the_book_sums_an_owners_records_once_while_only_open_ones_change():
    book = UsageBook(horizon=30 * DAY)
    for i in range(40):
        book.put(
            POLICY,
            record(
                f"old{i}", NOW - 20 * DAY + i * HOUR, NOW - 20 * DAY + i * HOUR + 4 * HOUR, gpus=2
            ),
        )
    live = record("live", NOW - 2 * HOUR, user="bob")
    book.put(POLICY, live)
    budget = Budget(gpu_hours=Fraction(100), period=int(30 * DAY))
    running = {live.key}

    def ask(now):
        answer = book.room_returns("research", None, budget, now, running)
        assert answer == reference(list(book.group_records("research")), budget, now, running)
        return answer, book._rooms[("research", None)]

    first, room = ask(NOW)
    # the running server is seen again and time passes: the same sums, a later answer
    book.put(POLICY, replace(live, last_seen=NOW + 60))
    later, kept = ask(NOW + 3600)
    assert kept is room
    assert later != first
    # it stops: kept, with its record among those closed since
    book.end(live.key, NOW + 7200)
    _, kept = ask(NOW + 7200)
    assert kept is room
    assert room.added == [book.records["live"]]
    # a closed record read again unchanged: kept; changed: summed again
    book.put(POLICY, replace(book.records["old3"]))
    assert ask(NOW + 7200)[1] is room
    book.put(POLICY, replace(book.records["old3"], ended=NOW - 19 * DAY))
    assert ask(NOW + 7200)[1] is not room
