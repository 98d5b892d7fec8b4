"""Fair share counting billed units (``fair_share.count: billed_units``): each part of a
record's life weighs its flavor's billing weight in force then, integrated exactly, and
what the line, the spawn form, the dashboard and the metrics say of it."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest
from prometheus_client import generate_latest
from test_fairshare import record as fairshare_record

from jupyterhub_gpu.core.decayed import decayed_hours, decayed_units, usage_since
from jupyterhub_gpu.core.fairshare import (
    FairShareBook,
    Waiter,
    line_order,
    place,
    standing_line,
    used_words,
    why_placed,
)
from jupyterhub_gpu.core.model import PolicyError, parse_policy
from jupyterhub_gpu.core.usage import UsageRecord
from jupyterhub_gpu.service.fair_share import (
    fair_share_section,
    fair_share_snapshot,
    fair_share_view,
)
from jupyterhub_gpu.service.gpu_time import GPUTimeSnapshot
from jupyterhub_gpu.service.metrics import registry
from jupyterhub_gpu.service.views import Ledger, Snapshot

H = 3600.0
LN2 = math.log(2.0)
#: the H200's weight goes from 2 to 3 at midnight on 2026-11-15
CHANGE = datetime(2026, 11, 15, tzinfo=UTC).timestamp()
NOW = CHANGE + 2 * H


def policy(count: str | None = "billed_units", half_life: str = "1h"):
    fair = {"half_life": half_life, "max_wait": "1d"}
    if count is not None:
        fair["count"] = count
    return parse_policy(
        fair_share=fair,
        flavors={
            "h200": {
                "kind": "gpu",
                "billing": [{"weight": 2}, {"from": "2026-11-15", "weight": 3}],
            },
            "a100": {"kind": "gpu", "billing": {"weight": 1}},
            "mig": {"kind": "mig", "profile": "1g.10gb", "billing": {"weight": 0.25}},
            "t4": {"kind": "gpu"},  # no billing: a unit per GPU-hour
        },
        profiles={"p": {"gpu": {"flavor": "a100"}}},
        groups={
            "lab": {"display_name": "Lab", "quota": {"gpus": 4}, "profiles": ["p"]},
            "research": {"quota": {"gpus": 4}},
            "nlp": {"parent": "research", "quota": {"gpus": 4}, "profiles": ["p"]},
        },
    )


def record(uid, user, group, flavor, gpus, started, ended, last_seen=None) -> UsageRecord:
    return fairshare_record(uid, user, group, gpus, started, ended, last_seen, flavor)


# ---- the integral ---------------------------------------------------------------------


def test_a_record_across_a_change_of_rate_weighs_each_part_at_its_own_weight():
    """2 H200s from 3 h to 1 h before now, the weight going from 2 to 3 two hours before
    now, half-life 1 h. By hand, with k = ln 2 / h:

        2 · 2 ∫ e^{-k(now-t)} dt over [now-3h, now-2h] = 4/k (2^-2 - 2^-3) = 0.5/k
        2 · 3 ∫ e^{-k(now-t)} dt over [now-2h, now-1h] = 6/k (2^-1 - 2^-2) = 1.5/k

    2/k unit-seconds: 2 / ln 2 billed units. Counted as GPU-hours, 2/k (2^-1 - 2^-3) =
    0.75/k: 0.75 / ln 2 GPU-hours."""
    billed, hours = policy(), policy(count=None)
    r = record("r", "ann", "lab", "h200", 2.0, NOW - 3 * H, NOW - H)
    book, plain = FairShareBook(billed), FairShareBook(hours)
    book.put(r)
    plain.put(r)
    assert book.member_usage("ann", "lab", NOW) == pytest.approx(2 / LN2, rel=1e-12)
    assert book.group_usage("lab", NOW) == pytest.approx(2 / LN2, rel=1e-12)
    assert plain.member_usage("ann", "lab", NOW) == pytest.approx(0.75 / LN2, rel=1e-12)
    # a half-life later, all of it counts half: the weights are the hours', not the moment's
    assert book.member_usage("ann", "lab", NOW + H) == pytest.approx(1 / LN2, rel=1e-12)
    # the same, summed afresh
    assert decayed_hours([r], NOW, H, billing=book.billing) == pytest.approx(2 / LN2, rel=1e-12)


def test_a_record_wholly_before_or_after_the_change_weighs_only_that_rate():
    book = FairShareBook(policy())
    k = LN2 / H
    before = decayed_units(book.billing, "h200", 1.0, NOW - 4 * H, NOW - 3 * H, NOW, H)
    after = decayed_units(book.billing, "h200", 1.0, NOW - H, NOW, NOW, H)
    assert before == pytest.approx(2 / k * (2**-3 - 2**-4), rel=1e-12)
    assert after == pytest.approx(3 / k * (1 - 2**-1), rel=1e-12)
    # a flavor without billing, and a record without a flavor, weigh 1
    for flavor in ("t4", None):
        assert decayed_units(book.billing, flavor, 1.0, NOW - H, NOW, NOW, H) == pytest.approx(
            1 / k * (1 - 2**-1), rel=1e-12
        )
    # a MIG slice of 1/7 GPU weighted 0.25
    mig = decayed_units(book.billing, "mig", 1 / 7, NOW - H, NOW, NOW, H)
    assert mig == pytest.approx(0.25 / 7 / k * 0.5, rel=1e-12)


def test_an_open_record_across_the_change_counts_each_part_up_to_now_and_closing_it_keeps_it():
    book = FairShareBook(policy())
    opened = record("run", "ann", "lab", "h200", 1.0, NOW - 3 * H, None, last_seen=NOW - H)
    book.put(opened)
    k = LN2 / H
    # running: up to now; 1 h at weight 2 (3 h to 2 h ago), 2 h at weight 3 (2 h to now)
    running = {"ns/run"}
    expected = (2 * (2**-2 - 2**-3) + 3 * (1 - 2**-2)) / k / H
    assert book.member_usage("ann", "lab", NOW, running) == pytest.approx(expected, rel=1e-12)
    assert book.group_usage("lab", NOW, running) == pytest.approx(expected, rel=1e-12)
    assert book.siblings_usage(None, NOW, running) == pytest.approx(expected, rel=1e-12)
    # not known to run: up to its last sighting, an hour ago
    seen = (2 * (2**-2 - 2**-3) + 3 * (2**-1 - 2**-2)) / k / H
    assert book.member_usage("ann", "lab", NOW) == pytest.approx(seen, rel=1e-12)
    # ended now: counted closed, the same number
    book.put(record("run", "ann", "lab", "h200", 1.0, NOW - 3 * H, NOW))
    assert book.member_usage("ann", "lab", NOW) == pytest.approx(expected, rel=1e-12)
    # servers started after the change (weight 3), and on a flavor without rates (1)
    book.put(record("new", "bob", "lab", "h200", 2.0, NOW - H, None, last_seen=NOW - H))
    book.put(record("t4", "bob", "lab", "t4", 1.0, NOW - H, None, last_seen=NOW - H))
    running = {"ns/new", "ns/t4"}
    assert book.member_usage("bob", "lab", NOW, running) == pytest.approx(
        (3 * 2 + 1) * (1 - 2**-1) / k / H, rel=1e-12
    )


def test_kept_incrementally_with_weights_equals_summing_every_record_afresh():
    """Records of every flavor, many across the change of rate, arriving out of order and
    corrected (an end moved, a record reopened): the book's sums stay those of summing
    every record afresh with its weights, for each group, parent and member."""
    rng = random.Random(11)
    pol = policy(half_life="2d")
    book = FairShareBook(pol)
    latest: dict[str, UsageRecord] = {}
    users, groups = ["ann", "bob", "cy"], ["lab", "nlp", "everyone"]
    flavors = ["h200", "a100", "mig", "t4"]
    for i in range(600):
        began = CHANGE - 3 * 86400 + rng.uniform(0, 5 * 86400)
        uid = f"pod-{i % 450}"  # the last 150 correct earlier ones
        old = latest.get(uid)
        if old is not None:
            ended = None if rng.random() < 0.3 else old.started + rng.uniform(60, 12 * H)
            changed = record(uid, old.user, old.group, old.flavor, old.gpus, old.started, ended)
            changed.last_seen = old.started + rng.uniform(0, 6 * H)
        else:
            changed = record(
                uid,
                rng.choice(users),
                rng.choice(groups),
                rng.choice(flavors),
                rng.choice([1 / 7, 0.5, 1.0, 2.0]),
                began,
                began + rng.uniform(60, 12 * H),
            )
        latest[uid] = changed
        book.put(changed)
    now = CHANGE + 3 * 86400
    for group in ["lab", "nlp", "research", "everyone"]:
        family = {g.name for g in pol.all_groups if group in pol.charged_groups(g.name)}
        mine = [r for r in latest.values() if r.group in family]
        expected = decayed_hours(mine, now, 48 * H, billing=book.billing)
        assert book.group_usage(group, now) == pytest.approx(expected, rel=1e-9, abs=1e-12)
        for user in users:
            own = [r for r in latest.values() if r.group == group and r.user == user]
            assert book.member_usage(user, group, now) == pytest.approx(
                decayed_hours(own, now, 48 * H, billing=book.billing), rel=1e-9, abs=1e-12
            )


def test_without_the_setting_and_with_gpu_hours_nothing_is_weighted():
    assert policy(count=None).fair_share.count == "gpu_hours"
    for count in (None, "gpu_hours"):
        book = FairShareBook(policy(count=count))
        assert book.billing is None
        book.put(record("r", "ann", "lab", "h200", 1.0, NOW - H, NOW))
        assert book.member_usage("ann", "lab", NOW) == pytest.approx(0.5 / LN2, rel=1e-12)


def test_a_wrong_count_names_the_key_and_the_choices():
    with pytest.raises(PolicyError) as raised:
        policy(count="units")
    assert "hub.config.GPUPolicy.fair_share.count: expected gpu_hours or billed_units, got " in (
        str(raised.value)
    )


# ---- the line -------------------------------------------------------------------------


def two_in_line(count: str | None) -> tuple[list[Waiter], Waiter, Waiter]:
    """ann held one H200 for an hour, bob two A100s for the same hour: bob used twice
    ann's GPU-hours, but ann 3 billed units to bob's 2."""
    book = FairShareBook(policy(count=count))
    book.put(record("a", "ann", "lab", "h200", 1.0, NOW - 1.5 * H, NOW - 0.5 * H))
    book.put(record("b", "bob", "lab", "a100", 2.0, NOW - 1.5 * H, NOW - 0.5 * H))
    ann = Waiter("ns/ann", "ann", "lab", ("lab",), NOW - 60, 0)
    bob = Waiter("ns/bob", "bob", "lab", ("lab",), NOW - 30, 1)
    for w in (ann, bob):
        w.blocked_on = "lab"
        w.standing = book.order_key(w.user, w.group, NOW)
    ann_usage, bob_usage = (book.member_usage(u, "lab", NOW) for u in ("ann", "bob"))
    assert ann_usage / bob_usage == pytest.approx(1.5 if count else 0.5, rel=1e-12)
    return line_order([ann, bob], NOW, 86400), ann, bob


def test_the_order_flips_when_one_member_used_a_heavier_flavor():
    ordered, ann, bob = two_in_line(None)
    assert ordered == [ann, bob]  # GPU-hours: ann used half of bob's
    assert why_placed(ann, place(ann, ordered), NOW, 86400) == (
        "you used less GPU time recently than others waiting"
    )
    ordered, ann, bob = two_in_line("billed_units")
    assert ordered == [bob, ann]  # billed units: ann's H200 hour weighs 3, bob's 2
    assert why_placed(bob, place(bob, ordered), NOW, 86400, "billed_units") == (
        "you used fewer billed units recently than others waiting"
    )
    assert why_placed(ann, place(ann, ordered), NOW, 86400, "billed_units") == (
        "ahead of you: 1 whose user used fewer billed units recently than you"
    )


def test_a_sibling_group_is_behind_for_billed_units_used_for_its_share():
    book = FairShareBook(policy())
    me = Waiter("ns/me", "ann", "nlp", ("nlp", "research"), NOW, 0, blocked_on="research")
    other = Waiter("ns/o", "bob", "lab", ("lab",), NOW, 1, blocked_on="research")
    book.put(record("a", "ann", "nlp", "h200", 1.0, NOW - H, NOW))
    other.standing, me.standing = (0.0, 0.0), book.order_key("ann", "nlp", NOW)
    ordered = line_order([me, other], NOW, 86400)
    assert why_placed(me, place(me, ordered), NOW, 86400, "billed_units") == (
        "ahead of you: 1 whose group used fewer billed units recently for its share than yours"
    )


def test_the_spawn_forms_standing_says_billed_units():
    book = FairShareBook(policy())
    book.put(record("a", "ann", "lab", "h200", 1.0, NOW - H, NOW))
    book.put(record("b", "bob", "lab", "a100", 1.0, NOW - H, NOW))
    line = standing_line(
        "Lab",
        book.group_standing("lab", NOW),
        book.member_standing("ann", "lab", NOW),
        H,
        "billed_units",
    )
    units = 3 * 0.5 / LN2  # an hour at weight 3, decayed: 3 · (1 - 2^-1) / ln 2
    assert line == (
        f"Lab fair share: you used {units:.1f} billed units recently (half-life 1 hour), "
        "1.50 x your share; Lab 3.00 x its share"
    )
    assert used_words("billed_units", 1) == "1 billed unit"
    assert used_words("gpu_hours", 2.25) == "2.3 GPU-hours"


# ---- the service ----------------------------------------------------------------------


def test_the_service_shows_billed_units_in_api_usage_the_dashboard_and_the_metrics():
    pol = policy()
    book = FairShareBook(pol)
    records = [
        # a day ago, before the change: weight 2; and an hour just now at weight 3
        record("old", "ann", "lab", "h200", 1.0, NOW - 26 * H, NOW - 25 * H),
        record("new", "ann", "lab", "h200", 1.0, NOW - H, NOW),
        record("b", "bob", "lab", "a100", 1.0, NOW - H, NOW),
    ]
    for r in records:
        book.put(r)
    snapshot = fair_share_snapshot(pol, book, records, NOW, ())
    assert snapshot.count == "billed_units"
    view = fair_share_view(snapshot, list(pol.all_groups), "ann", admin=True)
    assert view["count"] == "billed_units"
    mine = view["mine"]["lab"]
    assert "decayed_gpu_hours" not in mine
    ann = book.member_usage("ann", "lab", NOW)
    assert mine["decayed_billed_units"] == pytest.approx(ann, abs=1e-4)
    # a day ago only the old hour counted (for lack of bob's): ann stood at twice her share
    assert mine["standing_day_ago"] == pytest.approx(2.0)
    page = fair_share_section(view)
    assert "Recent billed units" in page
    assert "GPU-hours" not in page
    assert f"lab: you used {ann:.1f} billed units recently" in page

    # the metrics: the decayed usage under its own unit's name (the standings as ever)
    gpu_time = GPUTimeSnapshot(fair_share=snapshot)
    reg, _ = registry(pol, lambda: Snapshot(Ledger(), [], None, gpu_time=gpu_time))
    text = generate_latest(reg).decode()
    assert "jupyterhub_gpu_group_fair_share_decayed_gpu_hours{" not in text
    series = 'jupyterhub_gpu_user_fair_share_decayed_billed_units{group="lab",user="ann"}'
    line = next(x for x in text.splitlines() if x.startswith(series))
    assert float(line.split()[-1]) == pytest.approx(ann, rel=1e-9)
    assert 'jupyterhub_gpu_group_fair_share_standing{group="lab"} 3.0' in text

    # counting GPU-hours, as before
    plain = policy(count=None)
    hours = FairShareBook(plain)
    for r in records:
        hours.put(r)
    view = fair_share_view(
        fair_share_snapshot(plain, hours, records, NOW, ()), list(plain.all_groups), "ann", True
    )
    assert view["count"] == "gpu_hours"
    assert "decayed_gpu_hours" in view["mine"]["lab"]
    assert "Recent GPU-hours" in fair_share_section(view)
    gpu_time = GPUTimeSnapshot(fair_share=fair_share_snapshot(plain, hours, records, NOW, ()))
    reg, _ = registry(plain, lambda: Snapshot(Ledger(), [], None, gpu_time=gpu_time))
    text = generate_latest(reg).decode()
    assert 'jupyterhub_gpu_user_fair_share_decayed_gpu_hours{group="lab",user="ann"}' in text
    assert "jupyterhub_gpu_group_fair_share_decayed_billed_units{" not in text


def test_usage_since_takes_back_the_last_days_billed_units_exactly():
    pol = policy(half_life="7d")
    book = FairShareBook(pol)
    records = [
        record("a", "ann", "lab", "h200", 1.0, NOW - 30 * H, NOW - 20 * H),  # across `since`
        record("b", "ann", "lab", "h200", 2.0, NOW - 3 * H, NOW - H),  # across the change
    ]
    since = NOW - 24 * H
    groups, members = usage_since(pol, records, since, NOW, book.half_life, (), book.billing)
    for r in records:
        book.put(r)
    # what is left is the usage at `since`, decayed to now: the first record's part before
    part = record("a", "ann", "lab", "h200", 1.0, NOW - 30 * H, since)
    left = decayed_hours([part], NOW, book.half_life, billing=book.billing)
    assert book.member_usage("ann", "lab", NOW) - members[("ann", "lab")] == pytest.approx(
        left, rel=1e-9
    )
    assert groups["lab"] == pytest.approx(members[("ann", "lab")], rel=1e-12)
