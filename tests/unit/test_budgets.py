"""GPU-hour budgets: the arithmetic of the rolling window, with a fake clock (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jupyterhub_gpu.core.admission import Ledger
from jupyterhub_gpu.core.budgets import (
    UsageBook,
    UsageRecord,
    budget_refusal,
    budgets_of,
    format_hours,
    gpu_hours,
)
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.profiles import profile_entry
from jupyterhub_gpu.core.selection import offers, select

H = 3600.0
DAY = 86400.0
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC).timestamp()


def policy():
    return parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}, "cpu": {"cpu": 1}},
        groups={
            "department": {"budget": {"gpu_hours": 100, "period": "30d"}},
            "research": {
                "parent": "department",
                "quota": {"gpus": 8},
                "profiles": ["gpu", "cpu"],
                "budget": {"gpu_hours": 80, "period": "30d"},
                "per_user": {"budget": {"gpu_hours": 10, "period": "7d"}},
            },
            "teaching": {
                "parent": "department",
                "quota": {"gpus": 8},
                "profiles": ["gpu"],
            },
        },
    )


def record(uid, user="alice", group="research", gpus=1.0, start=0.0, end=None, seen=None):
    return UsageRecord(
        uid=uid,
        key=f"ns/jupyter-{user}-{uid}",
        user=user,
        group=group,
        profile="gpu",
        flavor="a100",
        gpus=gpus,
        started=NOW + start,
        last_seen=NOW + (seen if seen is not None else (end if end is not None else start)),
        ended=None if end is None else NOW + end,
    )


def book_of(p, *records):
    book = UsageBook.for_policy(p)
    for r in records:
        book.put(p, r)
    return book


def test_only_the_part_of_a_record_inside_the_window_counts():
    r = record("a", gpus=2, start=-10 * H, end=-2 * H)
    assert gpu_hours([r], NOW - 5 * H, NOW) == 6.0  # 3 hours inside, 2 GPUs
    assert gpu_hours([r], NOW - 1 * H, NOW) == 0.0


def test_an_open_record_counts_to_now_while_running_else_to_when_last_seen():
    r = record("a", start=-3 * H, seen=-1 * H)
    assert gpu_hours([r], NOW - DAY, NOW, running={r.key}) == 3.0
    # the server is gone and nobody saw it end: counted to its last sighting
    assert gpu_hours([r], NOW - DAY, NOW) == 2.0


def test_gpu_hours_read_alike_in_messages_and_on_the_dashboard_but_for_thousands():
    """One formatter: refusals and the profile list write 12345.6, the dashboard's
    tables 12,345.6 (``grouped``); below a thousand the two are the same, whole numbers
    have no ".0", and below one GPU-hour both keep three digits."""
    assert format_hours(12345.64) == "12345.6"
    assert format_hours(12345.64, grouped=True) == "12,345.6"
    assert format_hours(2000) == "2000"
    assert format_hours(2000, grouped=True) == "2,000"
    for value, shown in ((0, "0"), (1, "1"), (12.34, "12.3"), (0.5, "0.5"), (0.0125, "0.0125")):
        assert format_hours(value) == format_hours(value, grouped=True) == shown


def test_exhausted_group_budget_refuses_with_the_numbers_and_when_room_returns():
    p = policy()
    # 80 GPU-hours used: 40 of them ended 29 days ago, 40 ended a day ago
    book = book_of(
        p,
        record("old", user="bob", gpus=4, start=-29 * DAY - 10 * H, end=-29 * DAY),
        record("new", user="carol", gpus=4, start=-DAY - 10 * H, end=-DAY),
    )
    reason = budget_refusal(p, book, "alice", p.groups["research"], 1.0, NOW)
    # the old usage leaves the 30-day window from 1 day - 10 h from now, in full a day from now
    assert reason is not None
    assert reason.startswith("research used 80 of 80 GPU-hours in the last 30 days: ")
    # a day from now the old usage has wholly left the window
    assert "can start again at 2026-11-24 12:00 UTC, when 40 GPU-hours are free again" in reason
    # and what to do meanwhile
    assert reason.endswith("start one without GPUs, or ask an admin to raise the budget")
    # a CPU-only server is never refused for GPU time
    assert budget_refusal(p, book, "alice", p.groups["research"], 0.0, NOW) is None
    # the window moves: a day later 40 GPU-hours are free
    later = NOW + DAY + 60
    assert budget_refusal(p, book, "alice", p.groups["research"], 1.0, later) is None
    research, department, alice = budgets_of(p, book, "alice", p.groups["research"], later)
    assert (research.owner, round(research.used, 6), research.exhausted) == ("research", 40, False)
    assert (department.owner, round(department.used, 6)) == ("department", 40)
    assert (alice.owner, alice.used) == ("alice in research", 0)


def test_a_parents_budget_caps_the_sum_of_its_childrens_use():
    p = policy()
    book = book_of(
        p,
        record("r", group="research", gpus=5, start=-20 * H, end=-10 * H),  # 50
        record("t", user="tom", group="teaching", gpus=5, start=-20 * H, end=-10 * H),  # 50
    )
    # teaching has no budget of its own; the department's 100 are used by both together
    reason = budget_refusal(p, book, "tom", p.groups["teaching"], 1.0, NOW)
    assert reason is not None
    assert reason.startswith("department used 100 of 100 GPU-hours in the last 30 days")


def test_a_members_own_budget_applies_to_them_alone():
    p = policy()
    book = book_of(p, record("a", user="alice", gpus=1, start=-12 * H, end=-2 * H))  # 10 in 7 d
    # a warn budget (the default) refuses a new GPU server too: warn spares running ones
    assert p.groups["research"].user_budget.when_exhausted == "warn"
    reason = budget_refusal(p, book, "alice", p.groups["research"], 1.0, NOW)
    assert reason is not None
    assert reason.startswith("alice in research used 10 of 10 GPU-hours in the last 7 days")
    assert budget_refusal(p, book, "bob", p.groups["research"], 1.0, NOW) is None


def test_a_new_pod_for_the_same_server_ends_the_old_record_it_replaced():
    p = policy()
    old = record("old", start=-5 * H, seen=-4 * H)
    new = record("new", start=-1 * H)
    new.key = old.key
    book = book_of(p, old, new)
    assert old.ended == NOW - 4 * H  # its last sighting, not the new pod's start
    assert gpu_hours(book.group_records("research"), NOW - DAY, NOW, running={new.key}) == 2.0


def test_records_older_than_every_window_are_pruned():
    p = policy()
    book = book_of(
        p,
        record("ancient", start=-40 * DAY, end=-31 * DAY),
        record("recent", start=-2 * DAY, end=-DAY),
    )
    assert book.prune(p, NOW) == 1
    assert set(book.records) == {"recent"}
    assert list(book.group_records("department")) == [book.records["recent"]]


def test_the_profile_list_shows_each_budget_left_beside_the_quota():
    p = policy()
    book = book_of(p, record("a", user="alice", gpus=1, start=-4 * H, end=-2 * H))
    research = p.groups["research"]
    states = budgets_of(p, book, "alice", research, NOW)
    (offer,) = [o for o in offers(p, ["research"]) if o.profile.name == "gpu"]
    entry = profile_entry(p, Ledger(), offer, None, states)
    assert entry["description"].split(" · ")[2:5] == [
        "research: 78 of 80 GPU-hours left in the last 30 days",
        "department: 98 of 100 GPU-hours left in the last 30 days",
        "alice in research: 8 of 10 GPU-hours left in the last 7 days",
    ]
    (cpu,) = [o for o in offers(p, ["research"]) if o.profile.name == "cpu"]
    assert "GPU-hours" not in profile_entry(p, Ledger(), cpu, None, states)["description"]


def test_a_stop_budget_admits_only_as_many_gpus_as_its_remainder_gives_their_grace():
    p = parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}},
        groups={
            "course": {
                "quota": {"gpus": 10},
                "profiles": ["gpu"],
                "budget": {
                    "gpu_hours": 1,
                    "period": "1h",
                    "when_exhausted": "stop",
                    "grace": "15m",
                },
            }
        },
    )
    course = p.groups["course"]
    book = book_of(p, record("a", group="course", gpus=1, start=-30 * 60, end=-6 * 60))  # 0.4
    ledger = Ledger()
    request = select(p, ["course"], {"profile": "course--gpu"}).request
    ledger.admit(p, "ns/first", "ann", course, request)
    # 0.6 left; the running GPU and this one need 2 x 15 min = 0.5: admitted
    assert budget_refusal(p, book, "bob", course, 1.0, NOW, ledger) is None
    ledger.admit(p, "ns/second", "bob", course, request)
    # with two running, a third would need 0.75 of the 0.6 left
    assert budget_refusal(p, book, "cat", course, 1.0, NOW, ledger) == (
        "course has 0.6 of 1 GPU-hour left in the last hour, less than the 0.75 GPU-hours "
        "its servers' 2 GPUs and this server's 1 would use in the 15 minutes each may still "
        "run once they are used up: try again when one of its servers stops, or choose "
        "fewer GPUs"
    )


def test_a_per_member_budget_on_a_parent_that_offers_nothing_is_an_error():
    from jupyterhub_gpu.core.model import PolicyError, parse_policy

    weekly = {"gpu_hours": 10, "period": "7d"}
    policy = dict(
        flavors={"g": {"kind": "gpu"}},
        profiles={"p": {"gpu": {"flavor": "g"}}},
        groups={
            "uni": {"quota": {"gpus": 4}, "per_user": {"budget": weekly}},
            "lab": {"parent": "uni", "quota": {"gpus": 2}, "profiles": ["p"]},
        },
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(**policy)
    assert (
        "groups.uni.per_user.budget: uni offers no profiles of its own, so no server is "
        "ever charged to it and this per-member budget would never apply (its children lab "
        "are charged instead): set per_user.budget on each child"
    ) in str(caught.value)
    # where the parent offers profiles of its own, it counts its own servers
    policy["groups"]["uni"]["profiles"] = ["p"]
    assert parse_policy(**policy).groups["uni"].user_budget is not None
