"""The usage book in billed units (pure): what budgets in units read equals each
record's billed units summed afresh, across changes of rate, ends, reopenings and
prunes; and a budget in units refuses with its numbers in billed units."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from jupyterhub_gpu.core.billed_book import BilledBook, billed_book_for, billed_parts
from jupyterhub_gpu.core.billing import Billing
from jupyterhub_gpu.core.budgets import budget_refusal, budgets_of
from jupyterhub_gpu.core.model import Rate, parse_policy
from jupyterhub_gpu.core.usage import HOUR, UsageRecord
from jupyterhub_gpu.core.usage_book import UsageBook

DAY = 86400.0
T0 = 1_800_000_000.0
BILLING = Billing(
    {
        "h200": (
            Rate(weight=2.0),
            Rate(since=T0 + 5 * DAY, weight=3.0),
            Rate(since=T0 + 9 * DAY, weight=2.5),
        ),
        "mig": (Rate(weight=0.25),),
    }
)
POLICY = parse_policy(
    flavors={
        "h200": {
            "kind": "gpu",
            "billing": [
                {"weight": 2},
                {"from": "2027-01-20T08:00:00Z", "weight": 3},
                {"from": "2027-01-24T08:00:00Z", "weight": 2.5},
            ],
        },
        "mig": {"kind": "mig", "profile": "1g.10gb", "billing": {"weight": 0.25}},
    },
    profiles={"big": {"gpu": {"flavor": "h200"}}},
    groups={
        "lab": {
            "quota": {"gpus": 8},
            "profiles": ["big"],
            "budget": {"units": 100, "period": "7d"},
        },
        "sub": {"parent": "lab", "quota": {"gpus": 4}, "profiles": ["big"]},
    },
)


def billed_units(records, since: float, now: float, running=()) -> float:
    """Each record's billed units (unit-hours) from ``since`` to ``now``, summed afresh."""
    total = 0.0
    for r in records:
        end = min(r.end(now, running), now)
        start = max(r.started, since)
        if end > start:
            total += BILLING.billed(r.flavor, r.gpus, start, end)[0]
    return total


def test_the_policy_dates_are_the_tests_rates():
    assert Billing.of(POLICY) == BILLING


def test_a_record_across_two_changes_is_three_parts_each_at_its_weight():
    record = UsageRecord(
        "u", "ns/p", "ann", "lab", "big", "h200", 1.0, T0 + 4 * DAY, T0 + 10 * DAY, T0 + 10 * DAY
    )
    parts = billed_parts(record, BILLING)
    assert [(p.started, p.ended, p.gpus) for p in parts] == [
        (T0 + 4 * DAY, T0 + 5 * DAY, 2.0),
        (T0 + 5 * DAY, T0 + 9 * DAY, 3.0),
        (T0 + 9 * DAY, T0 + 10 * DAY, 2.5),
    ]
    # open, last seen before the second change: two parts, the last open
    running = replace(record, ended=None, last_seen=T0 + 6 * DAY)
    parts = billed_parts(running, BILLING)
    assert [(p.started, p.ended) for p in parts] == [
        (T0 + 4 * DAY, T0 + 5 * DAY),
        (T0 + 5 * DAY, None),
    ]
    # one rate: the record itself, its GPUs weighted
    (mig,) = billed_parts(replace(record, flavor="mig"), BILLING)
    assert (mig.uid, mig.gpus) == ("u", 0.25)


@pytest.mark.parametrize("seed", range(12))
def test_what_budgets_in_units_read_is_every_records_billed_units(seed):
    rng = random.Random(seed)
    book = BilledBook(BILLING, horizon=30 * DAY)
    now = T0
    records: dict[str, UsageRecord] = {}
    keys = [f"ns/p{i}" for i in range(6)]
    for step in range(300):
        now += rng.choice((600.0, 3 * HOUR, DAY / 2))
        action = rng.random()
        open_keys = {r.key for r in records.values() if r.ended is None}
        if action < 0.3 or not records:
            key = rng.choice([k for k in keys if k not in open_keys] or keys)
            if key in open_keys:
                continue
            uid = f"u{step}"
            group = rng.choice(("lab", "sub"))
            flavor = rng.choice(("h200", "mig"))
            record = UsageRecord(
                uid,
                key,
                rng.choice(("ann", "bob")),
                group,
                "big",
                flavor,
                rng.choice((1.0, 2.0, 1 / 7)),
                now - rng.uniform(0, DAY),
                now,
            )
        else:
            old = rng.choice(list(records.values()))
            if old.ended is None and action < 0.7:
                record = replace(old, last_seen=now)  # seen again, as every pass does
            elif old.ended is None:
                record = replace(old, ended=max(old.started, now - rng.uniform(0, HOUR)))
            elif action < 0.85 and old.key not in open_keys:
                record = replace(old, ended=None, last_seen=now)  # an inferred end undone
            else:
                record = replace(old, ended=max(old.started, old.ended - rng.uniform(0, DAY)))
        records[record.uid] = record
        book.put(POLICY, record)
        # every open record seen now (the service's pass)
        for r in [r for r in records.values() if r.ended is None]:
            records[r.uid] = seen = replace(r, last_seen=now)
            book.put(POLICY, seen)
        if step % 25 == 0:
            book.prune(POLICY, now)
            records = {
                u: r for u, r in records.items() if r.ended is None or r.ended >= now - 30 * DAY
            }
        running = {r.key for r in records.values() if r.ended is None and rng.random() < 0.5}
        for period in (DAY, 7 * DAY):
            since = now - period
            for group in ("lab", "sub"):
                members = [r for r in records.values() if group == "lab" or r.group == group]
                want = billed_units(members, since, now, running)
                got = book.used(group, None, int(period), now, running)
                assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (step, group, period)
            windows = book.window_seconds(period, now, running)
            for user in ("ann", "bob"):
                mine = [r for r in records.values() if (r.user, r.group) == (user, "sub")]
                want = billed_units(mine, since, now, running) * HOUR  # unit-seconds
                assert windows.get(("sub", user), 0.0) == pytest.approx(want, rel=1e-9, abs=1e-6)


def test_a_budget_in_units_refuses_with_its_numbers_in_billed_units():
    book, billed = UsageBook.for_policy(POLICY), billed_book_for(POLICY, 30 * DAY)
    assert billed is not None
    now = T0 + 6 * DAY
    # 20 h of 2 H200s, 8 of them before the change (weight 2), 12 after (weight 3)
    record = UsageRecord(
        "u1",
        "ns/p1",
        "ann",
        "lab",
        "big",
        "h200",
        2.0,
        T0 + 5 * DAY - 8 * HOUR,
        T0 + 5 * DAY + 12 * HOUR,
        T0 + 5 * DAY + 12 * HOUR,
    )
    book.put(POLICY, record)
    billed.put(POLICY, record)
    (state,) = budgets_of(POLICY, book, "ann", POLICY.group("lab"), now, (), billed)
    assert state.used == pytest.approx(2 * 8 * 2 + 2 * 12 * 3)  # 104 billed units
    assert state.exhausted
    refusal = budget_refusal(POLICY, book, "ann", POLICY.group("lab"), 1.0, now, None, billed)
    assert refusal is not None
    assert refusal.startswith(
        "lab used 104 of 100 billed units in the last 7 days: GPU servers can start again at "
    )
    # the same record in GPU-hours is 40: far within a budget of 100 GPU-hours
    hours = parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"big": {"gpu": {"flavor": "h200"}}},
        groups={
            "lab": {
                "quota": {"gpus": 8},
                "profiles": ["big"],
                "budget": {"gpu_hours": 100, "period": "7d"},
            }
        },
    )
    plain = UsageBook.for_policy(hours)
    plain.put(hours, record)
    assert budget_refusal(hours, plain, "ann", hours.group("lab"), 1.0, now) is None
    assert billed_book_for(hours) is None  # nothing in units: no book in units


def test_budgets_in_units_on_unweighted_flavors_read_the_gpu_hours():
    policy = parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"p": {"gpu": {"flavor": "a100"}}},
        groups={
            "lab": {
                "quota": {"gpus": 8},
                "profiles": ["p"],
                "budget": {"units": 10, "period": "1d"},
            }
        },
    )
    assert billed_book_for(policy) is None
    book = UsageBook.for_policy(policy)
    book.put(
        policy,
        UsageRecord(
            "u", "ns/p", "ann", "lab", "p", "a100", 1.0, T0, T0 + 11 * HOUR, T0 + 11 * HOUR
        ),
    )
    refusal = budget_refusal(policy, book, "ann", policy.group("lab"), 1.0, T0 + 12 * HOUR)
    assert refusal is not None
    assert refusal.startswith("lab used 11 of 10 billed units in the last day")
    assert math.isclose(
        budgets_of(policy, book, "ann", policy.group("lab"), T0 + 12 * HOUR)[0].used, 11
    )


def test_a_budget_needs_exactly_one_measure():
    from jupyterhub_gpu.core.model import PolicyError

    for budget in ({"period": "7d"}, {"gpu_hours": 1, "units": 2, "period": "7d"}):
        with pytest.raises(PolicyError) as caught:
            parse_policy(groups={"lab": {"budget": budget}})
        assert caught.value.errors == [
            "hub.config.GPUPolicy.groups.lab.budget: give exactly one of gpu_hours or units "
            "(e.g. {gpu_hours: 40, period: 7d}, or {units: 100, period: 30d} in billed units)"
        ]
    assert (
        parse_policy(groups={"lab": {"budget": {"units": 5, "period": "1d"}}})
        .group("lab")
        .budget.units
        == 5
    )


def test_a_server_the_hub_stops_ends_in_billed_units_where_its_gpu_hours_end():
    """The hub ends its own record in place in the GPU-hour book, then in billed units:
    the server's units stop at its end, not at its last sighting or now."""
    book, billed = UsageBook.for_policy(POLICY), billed_book_for(POLICY, 30 * DAY)
    assert billed is not None
    started = T0 + 4 * DAY
    record = UsageRecord("u1", "ns/p1", "ann", "lab", "big", "h200", 1.0, started, started)
    book.put(POLICY, record)
    billed.put(POLICY, record)
    record.last_seen = started + 2 * DAY  # seen by the service, across the change
    billed.put(POLICY, record)
    book.end("ns/p1", started + 3 * DAY)  # in place: ``record`` is ended now
    billed.end(POLICY, "ns/p1", started + 3 * DAY)
    now = started + 5 * DAY
    # a day at weight 2, then two at weight 3; nothing after the end, running or not
    for running in ((), {"ns/p1"}):
        assert billed.used("lab", None, int(7 * DAY), now, running) == pytest.approx(
            24 * 2 + 48 * 3
        )
    assert billed.book.open_by_key == {}
