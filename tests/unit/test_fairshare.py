"""Fair share's arithmetic: decayed usage kept incrementally equals summing every record
afresh, standings against shares, and the order and words of the waiting line."""

from __future__ import annotations

import random

import pytest

from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.core.decayed import decayed_hours
from jupyterhub_gpu.core.fairshare import (
    FairShareBook,
    Waiter,
    line_order,
    place,
    why_placed,
)
from jupyterhub_gpu.core.model import parse_policy

DAY = 86400.0
HALF_LIFE = 7 * DAY
NOW = 1_800_000_000.0


def policy(**groups):
    return parse_policy(fair_share={"half_life": "7d", "max_wait": "30m"}, groups=groups)


def record(uid, user, group, gpus, started, ended, last_seen=None, flavor="g") -> UsageRecord:
    return UsageRecord(
        uid=uid,
        key=f"ns/{uid}",
        user=user,
        group=group,
        profile="p",
        flavor=flavor,
        gpus=gpus,
        started=started,
        last_seen=last_seen if last_seen is not None else (ended or started),
        ended=ended,
    )


def test_a_year_of_records_kept_incrementally_equals_the_direct_sum():
    """Records arrive out of order, are corrected and reopened, over a year (52
    half-lives, so the reference time moves many times): the kept sums stay within a
    relative 1e-9 of summing the records afresh."""
    rng = random.Random(7)
    fair = policy(research={}, nlp={"parent": "research", "share": 2}, bio={})
    book = FairShareBook(fair)
    groups, users = ["research", "nlp", "bio", "everyone"], ["ann", "bob", "cy", "dee"]
    start = NOW - 365 * DAY
    latest: dict[str, UsageRecord] = {}
    clock = start
    for i in range(4000):
        clock += rng.uniform(0, 2 * 365 * DAY / 4000)
        recent = [r for r in list(latest.values())[-50:] if r.started > clock - 5 * DAY]
        if recent and rng.random() < 0.15:
            # a correction (of a recent record, as they are): an inferred end moved, or
            # the record reopened
            old = rng.choice(recent)
            ended = None if rng.random() < 0.3 else old.started + rng.uniform(60, 3 * DAY)
            changed = record(old.uid, old.user, old.group, old.gpus, old.started, ended, clock)
        else:
            began = clock - rng.uniform(0, 2 * DAY)  # some arrive late
            changed = record(
                f"pod-{i}",
                rng.choice(users),
                rng.choice(groups),
                rng.choice([0.25, 1.0, 2.0, 8.0]),
                began,
                began + rng.uniform(60, 2 * DAY),
            )
        latest[changed.uid] = changed
        book.put(changed)
        if rng.random() < 0.01:
            book.settle(clock)
    now = clock + 4 * DAY  # after every record's end
    for group in groups:
        family = {g.name for g in fair.all_groups if group in fair.charged_groups(g.name)}
        expected = decayed_hours([r for r in latest.values() if r.group in family], now, HALF_LIFE)
        assert book.group_usage(group, now) == pytest.approx(expected, rel=1e-9, abs=1e-9)
        for user in users:
            mine = [r for r in latest.values() if r.group == group and r.user == user]
            assert book.member_usage(user, group, now) == pytest.approx(
                decayed_hours(mine, now, HALF_LIFE), rel=1e-9, abs=1e-9
            )
    assert book.ref is not None
    assert book.ref > start + 300 * DAY  # it moved forward: no term grew large


def test_usage_a_half_life_ago_counts_half_and_a_running_server_counts_up_to_now():
    fair = policy(lab={})
    book = FairShareBook(fair)
    book.put(record("old", "ann", "lab", 1.0, NOW - HALF_LIFE - 3600, NOW - HALF_LIFE))
    book.put(record("new", "bob", "lab", 1.0, NOW - 3600, NOW))
    ann, bob = book.member_usage("ann", "lab", NOW), book.member_usage("bob", "lab", NOW)
    assert ann == pytest.approx(bob / 2, rel=1e-12)
    assert bob == pytest.approx(1.0, rel=3e-3)  # an hour just now: barely decayed
    # a server still running counts up to now, as long as it runs
    book.put(record("run", "cy", "lab", 2.0, NOW - 7200, None, last_seen=NOW - 7200))
    assert book.member_usage("cy", "lab", NOW, running={"ns/run"}) == pytest.approx(4, rel=1e-2)
    # not known to run: up to its last sighting
    assert book.member_usage("cy", "lab", NOW) == 0.0
    # the clock moves on a half-life: everything counts half
    later = NOW + HALF_LIFE
    assert book.member_usage("bob", "lab", later) == pytest.approx(bob / 2, rel=1e-12)


def test_an_end_undone_takes_back_what_the_record_added():
    book = FairShareBook(policy(lab={}))
    book.put(record("a", "ann", "lab", 1.0, NOW - 7200, NOW - 3600))
    book.put(record("a", "ann", "lab", 1.0, NOW - 7200, None, last_seen=NOW - 3600))
    book.put(record("a", "ann", "lab", 1.0, NOW - 7200, NOW))
    expected = decayed_hours([record("a", "ann", "lab", 1.0, NOW - 7200, NOW)], NOW, HALF_LIFE)
    assert book.member_usage("ann", "lab", NOW) == pytest.approx(expected, rel=1e-12)
    assert book.group_usage("lab", NOW) == pytest.approx(expected, rel=1e-12)


def test_standing_is_usage_fraction_over_share_fraction():
    fair = policy(big={"share": 3}, small={}, nlp={"parent": "big"}, cv={"parent": "big"})
    book = FairShareBook(fair)
    # big (through nlp) and small used the same: big's share is 3 of the 5 top-level
    # shares (everyone has one), so it stands at 0.5 / 0.6, small at 0.5 / 0.2
    book.put(record("1", "ann", "nlp", 1.0, NOW - 3600, NOW))
    book.put(record("2", "bob", "small", 1.0, NOW - 3600, NOW))
    big, small = book.group_standing("big", NOW), book.group_standing("small", NOW)
    assert big.standing == pytest.approx(0.5 / 0.6)
    assert small.standing == pytest.approx(0.5 / 0.2)
    assert book.group_standing("everyone", NOW).standing == 0.0
    # among big's children, nlp used it all with half the shares
    assert book.group_standing("nlp", NOW).standing == pytest.approx(2.0)
    # members: ann used all of nlp's own usage; a member without usage stands at 0
    assert book.member_standing("ann", "nlp", NOW).standing == pytest.approx(1.0)
    # the order across the top level: big's usage per share (1/3) is below small's (1/1)
    assert book.order_key("ann", "nlp", NOW) < book.order_key("bob", "small", NOW)
    book.put(record("3", "cy", "nlp", 3.0, NOW - 3600, NOW))
    assert book.member_standing("cy", "nlp", NOW).standing == pytest.approx(1.5)
    assert book.member_standing("dee", "nlp", NOW).standing == 0.0
    # now big used 4 for its 3 shares, small 1 for its 1: small's servers go first
    assert book.order_key("ann", "nlp", NOW) > book.order_key("bob", "small", NOW)
    # within nlp, ann (1 GPU-hour) goes before cy (3)
    assert book.order_key("ann", "nlp", NOW) < book.order_key("cy", "nlp", NOW)


def waiter(key, standing, seq, arrived=NOW, group="lab", chain=("lab",), blocked="lab"):
    return Waiter(key, key, group, chain, arrived, seq, blocked, standing)


def test_the_line_goes_by_standing_then_arrival_and_max_wait_goes_first():
    heavy = waiter("heavy", (5.0, 9.0), 0, arrived=NOW - 100)
    light = waiter("light", (5.0, 1.0), 1)
    tie = waiter("tie", (5.0, 1.0), 2)
    assert [w.key for w in line_order([tie, heavy, light], NOW, 1800)] == [
        "light",
        "tie",
        "heavy",
    ]
    # heavy has waited 30 minutes: it goes first, whatever its standing
    later = NOW - 100 + 1800
    assert line_order([tie, heavy, light], later, 1800)[0].key == "heavy"
    # without fair share: arrival order
    fifo = [waiter(k, (), i) for i, k in enumerate("abc")]
    assert [w.key for w in line_order(reversed(fifo), NOW)] == ["a", "b", "c"]


def test_a_server_waits_only_behind_those_waiting_for_capacity_it_needs():
    # nlp and cv share the parent research; bio does not
    full_parent = waiter("nlp-1", (1.0, 0.0), 0, group="nlp", chain=("nlp", "research"))
    full_parent.blocked_on = "research"
    own_group = waiter("cv-1", (0.5, 0.0), 1, group="cv", chain=("cv", "research"))
    own_group.blocked_on = "cv"
    me = waiter("nlp-2", (2.0, 0.0), 2, group="nlp", chain=("nlp", "research"), blocked=None)
    other = waiter("bio-1", (0.0, 0.0), 3, group="bio", chain=("bio",), blocked="bio")
    ordered = line_order([full_parent, own_group, me, other], NOW, 1800)
    where = place(me, ordered)
    # cv-1 waits for cv's own room, which nlp-2 does not take
    assert [w.key for w in where.ahead] == ["nlp-1"]
    assert (where.position, where.of) == (2, 2)


def test_why_a_server_is_where_it_is():
    light = waiter("light", (1.0, 0.5), 1)
    heavy = waiter("heavy", (1.0, 9.0), 0)
    ordered = line_order([heavy, light], NOW, 1800)
    assert why_placed(light, place(light, ordered), NOW, 1800) == (
        "you used less GPU time recently than others waiting"
    )
    assert why_placed(heavy, place(heavy, ordered), NOW, 1800) == (
        "ahead of you: 1 whose user used less GPU time recently than you"
    )
    sibling = waiter("sib", (0.5, 9.0), 2, group="cv", chain=("cv", "research"))
    me = waiter("me", (1.0, 0.0), 3, group="nlp", chain=("nlp", "research"), blocked="research")
    sibling.blocked_on = "research"
    ordered = line_order([me, sibling], NOW, 1800)
    assert why_placed(me, place(me, ordered), NOW, 1800) == (
        "ahead of you: 1 whose group used less GPU time recently for its share than yours"
    )
    old = waiter("old", (1.0, 9.0), 0, arrived=NOW - 3600)
    ordered = line_order([old, light], NOW, 1800)
    assert why_placed(old, place(old, ordered), NOW, 1800) == (
        "you have waited longer than 30 minutes, so you go first"
    )
    assert why_placed(light, place(light, ordered), NOW, 1800) == (
        "ahead of you: 1 waited longer than 30 minutes"
    )
    same = waiter("same", (1.0, 0.5), 5)
    ordered = line_order([light, same], NOW, 1800)
    assert why_placed(light, place(light, ordered), NOW, 1800) == "you asked first"
    assert why_placed(same, place(same, ordered), NOW, 1800) == (
        "ahead of you: 1 that asked before you"
    )


def test_a_policy_without_fair_share_has_no_book():
    with pytest.raises(ValueError, match="the policy has no fair_share"):
        FairShareBook(parse_policy())


def test_the_service_shows_standings_now_and_how_they_changed_in_a_day():
    from jupyterhub_gpu.service.fair_share import (
        fair_share_section,
        fair_share_snapshot,
        fair_share_view,
    )

    fair = policy(lab={}, bio={})
    book = FairShareBook(fair)
    records = [
        # yesterday both used the same; today only ann
        record("1", "ann", "lab", 1.0, NOW - 2 * DAY, NOW - 2 * DAY + 3600),
        record("2", "bob", "bio", 1.0, NOW - 2 * DAY, NOW - 2 * DAY + 3600),
        record("3", "ann", "lab", 2.0, NOW - 3600, NOW),
    ]
    for r in records:
        book.put(r)
    snap = fair_share_snapshot(fair, book, records, NOW, ())
    lab, bio = snap.groups["lab"], snap.groups["bio"]
    # a day ago: lab and bio each half of the top level's use, with a third of the shares
    assert lab.day_ago == pytest.approx(1.5)
    assert bio.day_ago == pytest.approx(1.5)
    assert lab.standing > 2 > 1 > bio.standing
    assert lab.usage == pytest.approx(book.group_usage("lab", NOW))
    assert snap.users[("ann", "lab")].standing == pytest.approx(1.0)  # lab's only member
    # bob sees his group and his own standing, not lab's; an admin sees every user
    view = fair_share_view(snap, [fair.groups["bio"]], "bob", admin=False)
    assert set(view["groups"]) == {"bio"}
    assert set(view["mine"]) == {"bio"}
    assert "users" not in view
    admin = fair_share_view(snap, fair.all_groups, "root", admin=True)
    assert [u["user"] for u in admin["users"]] == ["ann", "bob"]  # each their group's only member
    assert admin["groups"]["lab"]["change"] == pytest.approx(lab.standing - 1.5, abs=1e-4)
    page = fair_share_section(admin)
    assert '<table class="fair-share-users">' in page
    assert "counting half after 7 days" in page
    assert "bio: you used" not in page  # the admin has no servers of their own
    assert "bio: you used" in fair_share_section(view)
