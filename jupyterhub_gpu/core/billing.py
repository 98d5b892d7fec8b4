"""What GPU time is billed: billed units and cost per flavor, at the rate in force.

A flavor's ``billing`` is a list of rates, oldest first (``policy.types.Rate``):
from each rate's ``since`` until the next one's, an hour of one GPU-equivalent
of it is billed ``weight`` units and costs ``price`` (None: not priced). A flavor
without rates bills 1 unit per GPU-equivalent-hour, so billed units equal
GPU-hours where a site sets none. A server's time is split at each change of
rate, so a change bills only the hours after it. Pure: no I/O; epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model import Policy, Rate
from .usage import HOUR

#: a flavor without rates: a unit per GPU-equivalent-hour, no price
UNBILLED = (Rate(),)


@dataclass(frozen=True)
class Billing:
    """The rates of every flavor (by name; one not listed: ``UNBILLED``) and the
    currency their prices are in."""

    rates: Mapping[str, tuple[Rate, ...]] = field(default_factory=dict)
    currency: str | None = None

    @classmethod
    def of(cls, policy: Policy) -> Billing:
        return cls(
            {name: f.billing for name, f in policy.flavors.items() if f.billing},
            policy.currency,
        )

    @property
    def weighted(self) -> bool:
        """Whether any hour is billed other than one unit per GPU-equivalent-hour."""
        return any(r.weight != 1.0 for rates in self.rates.values() for r in rates)

    def priced(self, flavor: str) -> bool:
        """Whether the flavor's hours have a price (all its rates have one, or none)."""
        rates = self.rates.get(flavor)
        return rates is not None and rates[0].price is not None

    def billed(self, flavor: str, gpus: float, start: float, end: float) -> tuple[float, float]:
        """The billed units and cost of ``gpus`` GPU-equivalents of ``flavor`` held
        from ``start`` to ``end``, each part at the rate in force then (cost 0 for a
        flavor not priced: see ``priced``)."""
        rates = self.rates.get(flavor, UNBILLED)
        if len(rates) == 1:
            # the hours as showback works them out, to the last bit: one rate is the
            # GPU-hours times its weight (1: the GPU-hours themselves)
            hours = gpus * (end - start) / HOUR
            rate = rates[0]
            return hours * rate.weight, hours * (rate.price or 0.0)
        units = cost = 0.0
        for lo, hi, rate in self.spans(flavor, start, end):
            hours = gpus * (hi - lo) / HOUR
            units += hours * rate.weight
            cost += hours * (rate.price or 0.0)
        return units, cost

    def spans(
        self, flavor: str | None, start: float, end: float
    ) -> Iterable[tuple[float, float, Rate]]:
        """The parts of ``start`` to ``end`` each under one rate of ``flavor``, oldest
        first, with that rate (parts of no length left out)."""
        rates = self.rates.get(flavor, UNBILLED) if flavor is not None else UNBILLED
        for i, rate in enumerate(rates):
            until = rates[i + 1].since if i + 1 < len(rates) else math.inf
            lo = start if start > rate.since else rate.since
            hi = end if end < until else until
            if hi > lo:
                yield lo, hi, rate

    def rate_at(self, flavor: str, at: float) -> Rate:
        """The rate of ``flavor`` in force at ``at``."""
        found = UNBILLED[0]
        for rate in self.rates.get(flavor, UNBILLED):
            if rate.since <= at:
                found = rate
        return found

    def hourly_units(self, policy: Policy, devices: Iterable[tuple[str, int]], at: float) -> float:
        """Billed units an hour of ``devices`` (flavor, units) costs at ``at``: each
        device's GPU-equivalents times its flavor's weight then."""
        total = 0.0
        for name, count in devices:
            flavor = policy.flavors.get(name)
            if flavor is not None:
                total += count * float(flavor.unit_equivalents) * self.rate_at(name, at).weight
        return total
