"""The usage book in billed units, for budgets stated in units (``budget: {units}``).

Each record is kept as its parts at each rate of its flavor (``billing``): a part
holds the record's GPU-equivalents times the rate's weight, from when the rate (or
the record) begins to when the next rate (or the record) does, so the book's sums
(``UsageBook.used``, ``room_returns``, ``window_seconds``) are billed unit-seconds,
each hour at the rate in force then, by the same arithmetic as GPU-seconds. A flavor
with one rate has one part, under the record's own uid.

An open record is split at the changes up to its last sighting: its last part is
open, and counts up to now while its server runs. The service sees a running pod
again every pass, so a change of rate splits its record at the next pass. Pure: no
I/O; epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import replace

from .billing import UNBILLED, Billing
from .model import Budget, Policy
from .usage import UsageRecord
from .usage_book import Owner, UsageBook


def billed_parts(record: UsageRecord, billing: Billing) -> list[UsageRecord]:
    """``record`` as its parts at each rate of its flavor, oldest first."""
    rates = billing.rates.get(record.flavor or "", UNBILLED)
    if len(rates) == 1:
        return [replace(record, gpus=record.gpus * rates[0].weight)]
    # an open record is split up to its last sighting (see the module's words)
    bound = record.ended if record.ended is not None else record.last_seen
    parts = []
    for i, rate in enumerate(rates):
        until = rates[i + 1].since if i + 1 < len(rates) else math.inf
        if until <= record.started and i + 1 < len(rates):
            continue  # this rate ended before the record began
        start = record.started if record.started > rate.since else rate.since
        if parts and start >= bound:
            break  # the record ended (or was last seen) before this rate began
        last = until >= bound or i + 1 == len(rates)
        parts.append(
            replace(
                record,
                uid=f"{record.uid}#{i}",
                gpus=record.gpus * rate.weight,
                started=start,
                last_seen=record.last_seen if last else until,
                ended=record.ended if last else until,
            )
        )
        if last:
            break
    return parts


def billed_book_for(policy: Policy, horizon: float = 0.0) -> BilledBook | None:
    """The book budgets in units read, for this policy: None when none is in units, or
    when every flavor bills a unit per GPU-hour (their use is then the GPU-hours')."""
    billing = Billing.of(policy)
    in_units = any(
        budget is not None and budget.in_units
        for group in policy.all_groups
        for budget in (group.budget, group.user_budget)
    )
    return BilledBook(billing, horizon) if in_units and billing.weighted else None


class BilledBook:
    """A ``UsageBook`` of billed unit-seconds: put, end and prune records as in the
    book of GPU-seconds; its parts are what it sums."""

    def __init__(self, billing: Billing, horizon: float = 0.0) -> None:
        self.billing = billing
        self.book = UsageBook(horizon=horizon)
        #: each record put, by uid, and the uids of its parts
        self.records: dict[str, UsageRecord] = {}
        self._parts: dict[str, tuple[str, ...]] = {}

    def put(self, policy: Policy, record: UsageRecord) -> None:
        """Add a record, or replace the one with its uid."""
        parts = billed_parts(record, self.billing)
        uids = tuple(p.uid for p in parts)
        for gone in set(self._parts.get(record.uid, ())) - set(uids):
            self.book.discard(policy, gone)
        for part in parts:
            self.book.put(policy, part)
        self.records[record.uid] = record
        self._parts[record.uid] = uids

    def end(self, policy: Policy, key: str, at: float) -> None:
        """The open record of server ``key`` ends at ``at`` (as ``UsageBook.end``)."""
        part = self.book.open_by_key.get(key)
        if part is None:
            return
        record = self.records.get(part.uid.split("#", 1)[0])
        if record is not None:
            # the hub's book may have ended this very record in place already: its
            # parts here are copies, ended now
            self.put(policy, replace(record, ended=max(at, record.started)))

    def prune(self, policy: Policy, now: float) -> int:
        """Forget what no budget's window reaches any more (as ``UsageBook.prune``)."""
        pruned = self.book.prune(policy, now)
        if pruned:
            kept = self.book.records
            for uid in [u for u, parts in self._parts.items() if not any(p in kept for p in parts)]:
                del self._parts[uid]
                del self.records[uid]
        return pruned

    # ---- what budgets read: as UsageBook's, in billed units ------------------------

    def used(
        self, group: str, member: str | None, period: int, now: float, running: Container[str] = ()
    ) -> float:
        return self.book.used(group, member, period, now, running)

    def room_returns(
        self,
        group: str,
        member: str | None,
        budget: Budget,
        now: float,
        running: Container[str] = (),
    ) -> tuple[float, float] | None:
        return self.book.room_returns(group, member, budget, now, running)

    def window_seconds(
        self, period: float, now: float, running: Container[str] = ()
    ) -> dict[Owner, float]:
        return self.book.window_seconds(period, now, running)

    def group_records(self, group: str) -> Iterable[UsageRecord]:
        return self.book.group_records(group)

    def user_records(self, user: str, group: str) -> Iterable[UsageRecord]:
        return self.book.user_records(user, group)
