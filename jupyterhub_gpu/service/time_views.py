"""What ``api/history`` and ``api/showback`` answer, for one viewer.

A member sees their groups' totals and their own use; other members' use in a
group is one row, ``(others)``. Admins see everyone. Pure: no I/O.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from ..core.model import Policy
from ..core.showback import Showback
from .views import Viewer

OTHERS = "(others)"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


#: the figures of a showback row, in order: GPU-hours, measured GPU-hours, utilised
#: GPU-hours, billed units, cost
FIGURES = 5


def showback_rows(
    result: Showback, viewer: Viewer, admin: bool, groups: set[str] | None
) -> list[tuple]:
    """(group, user, flavor, GPU-hours, measured GPU-hours, utilised GPU-hours, billed
    units, cost) rows this viewer may see."""
    # one pass in the records' order, then sorted: an admin's month has a row per user
    # and flavor (10,000 at 5,000 users), so no per-row function calls or inner loops
    rows: dict[tuple[str, str, str], list[float]] = {}
    measured, utilised = result.measured.get, result.utilised.get
    units, cost = result.units.get, result.cost.get
    name = viewer.name
    for key, hours in result.detail.items():
        group, user, flavor = key
        if groups is not None and group not in groups:
            continue
        shown = key if admin or user == name else (group, OTHERS, flavor)
        row = rows.get(shown)
        figures = (hours, measured(key, 0.0), utilised(key, 0.0), units(key, hours), cost(key, 0.0))
        if row is None:
            rows[shown] = [0.0 + figure for figure in figures]
        else:
            for i, figure in enumerate(figures):
                row[i] += figure
    return [(*key, *rows[key]) for key in sorted(rows)]


def _sums(rows, first: int, second: int) -> dict:
    """Rows summed by (row[first], row[second]), in the rows' order."""
    sums: dict = {}
    for row in rows:
        key = (row[first], row[second])
        total = sums.get(key)
        if total is None:
            sums[key] = [0.0 + figure for figure in row[3:]]
        else:
            for i, figure in enumerate(row[3:]):
                total[i] += figure
    return sums


def _hours(values: list[float], currency: str | None) -> dict[str, float | None]:
    used, measured, utilised, units, cost = values
    return {
        "gpu_hours": round(used, 4),
        # allocated versus utilised, where the GPUs' utilisation was measured (DCGM)
        "measured_gpu_hours": round(measured, 4) if measured else None,
        "utilised_gpu_hours": round(utilised, 4) if measured else None,
        # each hour at its flavor's rate in force then
        "billed_units": round(units, 4),
        "cost": round(cost, 2) if currency is not None else None,
    }


def group_totals(
    result: Showback, groups: set[str] | None, charged: Callable[[str], Iterable[str]]
) -> dict[str, list[float]]:
    """Each visible group's figures (``FIGURES``), its children's included:
    a server counts for its group and every parent above it (``charged``), as budgets
    and history count it. A parent's member sees the parent's total even where the
    children's rows are not theirs to read."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0] * FIGURES)
    # the groups a group's use counts for, worked out once per group, not per row
    targets: dict[str, list[list[float]]] = {}
    measured, utilised = result.measured.get, result.utilised.get
    units, cost = result.units.get, result.cost.get
    for key, hours in result.detail.items():
        into = targets.get(key[0])
        if into is None:
            into = targets[key[0]] = [
                sums[g] for g in charged(key[0]) if groups is None or g in groups
            ]
        if into:
            figures = (hours, measured(key, 0.0), utilised(key, 0.0), units(key, hours))
            spent = cost(key, 0.0)
            for total in into:
                total[0] += figures[0]
                total[1] += figures[1]
                total[2] += figures[2]
                total[3] += figures[3]
                total[4] += spent
    return {g: v for g, v in sums.items()}


def coverage_json(result: Showback) -> dict[str, Any] | None:
    """Which part of the month the utilised figures cover (None: no utilisation read,
    no Prometheus configured or no GPU use): hours with DCGM samples, the spans without
    any (Prometheus' retention, an exporter down) and hours not read yet."""
    coverage = result.coverage
    if coverage is None:
        return None
    return {
        "from": _iso(coverage.since),
        "to": _iso(coverage.until),
        "read_until": _iso(coverage.read_until) if coverage.read_until is not None else None,
        "hours_with_data": round(coverage.covered / 3600, 2),
        "hours_without_data": round(coverage.missing / 3600, 2),
        "hours_not_read": round(coverage.unread / 3600, 2),
        "without_data": [{"from": _iso(a), "to": _iso(b)} for a, b in coverage.gaps],
        "complete": coverage.complete,
        "note": coverage.note(),
    }


def showback_json(
    month: str,
    result: Showback,
    viewer: Viewer,
    admin: bool,
    groups: set[str] | None,
    budgets: dict[str, Any],
    charged: Callable[[str], Iterable[str]] = lambda group: (group,),
    timezone: str = "UTC",
    policy: Policy | None = None,
) -> dict[str, Any]:
    rows = showback_rows(result, viewer, admin, groups)
    by_group = group_totals(result, groups, charged)
    by_user = _sums(rows, 0, 1)
    by_flavor = _sums(rows, 0, 2)
    currency = policy.currency if policy is not None else None
    return {
        "month": month,
        # the billing time zone the month's bounds are taken in
        "timezone": timezone,
        "from": _iso(result.since),
        "to": _iso(result.until),
        # what ``cost`` is in (None: the site prices no flavor)
        "currency": currency,
        "groups": [
            {
                "group": g,
                "account": account_of(policy, g),
                **_hours(by_group[g], currency),
                "budget": budgets.get(g),
            }
            for g in sorted(by_group)
        ],
        "users": [
            {"group": g, "user": u, **_hours(by_user[g, u], currency)} for g, u in sorted(by_user)
        ],
        "flavors": [
            {"group": g, "flavor": f, **_hours(by_flavor[g, f], currency)}
            for g, f in sorted(by_flavor)
        ],
        # a utilised figure with holes in its data says so, instead of under-reporting
        "utilised_coverage": coverage_json(result),
    }


#: what a spreadsheet takes as the start of a formula in a cell (CSV injection)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str) -> str:
    """A name as a spreadsheet shows it, never as a formula it runs: a username such as
    ``=HYPERLINK(...)`` comes from the identity provider, not from the admin."""
    return f"'{text}" if text.startswith(_FORMULA_STARTS) else text


def account_of(policy: Policy | None, group: str) -> str | None:
    """The account a group's use is billed to (its own or a parent's); None for none,
    or for a group the policy no longer has."""
    if policy is None or policy.find_group(group) is None:
        return None
    return policy.account_of(group)


def showback_csv(
    month: str,
    result: Showback,
    viewer: Viewer,
    admin: bool,
    groups: set[str] | None,
    policy: Policy | None = None,
) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    currency = policy.currency if policy is not None else None
    writer.writerow(
        [
            "month",
            "group",
            "user",
            "flavor",
            "gpu_hours",
            "measured_gpu_hours",
            "utilised_gpu_hours",
            "utilised_coverage",
            # added after the others: a spreadsheet reading the first columns reads on
            "account",
            "billed_units",
            "cost",
            "currency",
        ]
    )
    coverage = result.coverage
    # every row carries it: a spreadsheet's filtered rows still say what they cover
    covers = "" if coverage is None else (coverage.note() or "complete")
    accounts: dict[str, str] = {}
    for group, user, flavor, hours, measured, utilised, units, cost in showback_rows(
        result, viewer, admin, groups
    ):
        known = measured > 0
        account = accounts.get(group)
        if account is None:
            account = accounts[group] = account_of(policy, group) or ""
        writer.writerow(
            [
                month,
                _cell(group),
                _cell(user),
                _cell(flavor),
                f"{hours:.4f}",
                f"{measured:.4f}" if known else "",
                f"{utilised:.4f}" if known else "",
                covers if known else "",
                _cell(account),
                f"{units:.4f}",
                f"{cost:.2f}" if currency is not None else "",
                currency or "",
            ]
        )
    return out.getvalue()
