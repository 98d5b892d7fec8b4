"""Each owner's GPU-hours in a window, kept as the clock moves (what the service's
pass reads), are the brute-force sums of its records, whatever happens to them."""

from __future__ import annotations

import random

import pytest

from jupyterhub_gpu.core.budgets import UsageBook, UsageRecord, gpu_seconds
from jupyterhub_gpu.core.model import parse_policy

H = 3600.0
DAY = 86400.0
T0 = 1_800_000_000.0
PERIODS = (7 * DAY, 30 * DAY)


def policy():
    return parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}},
        groups={
            "dept": {"budget": {"gpu_hours": 100, "period": "30d"}},
            "lab": {"parent": "dept", "quota": {"gpus": 8}, "profiles": ["gpu"]},
            "class": {"parent": "dept", "quota": {"gpus": 8}, "profiles": ["gpu"]},
            "solo": {"quota": {"gpus": 8}, "profiles": ["gpu"]},
        },
    )


def brute(book: UsageBook, period: float, now: float, running) -> dict:
    """Every owner's sum, record by record (the code before)."""
    sums = {}
    for group, records in book.by_group.items():
        sums[(group, None)] = gpu_seconds(records.values(), now - period, now, running)
    for (user, group), records in book.by_user.items():
        sums[(group, user)] = gpu_seconds(records.values(), now - period, now, running)
    return sums


def same(kept: dict, summed: dict) -> None:
    for owner, value in summed.items():
        assert kept.get(owner, 0.0) == pytest.approx(value, rel=1e-12, abs=1e-6), owner
    for owner, value in kept.items():
        assert value == pytest.approx(summed.get(owner, 0.0), rel=1e-12, abs=1e-6), owner


@pytest.mark.parametrize("seed", range(12))
def test_kept_window_sums_match_the_records_summed_one_by_one(seed):
    rng = random.Random(seed)
    pol = policy()
    book = UsageBook(horizon=40 * DAY)
    now = T0
    n = 0
    users = [("ann", "lab"), ("bob", "lab"), ("cy", "class"), ("di", "solo"), ("ed", "dept")]

    def new_record() -> UsageRecord:
        nonlocal n
        n += 1
        user, group = rng.choice(users)
        start = now - rng.uniform(0, 45 * DAY)
        length = rng.choice((rng.uniform(0, 3 * DAY), rng.uniform(0, 60), -rng.uniform(0, H)))
        ended = None if rng.random() < 0.2 else start + length
        if ended is not None and rng.random() < 0.05:
            ended = now + rng.uniform(0, DAY)  # a clock ahead: ends after now
        seen = start + abs(length) * rng.random()
        gpus = rng.choice((1.0, 2.0, 0.5, 8.0, 0.0))
        key = f"ns/jupyter-{user}" if rng.random() < 0.3 else f"ns/pod-{n}"
        return UsageRecord(f"uid-{n}", key, user, group, "gpu", "a100", gpus, start, seen, ended)

    for _ in range(300):
        book.put(pol, new_record())
    for step in range(150):
        for _ in range(rng.randrange(0, 12)):
            action = rng.random()
            if action < 0.4 or not book.records:
                book.put(pol, new_record())
            elif action < 0.6 and book.open_by_key:
                key = rng.choice(list(book.open_by_key))
                book.end(key, now - rng.uniform(-H, DAY))
            elif action < 0.8:
                # a row read again: a sighting, a witnessed end, an inferred end undone
                old = rng.choice(list(book.records.values()))
                changed = UsageRecord(
                    old.uid, old.key, old.user, old.group, old.profile, old.flavor, old.gpus,
                    old.started, max(old.last_seen, now - rng.uniform(0, H)),
                    rng.choice((None, old.ended, now - rng.uniform(0, 2 * DAY))),
                )  # fmt: skip
                book.put(pol, changed)
            else:
                book.put(pol, rng.choice(list(book.records.values())))  # the same, again
        # the clock moves on (now and then by days, rarely back: a clock set right)
        now += rng.choice((30.0, 300.0, H, 2 * DAY, -H if step % 37 == 36 else 60.0))
        book.prune(pol, now)
        running = {r.key for r in book.open_by_key.values() if rng.random() < 0.7}
        for period in PERIODS:
            same(book.window_seconds(period, now, running), brute(book, period, now, running))
            # the records a window holds: every one ending in it (fair share's day)
            held = book.window_records(period, now)
            assert len({r.uid for r in held}) == len(held)
            ending = {r.uid for r in book.records.values() if r.end(now, running) > now - period}
            assert ending <= {r.uid for r in held}


def test_a_year_of_records_is_asked_about_at_flat_cost():
    """What a pass reads once the window's sums are kept: the records that moved, not
    all of them (a count of the records looked at, not a timing)."""
    pol = policy()
    book = UsageBook(horizon=365 * DAY)
    now = T0
    for i in range(20_000):
        start = now - 365 * DAY + i * (365 * DAY / 20_000)
        book.put(pol, UsageRecord(f"u{i}", f"ns/p{i}", "ann", "lab", "gpu", "a100", 1.0,
                                  start, start + 8 * H, start + 8 * H))  # fmt: skip
    book.window_seconds(30 * DAY, now)
    window = book._windows[30 * DAY]
    moved_before = len(window.inside_heap) + len(window.edge_heap)
    book.window_seconds(30 * DAY, now + 60.0)
    moved = moved_before - (len(window.inside_heap) + len(window.edge_heap))
    assert moved <= 2  # a record every 26 minutes: one minute moves at most one or two


def test_fair_share_standings_from_the_window_are_those_from_every_record():
    """The service's fair-share standings compare now with a day ago: read from the
    day's records the book holds, they are those read from all of them."""
    from jupyterhub_gpu.core.fairshare import FairShareBook
    from jupyterhub_gpu.service.fair_share import CHANGE_OVER, fair_share_snapshot

    pol = parse_policy(
        fair_share={"half_life": "7d", "max_wait": "30m"},
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}},
        groups={
            "lab": {"quota": {"gpus": 8}, "profiles": ["gpu"]},
            "class": {"quota": {"gpus": 8}, "profiles": ["gpu"]},
        },
    )
    rng = random.Random(7)
    book, fair = UsageBook(horizon=40 * DAY), FairShareBook(pol)
    now = T0
    for i in range(2000):
        user, group = rng.choice((("ann", "lab"), ("bob", "lab"), ("cy", "class")))
        start = now - rng.uniform(0, 40 * DAY)
        ended = None if i % 50 == 0 else start + rng.uniform(-60, 2 * DAY)
        record = UsageRecord(f"u{i}", f"ns/p{i}", user, group, "gpu", "a100",
                             rng.choice((1.0, 2.0)), start, start + 60, ended)  # fmt: skip
        book.put(pol, record)
        fair.put(record)
    book.prune(pol, now)
    running = {r.key for r in book.open_by_key.values()}
    held = book.window_records(CHANGE_OVER, now)
    assert len(held) < len(book.records) / 5
    every = fair_share_snapshot(pol, fair, book.records.values(), now, running)
    window = fair_share_snapshot(pol, fair, held, now, running)
    assert every.groups.keys() == window.groups.keys()
    assert every.users.keys() == window.users.keys()
    for name, standing in every.groups.items():
        assert window.groups[name].to_json() == standing.to_json()
    for owner, standing in every.users.items():
        assert window.users[owner].to_json() == standing.to_json()
