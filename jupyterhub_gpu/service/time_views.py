"""What ``api/history`` and ``api/showback`` answer, for one viewer.

A member sees their groups' totals and their own use; other members' use in a
group is one row, ``(others)``. Admins see everyone. Pure: no I/O.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from ..core.showback import Showback
from .views import Viewer

OTHERS = "(others)"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def showback_rows(
    result: Showback, viewer: Viewer, admin: bool, groups: set[str] | None
) -> list[tuple[str, str, str, float]]:
    """(group, user, flavor, GPU-hours) rows this viewer may see."""
    rows: dict[tuple[str, str, str], float] = defaultdict(float)
    for (group, user, flavor), hours in result.detail.items():
        if groups is not None and group not in groups:
            continue
        shown_user = user if admin or user == viewer.name else OTHERS
        rows[(group, shown_user, flavor)] += hours
    return [(g, u, f, h) for (g, u, f), h in sorted(rows.items())]


def showback_json(
    month: str,
    result: Showback,
    viewer: Viewer,
    admin: bool,
    groups: set[str] | None,
    budgets: dict[str, Any],
) -> dict[str, Any]:
    rows = showback_rows(result, viewer, admin, groups)
    by_group: dict[str, float] = defaultdict(float)
    by_user: dict[tuple[str, str], float] = defaultdict(float)
    by_flavor: dict[tuple[str, str], float] = defaultdict(float)
    for group, user, flavor, hours in rows:
        by_group[group] += hours
        by_user[(group, user)] += hours
        by_flavor[(group, flavor)] += hours
    return {
        "month": month,
        "from": _iso(result.since),
        "to": _iso(result.until),
        "groups": [
            {"group": g, "gpu_hours": round(h, 4), "budget": budgets.get(g)}
            for g, h in sorted(by_group.items())
        ],
        "users": [
            {"group": g, "user": u, "gpu_hours": round(h, 4)}
            for (g, u), h in sorted(by_user.items())
        ],
        "flavors": [
            {"group": g, "flavor": f, "gpu_hours": round(h, 4)}
            for (g, f), h in sorted(by_flavor.items())
        ],
    }


def showback_csv(
    month: str, result: Showback, viewer: Viewer, admin: bool, groups: set[str] | None
) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["month", "group", "user", "flavor", "gpu_hours"])
    for group, user, flavor, hours in showback_rows(result, viewer, admin, groups):
        writer.writerow([month, group, user, flavor, f"{hours:.4f}"])
    return out.getvalue()
