"""One owner's GPU-hours (or billed units) as ``api/usage`` shows them. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

from ..core import words
from ..core.budgets import UsageRecord, gpu_hours
from ..core.model import Budget

#: the window of GPU-hours shown for a group without a budget
DEFAULT_WINDOW = 30 * 86400


@dataclass(frozen=True)
class HoursView:
    """One owner's GPU-hours, as ``api/usage`` shows them (billed units, for a budget in
    units: ``in_units``)."""

    used: float
    budget: float | None
    period: int
    exhausted: bool = False
    in_units: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "used": round(self.used, 4),
            "budget": self.budget,
            "period_seconds": self.period,
            "exhausted": self.exhausted,
            # what ``used`` and ``budget`` count: "GPU-hours", or "billed units"
            "unit": words.BILLED_UNITS if self.in_units else words.GPU_HOURS,
        }


def hours_view(
    records: Iterable[UsageRecord], budget: Budget | None, now: float, running: Container[str]
) -> HoursView:
    """GPU-hours of ``records`` in ``budget``'s window (30 days without one), and the budget."""
    period = budget.period if budget else DEFAULT_WINDOW
    used = gpu_hours(records, now - period, now, running)
    cap = budget.amount if budget else None
    return HoursView(used, cap, period, cap is not None and used >= cap)
