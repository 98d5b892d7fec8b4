"""Decayed usage: what a usage record weighs in fair share at a given time.

A record holding ``gpus`` GPU-equivalents from ``start`` to ``end`` adds, at time
``now``,

    ∫ gpus · 2^(-(now - t) / half_life) dt   over [start, end]

GPU-seconds: GPU time a half-life ago counts half, two half-lives ago a quarter.

With ``fair_share.count: billed_units`` it adds billed unit-seconds instead: each
part of the record's life at its flavor's billing weight in force then
(``Billing.spans``), ``weight · gpus`` in place of ``gpus``. An hour of a flavor
weighted 3 weighs three hours of one weighted 1 (Slurm's billing TRES), and a
record across a change of rate weighs each part at its own weight: the integral of
an exponential has a closed form, so each part is integrated exactly, never
sampled. A flavor without rates weighs 1, so a site that bills nothing counts the
same either way.

Pure: no I/O; times are epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable

from .billing import Billing
from .model import Policy
from .usage import HOUR, UsageRecord

LN2 = math.log(2.0)


def decayed_seconds(gpus: float, start: float, end: float, at: float, half_life: float) -> float:
    """GPU-equivalent-seconds of ``gpus`` held from ``start`` to ``end``, decayed to ``at``."""
    if end <= start:
        return 0.0
    k = LN2 / half_life
    # ∫ e^{-k(at - t)} dt over [start, end], as e^{-k(at - end)} (1 - e^{-k(end - start)}):
    # expm1 keeps a short span exact
    return gpus / k * math.exp(-k * (at - end)) * -math.expm1(-k * (end - start))


def decayed_units(
    billing: Billing | None,
    flavor: str | None,
    gpus: float,
    start: float,
    end: float,
    at: float,
    half_life: float,
) -> float:
    """``decayed_seconds`` as fair share counts them: GPU-equivalent-seconds (``billing``
    None), or billed unit-seconds, each part of ``start`` to ``end`` at the weight of
    ``flavor``'s rate in force then, each part integrated exactly."""
    if billing is None:
        return decayed_seconds(gpus, start, end, at, half_life)
    rates = billing.rates.get(flavor) if flavor is not None else None
    if not rates:  # a flavor without rates: a unit per GPU-equivalent-hour
        return decayed_seconds(gpus, start, end, at, half_life)
    # most records lie within one rate (all of them where a flavor has one): one part
    last = rates[-1]
    if start >= last.since:
        return last.weight * decayed_seconds(gpus, start, end, at, half_life)
    if len(rates) == 1 or end <= rates[1].since:
        return rates[0].weight * decayed_seconds(gpus, start, end, at, half_life)
    return sum(
        rate.weight * decayed_seconds(gpus, lo, hi, at, half_life)
        for lo, hi, rate in billing.spans(flavor, start, end)
    )


def counted_billing(policy: Policy) -> Billing | None:
    """The rates fair share weighs usage by: the policy's with ``count: billed_units``,
    else None (every GPU-equivalent-hour alike)."""
    fair = policy.fair_share
    if fair is None or fair.count != "billed_units":
        return None
    return Billing.of(policy)


def decayed_hours(
    records: Iterable[UsageRecord],
    now: float,
    half_life: float,
    running: Container[str] = (),
    billing: Billing | None = None,
) -> float:
    """The decayed GPU-hours (billed units with ``billing``) of ``records`` at ``now``,
    summed afresh (what the book keeps incrementally; for checks and for a few records)."""
    total = 0.0
    for r in records:
        end = min(r.end(now, running), now)
        total += decayed_units(billing, r.flavor, r.gpus, r.started, end, now, half_life)
    return total / HOUR


def usage_since(
    policy: Policy,
    records: Iterable[UsageRecord],
    since: float,
    now: float,
    half_life: float,
    running: Container[str] = (),
    billing: Billing | None = None,
) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """The decayed GPU-hours (billed units with ``billing``; at ``now``) that each group
    and member used after ``since``: taken from their usage now, what is left is their
    usage at ``since`` (decayed on to ``now``), so a standing then needs only the records
    since."""
    groups: dict[str, float] = {}
    members: dict[tuple[str, str], float] = {}
    for r in records:
        end = min(r.end(now, running), now)
        start = max(r.started, since)
        hours = decayed_units(billing, r.flavor, r.gpus, start, end, now, half_life) / HOUR
        if hours <= 0:
            continue
        for name in policy.charged_groups(r.group):
            groups[name] = groups.get(name, 0.0) + hours
        members[(r.user, r.group)] = members.get((r.user, r.group), 0.0) + hours
    return groups, members
