"""One owner's GPU-hours (or billed units) as ``api/usage`` shows them. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import words

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
