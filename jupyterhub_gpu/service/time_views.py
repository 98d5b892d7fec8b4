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

from ..core.showback import Showback
from .views import Viewer

OTHERS = "(others)"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def showback_rows(
    result: Showback, viewer: Viewer, admin: bool, groups: set[str] | None
) -> list[tuple[str, str, str, float, float, float]]:
    """(group, user, flavor, GPU-hours, measured GPU-hours, utilised GPU-hours) rows
    this viewer may see."""
    rows: dict[tuple[str, str, str], list[float]] = {}
    for key, hours in result.detail.items():
        group, user, flavor = key
        if groups is not None and group not in groups:
            continue
        shown_user = user if admin or user == viewer.name else OTHERS
        row = rows.setdefault((group, shown_user, flavor), [0.0, 0.0, 0.0])
        row[0] += hours
        row[1] += result.measured.get(key, 0.0)
        row[2] += result.utilised.get(key, 0.0)
    return [(g, u, f, *values) for (g, u, f), values in sorted(rows.items())]


def _sums(rows, index) -> dict:
    sums: dict = defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        total = sums[index(row)]
        for i in range(3):
            total[i] += row[3 + i]
    return sums


def _hours(values: list[float]) -> dict[str, float | None]:
    used, measured, utilised = values
    return {
        "gpu_hours": round(used, 4),
        # allocated versus utilised, where the GPUs' utilisation was measured (DCGM)
        "measured_gpu_hours": round(measured, 4) if measured else None,
        "utilised_gpu_hours": round(utilised, 4) if measured else None,
    }


def group_totals(
    result: Showback, groups: set[str] | None, charged: Callable[[str], Iterable[str]]
) -> dict[str, list[float]]:
    """Each visible group's (GPU-hours, measured, utilised), its children's included:
    a server counts for its group and every parent above it (``charged``), as budgets
    and history count it. A parent's member sees the parent's total even where the
    children's rows are not theirs to read."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for key, hours in result.detail.items():
        values = (hours, result.measured.get(key, 0.0), result.utilised.get(key, 0.0))
        for group in charged(key[0]):
            if groups is None or group in groups:
                total = sums[group]
                for i in range(3):
                    total[i] += values[i]
    return sums


def showback_json(
    month: str,
    result: Showback,
    viewer: Viewer,
    admin: bool,
    groups: set[str] | None,
    budgets: dict[str, Any],
    charged: Callable[[str], Iterable[str]] = lambda group: (group,),
    timezone: str = "UTC",
) -> dict[str, Any]:
    rows = showback_rows(result, viewer, admin, groups)
    by_group = group_totals(result, groups, charged)
    by_user = _sums(rows, lambda r: (r[0], r[1]))
    by_flavor = _sums(rows, lambda r: (r[0], r[2]))
    return {
        "month": month,
        # the billing time zone the month's bounds are taken in
        "timezone": timezone,
        "from": _iso(result.since),
        "to": _iso(result.until),
        "groups": [
            {"group": g, **_hours(v), "budget": budgets.get(g)} for g, v in sorted(by_group.items())
        ],
        "users": [{"group": g, "user": u, **_hours(v)} for (g, u), v in sorted(by_user.items())],
        "flavors": [
            {"group": g, "flavor": f, **_hours(v)} for (g, f), v in sorted(by_flavor.items())
        ],
    }


#: what a spreadsheet takes as the start of a formula in a cell (CSV injection)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str) -> str:
    """A name as a spreadsheet shows it, never as a formula it runs: a username such as
    ``=HYPERLINK(...)`` comes from the identity provider, not from the admin."""
    return f"'{text}" if text.startswith(_FORMULA_STARTS) else text


def showback_csv(
    month: str, result: Showback, viewer: Viewer, admin: bool, groups: set[str] | None
) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [
            "month",
            "group",
            "user",
            "flavor",
            "gpu_hours",
            "measured_gpu_hours",
            "utilised_gpu_hours",
        ]
    )
    for group, user, flavor, hours, measured, utilised in showback_rows(
        result, viewer, admin, groups
    ):
        known = measured > 0
        writer.writerow(
            [
                month,
                _cell(group),
                _cell(user),
                _cell(flavor),
                f"{hours:.4f}",
                f"{measured:.4f}" if known else "",
                f"{utilised:.4f}" if known else "",
            ]
        )
    return out.getvalue()
