"""The dashboard's showback section: this month's GPU-hours by group and user, and
where the site bills, each group's account, billed units and cost; where the GPUs'
power was measured, each group's kWh (and emissions, with a factor) (pure, no I/O)."""

from __future__ import annotations

from html import escape
from typing import Any

from ..core import words


def billed_here(showback: dict[str, Any]) -> bool:
    """Whether the site bills anything but a unit per GPU-hour: prices, weights or
    accounts (then showback gives each group's billed units, cost and account)."""
    return showback.get("currency") is not None or any(
        g.get("account") is not None or abs(g.get("billed_units", 0) - g["gpu_hours"]) > 5e-5
        for g in showback["groups"]
    )


def _billing_cells(item: dict[str, Any], currency: str | None) -> str:
    cost = item.get("cost")
    money = f"{words.number(cost, grouped=True)} {currency}" if cost is not None else ""
    return (
        f"<td>{escape(item.get('account') or '')}</td>"
        f'<td class="num">{words.number(item["billed_units"], grouped=True)}</td>'
        f'<td class="num">{escape(money)}</td>'
    )


def _energy_cells(item: dict[str, Any], emissions: bool) -> str:
    kwh, kg = item.get("energy_kwh"), item.get("emissions_kg")
    cells = f'<td class="num">{words.number(kwh, grouped=True) if kwh is not None else ""}</td>'
    if emissions:
        cells += f'<td class="num">{words.number(kg, grouped=True) if kg is not None else ""}</td>'
    return cells


def showback_section(showback: dict[str, Any] | None, admin: bool = False) -> str:
    if not showback:
        return ""
    month = showback["month"]
    billed = billed_here(showback)
    # columns for the energy only where some was measured this month
    energy = any(g.get("energy_kwh") is not None for g in showback["groups"])
    emissions = energy and showback.get("emissions_factor_g_per_kwh") is not None
    currency = showback.get("currency")
    rows = []
    per_flavor: dict[str, list[str]] = {}
    for item in showback["flavors"]:
        per_flavor.setdefault(item["group"], []).append(
            f"{item['flavor']} {words.number(item['gpu_hours'], grouped=True)}"
        )
    for item in showback["groups"]:
        budget = item.get("budget")
        cap = words.number(budget["budget"], grouped=True) if budget else ""
        if budget and budget.get("unit") == words.BILLED_UNITS:
            cap += f" {words.BILLED_UNITS}"  # the column's numbers are GPU-hours otherwise
        busy = ""
        if item.get("measured_gpu_hours"):
            busy = "{} of {}".format(
                *words.numbers(
                    [item["utilised_gpu_hours"], item["measured_gpu_hours"]], grouped=True
                )
            )
        rows.append(
            f"<tr><td>{escape(item['group'])}</td>"
            f'<td class="num">{words.number(item["gpu_hours"], grouped=True)}</td>'
            f"<td>{escape(', '.join(per_flavor.get(item['group'], [])))}</td>"
            f'<td class="num">{busy}</td>'
            # the energy beside the utilisation (both measured by DCGM), the money last
            + (_energy_cells(item, emissions) if energy else "")
            + f'<td class="num">{cap}</td>'
            + (_billing_cells(item, currency) if billed else "")
            + "</tr>"
        )
    users = [
        f"<tr><td>{escape(u['group'])}</td><td>{escape(u['user'])}</td>"
        f'<td class="num">{words.number(u["gpu_hours"], grouped=True)}</td></tr>'
        for u in sorted(showback["users"], key=lambda u: -u["gpu_hours"])[:50]
    ]
    link = f"api/showback?month={month}&amp;format=csv"
    # what the figures do not cover; the energy's only beside its column
    coverages = [
        showback.get("utilised_coverage"),
        showback.get("energy_coverage") if energy else None,
    ]
    note = "".join(
        f'<p class="muted coverage">{escape(coverage["note"])}</p>'
        for coverage in coverages
        if coverage and coverage.get("note")
    )
    invoice = (
        f' · <a href="invoice?month={escape(month)}">Invoice</a> (by account, printable)'
        if admin and billed
        else ""
    )
    billing_heads = (
        '<th>Account</th><th class="num" title="each hour at its GPU type\'s rate in force '
        'then">Billed units</th><th class="num">Cost</th>'
        if billed
        else ""
    )
    energy_heads = (
        '<th class="num" title="the energy of the GPUs held whole by servers whose power '
        'was measured (DCGM)">kWh</th>'
        + (
            f'<th class="num" title="at {words.number(showback["emissions_factor_g_per_kwh"])} '
            'g CO₂e per kWh">kg CO₂e</th>'
            if emissions
            else ""
        )
        if energy
        else ""
    )
    return (
        f"<h2>Showback for {escape(month)}</h2>"
        f'<p><a href="{link}" download>Download CSV</a> (GPU-hours by group, user and flavor)'
        f"{invoice}</p>"
        + note
        + (
            '<table class="showback"><tr><th>Group</th><th class="num">GPU-hours</th>'
            '<th>By flavor</th><th class="num" title="GPU-hours the GPUs were busy, of those '
            'whose utilisation was measured (DCGM)">Busy GPU-hours</th>'
            f'{energy_heads}<th class="num">Budget</th>{billing_heads}</tr>'
            + "".join(rows)
            + "</table>"
            if rows
            else '<p class="muted">No GPU use this month.</p>'
        )
        + (
            '<h3>By user</h3><table class="showback-users"><tr><th>Group</th><th>User</th>'
            '<th class="num">GPU-hours</th></tr>' + "".join(users) + "</table>"
            if users
            else ""
        )
    )
