"""What ``api/history`` and ``api/showback`` answer, for one viewer.

A member sees their groups' totals and their own use; other members' use in a
group is one row, ``(others)``. Admins see everyone. Pure: no I/O.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from ..core.energy import emissions_kg, energy_coverage, unmetered_flavors
from ..core.model import Policy
from ..core.showback import Showback
from .views import Viewer

OTHERS = "(others)"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


#: the figures of a showback row, in order: GPU-hours, measured GPU-hours, utilised
#: GPU-hours, billed units, cost, GPU-hours whose energy was measured, kWh
FIGURES = 7


def _row_figures(result: Showback) -> Iterator[tuple[tuple[str, str, str], tuple[float, ...]]]:
    """Each (group, user, flavor) row of ``result`` with its figures (``FIGURES``), in
    the records' order."""
    measured, utilised = result.measured.get, result.utilised.get
    units, cost = result.units.get, result.cost.get
    metered, energy = result.metered.get, result.energy.get
    for key, hours in result.detail.items():
        yield (
            key,
            (
                hours,
                measured(key, 0.0),
                utilised(key, 0.0),
                units(key, hours),
                cost(key, 0.0),
                metered(key, 0.0),
                energy(key, 0.0),
            ),
        )


def showback_rows(
    result: Showback, viewer: Viewer, admin: bool, groups: set[str] | None
) -> list[tuple]:
    """(group, user, flavor, GPU-hours, measured GPU-hours, utilised GPU-hours, billed
    units, cost, metered GPU-hours, kWh) rows this viewer may see."""
    # one pass in the records' order, then sorted: an admin's month has a row per user
    # and flavor (10,000 at 5,000 users), so no per-row function calls or inner loops
    rows: dict[tuple[str, str, str], list[float]] = {}
    name = viewer.name
    for key, figures in _row_figures(result):
        group, user, flavor = key
        if groups is not None and group not in groups:
            continue
        shown = key if admin or user == name else (group, OTHERS, flavor)
        row = rows.get(shown)
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


def _hours(
    values: list[float], currency: str | None, factor: float | None = None
) -> dict[str, float | None]:
    used, measured, utilised, units, cost, metered, energy = values
    return {
        "gpu_hours": round(used, 4),
        # allocated versus utilised, where the GPUs' utilisation was measured (DCGM)
        "measured_gpu_hours": round(measured, 4) if measured else None,
        "utilised_gpu_hours": round(utilised, 4) if measured else None,
        # each hour at its flavor's rate in force then
        "billed_units": round(units, 4),
        "cost": round(cost, 2) if currency is not None else None,
        # the GPUs' energy, where servers held whole GPUs with power series (DCGM)
        "energy_measured_gpu_hours": round(metered, 4) if metered else None,
        "energy_kwh": round(energy, 4) if metered else None,
        "emissions_kg": round(emissions_kg(energy, factor), 4)
        if metered and factor is not None
        else None,
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
    for key, figures in _row_figures(result):
        into = targets.get(key[0])
        if into is None:
            into = targets[key[0]] = [
                sums[g] for g in charged(key[0]) if groups is None or g in groups
            ]
        if into:
            for total in into:
                for i, figure in enumerate(figures):
                    total[i] += figure
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


def energy_coverage_json(
    result: Showback, groups: set[str] | None, policy: Policy | None
) -> dict[str, Any] | None:
    """Which part of the visible groups' GPU-hours the kWh cover (None: nothing read):
    the readings' coverage as ``coverage_json`` gives it, the GPU-hours measured, on
    shared GPUs or MIG slices (a device's power is all its users': never measured) and
    of servers on whole GPUs without power series."""
    readings = coverage_json(result)
    if readings is None:
        return None
    covered = energy_coverage(
        result.detail,
        result.metered,
        unmetered_flavors(policy) if policy is not None else (),
        result.coverage,
        (lambda group: True) if groups is None else groups.__contains__,
    )
    return {
        **readings,
        "gpu_hours": round(covered.gpu_hours, 4),
        "measured_gpu_hours": round(covered.measured, 4),
        "shared_gpu_hours": round(covered.shared, 4),
        "gpu_hours_without_series": round(covered.without_series, 4),
        "complete": covered.complete,
        "note": covered.note(),
    }


def month_header(
    month: str, timezone: str, result: Showback, currency: str | None
) -> dict[str, Any]:
    """What a month's answer (showback, invoice) says of itself."""
    return {
        "month": month,
        # the billing time zone the month's bounds are taken in
        "timezone": timezone,
        "from": _iso(result.since),
        "to": _iso(result.until),
        # what ``cost`` is in (None: the site prices no flavor)
        "currency": currency,
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
    emissions_factor: float | None = None,
) -> dict[str, Any]:
    rows = showback_rows(result, viewer, admin, groups)
    by_group = group_totals(result, groups, charged)
    by_user = _sums(rows, 0, 1)
    by_flavor = _sums(rows, 0, 2)
    currency = policy.currency if policy is not None else None
    return {
        **month_header(month, timezone, result, currency),
        "groups": [
            {
                "group": g,
                "account": account_of(policy, g),
                **_hours(by_group[g], currency, emissions_factor),
                "budget": budgets.get(g),
            }
            for g in sorted(by_group)
        ],
        "users": [
            {"group": g, "user": u, **_hours(by_user[g, u], currency, emissions_factor)}
            for g, u in sorted(by_user)
        ],
        "flavors": [
            {"group": g, "flavor": f, **_hours(by_flavor[g, f], currency, emissions_factor)}
            for g, f in sorted(by_flavor)
        ],
        # a utilised figure with holes in its data says so, instead of under-reporting
        "utilised_coverage": coverage_json(result),
        # and so does the energy, with what was never measured (shared GPUs)
        "energy_coverage": energy_coverage_json(result, groups, policy),
        # grams of CO2 equivalent per kWh that ``emissions_kg`` is worked out with
        "emissions_factor_g_per_kwh": emissions_factor,
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
    emissions_factor: float | None = None,
) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    currency = policy.currency if policy is not None else None
    factor = emissions_factor
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
            "energy_kwh",
            *(["emissions_kg"] if factor is not None else []),
        ]
    )
    coverage = result.coverage
    # every row carries it: a spreadsheet's filtered rows still say what they cover
    covers = "" if coverage is None else (coverage.note() or "complete")
    accounts: dict[str, str] = {}
    for (
        group,
        user,
        flavor,
        hours,
        measured,
        utilised,
        units,
        cost,
        metered,
        energy,
    ) in showback_rows(result, viewer, admin, groups):
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
                f"{energy:.4f}" if metered > 0 else "",
                *(
                    [f"{emissions_kg(energy, factor):.4f}" if metered > 0 else ""]
                    if factor is not None
                    else []
                ),
            ]
        )
    return out.getvalue()
