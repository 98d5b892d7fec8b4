"""A month's invoice: each account's groups, their GPU-hours, billed units and cost.

A group's use is billed to its ``account``, or to its nearest parent's: a parent's
account gathers its children's use unless a child names its own. Groups without
an account are gathered under none (``None``). Read from a month's showback
(``showback.Showback``), whose hours, units and cost are already each hour's at the
rate in force then. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .showback import Showback


@dataclass
class Amounts:
    """GPU-hours, billed units and cost (0 where nothing is priced)."""

    gpu_hours: float = 0.0
    billed_units: float = 0.0
    cost: float = 0.0

    def add(self, hours: float, units: float, cost: float) -> None:
        self.gpu_hours += hours
        self.billed_units += units
        self.cost += cost


@dataclass
class GroupLine:
    group: str
    total: Amounts = field(default_factory=Amounts)
    #: by flavor
    flavors: dict[str, Amounts] = field(default_factory=dict)


@dataclass
class AccountLines:
    account: str | None
    total: Amounts = field(default_factory=Amounts)
    #: by group
    groups: dict[str, GroupLine] = field(default_factory=dict)


def invoice(result: Showback, account_of: Callable[[str], str | None]) -> list[AccountLines]:
    """Each account's lines from a month's showback, accounts by name (none last),
    groups and flavors by name within them."""
    accounts: dict[str | None, AccountLines] = {}
    of_group: dict[str, str | None] = {}
    units, cost = result.units.get, result.cost.get
    for key in sorted(result.detail):
        group, _user, flavor = key
        if group not in of_group:
            of_group[group] = account_of(group)
        account = of_group[group]
        lines = accounts.get(account)
        if lines is None:
            lines = accounts[account] = AccountLines(account)
        line = lines.groups.get(group)
        if line is None:
            line = lines.groups[group] = GroupLine(group)
        hours = result.detail[key]
        figures = (hours, units(key, hours), cost(key, 0.0))
        lines.total.add(*figures)
        line.total.add(*figures)
        line.flavors.setdefault(flavor, Amounts()).add(*figures)
    return sorted(accounts.values(), key=lambda a: (a.account is None, a.account or ""))
