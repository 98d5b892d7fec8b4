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
