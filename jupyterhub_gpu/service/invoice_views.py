"""What ``api/invoice`` answers (JSON, CSV) and the printable invoice page.

One month, every account: each account's groups with their GPU-hours, billed units
and cost, by flavor, and the account's total. For admins and for a token with the
usage scope, as showback's every group is. Pure: no I/O.
"""

from __future__ import annotations

import csv
import io
from html import escape
from typing import Any

from ..core import words
from ..core.invoice import AccountLines, Amounts, invoice
from ..core.model import Policy
from ..core.showback import Showback
from .time_views import _cell, account_of, month_header

#: the heading of the use of groups that name no account (nor do their parents)
NO_ACCOUNT = "Groups without an account"


def invoice_lines(result: Showback, policy: Policy) -> list[AccountLines]:
    return invoice(result, lambda group: account_of(policy, group))


def _amounts(amounts: Amounts, currency: str | None) -> dict[str, Any]:
    return {
        "gpu_hours": round(amounts.gpu_hours, 4),
        "billed_units": round(amounts.billed_units, 4),
        "cost": round(amounts.cost, 2) if currency is not None else None,
    }


def invoice_json(month: str, timezone: str, result: Showback, policy: Policy) -> dict[str, Any]:
    currency = policy.currency
    return {
        **month_header(month, timezone, result, currency),
        "accounts": [
            {
                "account": lines.account,
                **_amounts(lines.total, currency),
                "groups": [
                    {
                        "group": line.group,
                        **_amounts(line.total, currency),
                        "flavors": [
                            {"flavor": flavor, **_amounts(amounts, currency)}
                            for flavor, amounts in sorted(line.flavors.items())
                        ],
                    }
                    for line in lines.groups.values()
                ],
            }
            for lines in invoice_lines(result, policy)
        ],
    }


def invoice_csv(month: str, result: Showback, policy: Policy) -> str:
    """One row per account, group and flavor (a spreadsheet sums them as it likes)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        ["month", "account", "group", "flavor", "gpu_hours", "billed_units", "cost", "currency"]
    )
    currency = policy.currency
    for lines in invoice_lines(result, policy):
        for line in lines.groups.values():
            for flavor, amounts in sorted(line.flavors.items()):
                writer.writerow(
                    [
                        month,
                        _cell(lines.account or ""),
                        _cell(line.group),
                        _cell(flavor),
                        f"{amounts.gpu_hours:.4f}",
                        f"{amounts.billed_units:.4f}",
                        f"{amounts.cost:.2f}" if currency is not None else "",
                        currency or "",
                    ]
                )
    return out.getvalue()


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem;color:#111827}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.8rem 0 .5rem}
.muted{color:#6b7280;font-size:.85rem}
table{border-collapse:collapse;width:100%;font-size:.9rem;margin-bottom:.4rem}
th,td{border-bottom:1px solid #e5e7eb;padding:.3rem .6rem;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:600;border-top:2px solid #111827}
section{break-inside:avoid}
@media print{body{margin:1cm}.screen{display:none}section{break-after:page}}
"""


def _money(amount: float, currency: str | None) -> str:
    return f"{amount:,.2f} {currency}" if currency is not None else "—"


def invoice_page(month: str, timezone: str, result: Showback, policy: Policy) -> str:
    """The month's invoice as one printable HTML document: a section (a printed page)
    per account."""
    currency = policy.currency
    sections = []
    for lines in invoice_lines(result, policy):
        rows = []
        for line in lines.groups.values():
            group = policy.find_group(line.group)
            name = group.display_name if group is not None else line.group
            for flavor, amounts in sorted(line.flavors.items()):
                shown = policy.flavors[flavor].display_name if flavor in policy.flavors else flavor
                rows.append(
                    f"<tr><td>{escape(name)}</td><td>{escape(shown)}</td>"
                    f'<td class="num">{amounts.gpu_hours:,.2f}</td>'
                    f'<td class="num">{amounts.billed_units:,.2f}</td>'
                    f'<td class="num">{escape(_money(amounts.cost, currency))}</td></tr>'
                )
        total = lines.total
        rows.append(
            f'<tr class="total"><td colspan="2">Total</td>'
            f'<td class="num">{total.gpu_hours:,.2f}</td>'
            f'<td class="num">{total.billed_units:,.2f}</td>'
            f'<td class="num">{escape(_money(total.cost, currency))}</td></tr>'
        )
        title = f"Account {lines.account}" if lines.account is not None else NO_ACCOUNT
        sections.append(
            f'<section data-account="{escape(lines.account or "")}">'
            f"<h2>{escape(title)}</h2>"
            "<table><thead><tr><th>Group</th><th>GPU type</th>"
            '<th class="num">GPU-hours</th><th class="num">Billed units</th>'
            f'<th class="num">Cost</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            "</section>"
        )
    period = (
        f"{words.moment(result.since)} to {words.moment(result.until)} (billing time zone "
        f"{escape(timezone)})"
    )
    body = "".join(sections) or "<p>No GPU time was used this month.</p>"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>GPU invoice {escape(month)}</title><style>{_CSS}</style></head><body>"
        f"<h1>GPU invoice, {escape(month)}</h1>"
        f'<p class="muted">{period}. Each hour is billed at its GPU type\'s rate in force '
        "then.</p>"
        f'<p class="screen muted"><a href="api/invoice?month={escape(month)}&amp;format=csv">'
        "CSV</a> · print this page for one page per account</p>"
        f"{body}</body></html>"
    )
