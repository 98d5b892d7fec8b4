"""Billing (pure): rates per flavor versioned by time, what a server's hours are billed
across a change of rate, accounts and the month's invoice, and what showback and the
invoice say of them."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest

from jupyterhub_gpu.core.billing import Billing
from jupyterhub_gpu.core.model import PolicyError, parse_policy
from jupyterhub_gpu.core.showback import month_bounds, showback
from jupyterhub_gpu.core.usage import UsageRecord
from jupyterhub_gpu.service.invoice_views import invoice_csv, invoice_json, invoice_page
from jupyterhub_gpu.service.time_views import showback_csv, showback_json
from jupyterhub_gpu.service.views import Viewer

H = 3600.0
CHANGE = datetime(2026, 11, 15, tzinfo=UTC).timestamp()
POLICY = parse_policy(
    currency="EUR",
    flavors={
        "h200": {
            "kind": "gpu",
            "display_name": "H200",
            "billing": [
                {"weight": 2, "price": 4.0},
                {"from": "2026-11-15", "weight": 3, "price": 6.0},
            ],
        },
        "a100": {"kind": "gpu", "billing": {"weight": 1, "price": 1.5}},
        "mig": {"kind": "mig", "profile": "1g.10gb", "billing": {"weight": 0.25, "price": 0.3}},
    },
    profiles={"big": {"gpu": {"flavor": "h200"}}, "small": {"gpu": {"flavor": "a100"}}},
    groups={
        "research": {"account": "CC-100", "quota": {"gpus": 8}, "profiles": ["big", "small"]},
        "nlp": {"parent": "research", "quota": {"gpus": 4}, "profiles": ["small"]},
        "vision": {
            "parent": "research",
            "account": "GRANT-7",
            "quota": {"gpus": 4},
            "profiles": ["big"],
        },
        "course": {"quota": {"gpus": 2}, "profiles": ["small"]},
    },
)
BILLING = Billing.of(POLICY)


def at(day: int, hour: float = 0) -> float:
    return datetime(2026, 11, day, tzinfo=UTC).timestamp() + hour * H


def record(uid, group, user, flavor, gpus, start, end) -> UsageRecord:
    return UsageRecord(uid, f"ns/{uid}", user, group, "p", flavor, gpus, start, end, end)


#: November 2026: ann's H200 runs across the change of rate on the 15th
RECORDS = [
    record("r1", "research", "ann", "h200", 1.0, at(10), at(20)),  # 120 h at 2/4, 120 h at 3/6
    record("r2", "nlp", "nia", "a100", 2.0, at(3), at(3, 10)),  # 20 GPU-h at 1/1.5
    record("r3", "vision", "vic", "h200", 1.0, at(16), at(16, 5)),  # 5 h at 3/6
    record("r4", "course", "cid", "a100", 1.0, at(1), at(1, 4)),  # 4 GPU-h at 1/1.5
]
MONTH = "2026-11"


def month_showback(records=RECORDS, billing=BILLING):
    since, until = month_bounds(MONTH)
    return showback(records, since, until, until + H, (), None, billing)


# ---- the policy -----------------------------------------------------------------------


def test_rates_read_oldest_first_with_their_start_and_accounts_pass_to_children():
    h200 = POLICY.flavors["h200"].billing
    assert [(r.weight, r.price) for r in h200] == [(2.0, 4.0), (3.0, 6.0)]
    assert h200[1].since == CHANGE
    assert POLICY.currency == "EUR"
    assert POLICY.account_of("nlp") == "CC-100"  # its parent's
    assert POLICY.account_of("vision") == "GRANT-7"  # its own
    assert POLICY.account_of("course") is None
    # a site that bills nothing: a unit per GPU-equivalent-hour, no price
    plain = Billing.of(parse_policy(flavors={"a100": {"kind": "gpu"}}))
    assert plain.billed("a100", 2.0, 0, 3 * H) == (6.0, 0.0)
    assert not plain.priced("a100")


@pytest.mark.parametrize(
    ("flavors", "settings", "message"),
    [
        (
            {"billing": "expensive"},
            {},
            "flavors.x.billing: expected a mapping like {weight: 2, price: 3.5} or a list of "
            "them, got 'expensive'",
        ),
        (
            {"billing": {"weight": "two"}},
            {},
            "flavors.x.billing.weight: expected a number, got 'two'",
        ),
        (
            {"billing": {"weight": 0}},
            {},
            "flavors.x.billing.weight: expected a positive number, got 0",
        ),
        (
            {"billing": {"price": -1}},
            {"currency": "EUR"},
            "flavors.x.billing.price: expected a number >= 0, got -1",
        ),
        (
            {"billing": [{"weight": 1}, {"weight": 2}]},
            {},
            "flavors.x.billing[1].from: required: when this rate begins (e.g. 2026-12-01)",
        ),
        (
            {"billing": [{"from": "2026-12-01", "weight": 1}]},
            {},
            "flavors.x.billing[0].from: the first rate is in force from the start: remove "
            "from, or list the rate before it first",
        ),
        (
            {"billing": [{"weight": 1}, {"from": "2026-12-01T00:00:00", "weight": 2}]},
            {},
            "flavors.x.billing[1].from: give the time's offset, e.g. "
            "2026-12-01T00:00:00+01:00 or Z, got '2026-12-01T00:00:00'",
        ),
        (
            {"billing": [{"weight": 1}, {"from": "December", "weight": 2}]},
            {},
            "flavors.x.billing[1].from: expected a date like 2026-12-01 or a time like "
            "2026-12-01T00:00:00+01:00, got 'December'",
        ),
        (
            {
                "billing": [
                    {"weight": 1},
                    {"from": "2026-12-01", "weight": 2},
                    {"from": "2026-11-01", "weight": 3},
                ]
            },
            {},
            "flavors.x.billing[2].from: expected a moment after the rate before it: list "
            "rates oldest first",
        ),
        (
            {"billing": [{"price": 1}, {"from": "2026-12-01", "weight": 2}]},
            {"currency": "EUR"},
            "flavors.x.billing: give every rate a price, or none: an hour without one would "
            "cost nothing",
        ),
        (
            {"billing": {"price": 2}},
            {},
            "flavors.x.billing.price: a price needs its currency: set GPUPolicy.currency "
            "(e.g. EUR)",
        ),
    ],
)
def test_a_wrong_rate_is_refused_naming_the_key_and_what_to_write(flavors, settings, message):
    with pytest.raises(PolicyError) as caught:
        parse_policy(flavors={"x": {"kind": "gpu", **flavors}}, **settings)
    assert caught.value.errors == [f"hub.config.GPUPolicy.{message}"]


def test_once_a_flavor_has_a_price_every_flavor_needs_one():
    with pytest.raises(PolicyError) as caught:
        parse_policy(
            currency="EUR",
            flavors={"h200": {"kind": "gpu", "billing": {"price": 4}}, "t4": {"kind": "gpu"}},
        )
    assert caught.value.errors == [
        "hub.config.GPUPolicy.flavors.t4.billing: every flavor needs a price once one has "
        "(h200 has): add billing: {price: ...}"
    ]


# ---- a server's hours across a change of rate ------------------------------------------


def test_hours_across_a_change_are_billed_at_each_rate_in_force_then():
    # 120 h before the change at 2 units / 4 EUR, 120 h after at 3 / 6
    assert BILLING.billed("h200", 1.0, at(10), at(20)) == (600.0, 1200.0)
    # entirely before, entirely after: one rate each
    assert BILLING.billed("h200", 2.0, at(1), at(1, 3)) == (12.0, 24.0)
    assert BILLING.billed("h200", 0.5, at(16), at(16, 4)) == (6.0, 12.0)
    # a flavor no longer in the policy: a unit per GPU-hour, no price
    assert BILLING.billed("gone", 1.0, at(1), at(1, 2)) == (2.0, 0.0)
    assert (BILLING.rate_at("h200", CHANGE - 1).weight, BILLING.rate_at("h200", CHANGE).weight) == (
        2.0,
        3.0,
    )


def test_showback_bills_each_row_and_a_later_change_leaves_earlier_hours_alone():
    result = month_showback()
    assert result.units[("research", "ann", "h200")] == pytest.approx(600.0)
    assert result.cost[("research", "ann", "h200")] == pytest.approx(1200.0)
    assert result.units[("nlp", "nia", "a100")] == pytest.approx(20.0)
    assert result.cost[("vision", "vic", "h200")] == pytest.approx(30.0)
    # a new rate from December changes nothing in November
    later = parse_policy(
        currency="EUR",
        flavors={
            "h200": {
                "kind": "gpu",
                "billing": [
                    {"weight": 2, "price": 4.0},
                    {"from": "2026-11-15", "weight": 3, "price": 6.0},
                    {"from": "2026-12-01", "weight": 9, "price": 99.0},
                ],
            },
            "a100": {"kind": "gpu", "billing": {"weight": 1, "price": 1.5}},
        },
    )
    again = month_showback(billing=Billing.of(later))
    assert again.units == pytest.approx(result.units)
    assert again.cost == pytest.approx(result.cost)


# ---- the invoice ----------------------------------------------------------------------


def test_the_invoice_gathers_each_accounts_groups_children_under_their_parents_account():
    view = invoice_json(MONTH, "UTC", month_showback(), POLICY)
    assert view["currency"] == "EUR"
    accounts = {a["account"]: a for a in view["accounts"]}
    assert list(accounts) == ["CC-100", "GRANT-7", None]  # by name, none last
    research = accounts["CC-100"]
    assert [g["group"] for g in research["groups"]] == ["nlp", "research"]
    assert (research["gpu_hours"], research["billed_units"], research["cost"]) == (
        260.0,
        620.0,
        1230.0,
    )
    assert (accounts["GRANT-7"]["billed_units"], accounts["GRANT-7"]["cost"]) == (15.0, 30.0)
    assert (accounts[None]["gpu_hours"], accounts[None]["cost"]) == (4.0, 6.0)
    (h200,) = research["groups"][1]["flavors"]
    assert (h200["flavor"], h200["gpu_hours"], h200["billed_units"]) == ("h200", 240.0, 600.0)


def test_the_invoice_csv_has_a_row_per_account_group_and_flavor_and_is_spreadsheet_safe():
    policy = parse_policy(
        currency="EUR",
        flavors={"a100": {"kind": "gpu", "billing": {"price": 2}}},
        groups={"lab": {"account": "=HYPERLINK(1)", "quota": {"gpus": 1}}},
    )
    since, until = month_bounds(MONTH)
    records = [record("x", "lab", "ann", "a100", 1.0, at(2), at(2, 3))]
    result = showback(records, since, until, until, (), None, Billing.of(policy))
    rows = list(csv.reader(io.StringIO(invoice_csv(MONTH, result, policy))))
    assert rows == [
        ["month", "account", "group", "flavor", "gpu_hours", "billed_units", "cost", "currency"],
        [MONTH, "'=HYPERLINK(1)", "lab", "a100", "3.0000", "3.0000", "6.00", "EUR"],
    ]


def test_the_printable_invoice_has_a_section_per_account_with_its_total():
    page = invoice_page(MONTH, "Europe/Berlin", month_showback(), POLICY)
    assert page.count("<section") == 3
    assert "<h2>Account CC-100</h2>" in page
    assert "<h2>Groups without an account</h2>" in page
    assert "1,230.00 EUR" in page  # CC-100's total
    assert "H200" in page  # flavors by the names users see
    assert "billing time zone Europe/Berlin" in page
    assert "@media print" in page


# ---- showback's columns ---------------------------------------------------------------


def test_showback_gives_each_group_its_account_billed_units_and_cost():
    admin = Viewer("root", admin=True)
    result = month_showback()
    view = showback_json(MONTH, result, admin, True, None, {}, POLICY.charged_groups, "UTC", POLICY)
    groups = {g["group"]: g for g in view["groups"]}
    # a parent's totals include its children's, as its GPU-hours do
    assert groups["research"]["billed_units"] == pytest.approx(600 + 20 + 15)
    assert groups["research"]["cost"] == pytest.approx(1200 + 30 + 30)
    assert (groups["nlp"]["account"], groups["vision"]["account"]) == ("CC-100", "GRANT-7")
    assert groups["course"]["account"] is None
    users = {u["user"]: u for u in view["users"]}
    assert (users["ann"]["billed_units"], users["ann"]["cost"]) == (600.0, 1200.0)
    table = list(
        csv.DictReader(io.StringIO(showback_csv(MONTH, result, admin, True, None, POLICY)))
    )
    ann = next(row for row in table if row["user"] == "ann")
    assert (ann["account"], ann["billed_units"], ann["cost"], ann["currency"]) == (
        "CC-100",
        "600.0000",
        "1200.00",
        "EUR",
    )


def test_the_dashboards_showback_gives_billed_columns_and_a_budget_in_units_its_unit():
    from jupyterhub_gpu.service.showback_page import showback_section

    admin = Viewer("root", admin=True)
    budgets = {"course": {"budget": 500.0, "unit": "billed units"}}
    view = showback_json(
        MONTH, month_showback(), admin, True, None, budgets, POLICY.charged_groups, "UTC", POLICY
    )
    page = showback_section(view, admin=True)
    assert "<th>Account</th>" in page
    assert 'href="invoice?month=2026-11"' in page
    # the group's row (the users' table has the group, then the user)
    (course,) = [r for r in page.split("<tr>") if r.startswith('<td>course</td><td class="num">')]
    assert "500 billed units" in course
    assert "0.3 EUR" not in course  # course used an A100 for 4 GPU-hours: 6 EUR
    assert "6 EUR" in course
    # a member's page has the columns, not the invoice
    assert "invoice?month" not in showback_section(view, admin=False)
    # a site that bills nothing: no billing columns
    plain = parse_policy(flavors={"a100": {"kind": "gpu"}})
    since, until = month_bounds(MONTH)
    result = showback(RECORDS, since, until, until)
    bare = showback_json(MONTH, result, admin, True, None, {}, lambda g: (g,), "UTC", plain)
    assert "Account" not in showback_section(bare, admin=True)
