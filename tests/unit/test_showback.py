"""History and showback arithmetic (pure): averages per step, sums per month."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.core.showback import ShowbackError, history, month_bounds, showback

NOV = datetime(2026, 11, 1, tzinfo=UTC).timestamp()
H = 3600.0


def record(uid, user, group, flavor, gpus, start, end):
    return UsageRecord(uid, f"ns/{uid}", user, group, "p", flavor, gpus, start, end, end)


def test_history_averages_each_step_and_stacks_by_flavor():
    records = [
        record("a", "ann", "lab", "a100", 2, NOV + 0.5 * H, NOV + 2 * H),
        record("b", "bob", "lab", "mig-1g5", 1 / 7, NOV, NOV + 3 * H),
    ]
    series = history(records, NOV, NOV + 3 * H, H, now=NOV + 10 * H)
    assert series.times == [NOV, NOV + H, NOV + 2 * H]
    assert series.values["a100"] == [1.0, 2.0, 0.0]  # half the first hour, all the second
    assert series.values["mig-1g5"] == pytest.approx([1 / 7] * 3)


def test_history_refuses_too_many_points():
    with pytest.raises(ShowbackError, match="at most 10000"):
        history([], NOV, NOV + 365 * 86400, 60, now=NOV)


def test_showback_sums_a_month_by_group_user_and_flavor_cutting_at_its_edges():
    since, until = month_bounds("2026-11")
    assert until - since == 30 * 86400
    records = [
        # began in October: only November's part counts
        record("a", "ann", "lab", "a100", 1, NOV - 5 * H, NOV + 5 * H),
        record("b", "bob", "lab", "a100", 2, NOV + H, NOV + 2 * H),
        record("c", "cat", "course", None, 0.25, NOV, NOV + 4 * H),
    ]
    result = showback(records, since, until, now=until)
    assert result.groups == {"lab": 7.0, "course": 1.0}
    assert result.users == {("lab", "ann"): 5.0, ("lab", "bob"): 2.0, ("course", "cat"): 1.0}
    assert result.flavors == {("lab", "a100"): 7.0, ("course", "(none)"): 1.0}


@pytest.mark.parametrize("month", ["2026-13", "26-11", "November", "", "2026-11; DROP"])
def test_a_bad_month_names_the_format(month):
    with pytest.raises(ShowbackError, match="month: expected YYYY-MM"):
        month_bounds(month)


def test_the_showback_csv_never_hands_a_spreadsheet_a_formula():
    import csv
    import io

    from jupyterhub_gpu.service.time_views import showback_csv
    from jupyterhub_gpu.service.views import Viewer

    since, until = month_bounds("2026-11")
    names = ['=HYPERLINK("http://x","y")', "+1", "-2", "@SUM(A1)", "ann"]
    records = [record(str(i), name, "lab", "a100", 1, NOV, NOV + H) for i, name in enumerate(names)]
    text = showback_csv(
        "2026-11",
        showback(records, since, until, now=until),
        Viewer("root", admin=True),
        True,
        None,
    )
    users = [row["user"] for row in csv.DictReader(io.StringIO(text))]
    # each name is there, whole, behind an apostrophe that makes it text
    assert sorted(users) == sorted(["'" + n for n in names[:4]] + ["ann"])


def test_a_history_longer_than_a_year_is_refused_before_reading():
    from jupyterhub_gpu.core.showback import check_history

    assert check_history(NOV, NOV + 366 * 86400, 86400) == 366
    with pytest.raises(ShowbackError, match="at most 366 days of history at once"):
        check_history(0, NOV, 30 * 86400)


def test_a_month_is_taken_in_the_billing_time_zone():
    from zoneinfo import ZoneInfo

    from jupyterhub_gpu.core.showback import month_of

    berlin = ZoneInfo("Europe/Berlin")
    since, until = month_bounds("2026-11", berlin)
    assert datetime.fromtimestamp(since, UTC) == datetime(2026, 10, 31, 23, tzinfo=UTC)
    assert datetime.fromtimestamp(until, UTC) == datetime(2026, 11, 30, 23, tzinfo=UTC)
    # October has the change back from summer time: 31 days and an hour
    since, until = month_bounds("2026-10", berlin)
    assert until - since == 31 * 86400 + 3600
    # December ends at the new year's midnight there
    assert datetime.fromtimestamp(month_bounds("2026-12", berlin)[1], berlin).year == 2027
    # 23:30 UTC on 30 November is December in Berlin
    assert month_of(datetime(2026, 11, 30, 23, 30, tzinfo=UTC).timestamp(), berlin) == "2026-12"


def test_a_parents_showback_total_includes_its_childrens_use():
    from jupyterhub_gpu.core.model import parse_policy
    from jupyterhub_gpu.service.time_views import showback_json
    from jupyterhub_gpu.service.views import Viewer

    policy = parse_policy(
        flavors={"g": {"kind": "gpu"}},
        profiles={"p": {"gpu": {"flavor": "g"}}},
        groups={
            "uni": {"quota": {"gpus": 8}, "profiles": ["p"]},
            "lab": {"parent": "uni", "quota": {"gpus": 4}, "profiles": ["p"]},
        },
    )
    since, until = month_bounds("2026-11")
    records = [
        record("a", "ann", "uni", "g", 1, NOV, NOV + 2 * H),
        record("b", "bob", "lab", "g", 1, NOV, NOV + 3 * H),
    ]
    result = showback(records, since, until, now=until)

    def totals(viewer, admin, groups):
        view = showback_json(
            "2026-11", result, viewer, admin, groups, {}, policy.charged_groups, "Europe/Berlin"
        )
        assert view["timezone"] == "Europe/Berlin"
        return {g["group"]: g["gpu_hours"] for g in view["groups"]}, view

    everything, view = totals(Viewer("root", admin=True), True, None)
    assert everything == {"uni": 5.0, "lab": 3.0}  # uni's own 2 and lab's 3
    # a member of uni alone sees uni's whole total, and no row of lab's
    mine, view = totals(Viewer("ann", groups=frozenset({"uni"})), False, {"uni"})
    assert mine == {"uni": 5.0}
    assert {u["group"] for u in view["users"]} == {"uni"}
