"""GPU time: usage records, the GPU-hours they add up to, and budgets.

A ``UsageRecord`` is one server pod's hold on GPUs: its GPU-equivalents, from
the pod's start to its end. A record still open counts up to now while its
server runs, and up to the last time it was seen otherwise (an end nobody
witnessed: the error is at most the time between two sightings).

The ``UsageBook`` keeps the records that can still count towards a budget,
indexed by every group they are charged to (a server counts for its group and
each parent) and by (user, group), so a spawn's budget check reads only its own
owners' records. ``budget_refusal`` is the check; it runs in the same
synchronous step as the quota check and reservation. Pure: no I/O; times are
epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .admission import Ledger
from .model import Budget, Group, Policy

HOUR = 3600.0


@dataclass(slots=True)  # the service keeps two months of them: a few hundred thousand
class UsageRecord:
    uid: str  # the pod's uid: one record per pod
    key: str  # "<namespace>/<pod name>", the server's key in the admission ledger
    user: str
    group: str
    profile: str
    flavor: str | None
    gpus: float  # GPU-equivalents held
    started: float
    last_seen: float
    ended: float | None = None

    def end(self, now: float, running: Container[str] = ()) -> float:
        """When its use ends, as far as is known at ``now``."""
        if self.ended is not None:
            return self.ended
        return now if self.key in running else max(self.last_seen, self.started)


def used_seconds(
    r: UsageRecord, since: float, until: float, now: float, running: Container[str] = ()
) -> float:
    """GPU-equivalent-seconds ``r`` used between ``since`` and ``until`` (as known at
    ``now``). ``UsageRecord.end`` inlined: a month's showback calls this for every
    record (~150,000 at a large site), where the call costs a quarter of the time."""
    end = r.ended
    if end is None:
        end = now if r.key in running else max(r.last_seen, r.started)
    if end > until:
        end = until
    start = r.started if r.started > since else since
    return r.gpus * (end - start) if end > start else 0.0


def gpu_hours(
    records: Iterable[UsageRecord], since: float, now: float, running: Container[str] = ()
) -> float:
    """GPU-equivalent-hours the records used from ``since`` to ``now``."""
    # ``used_seconds`` with until = now and ``UsageRecord.end`` inlined: this sums every
    # record of every budget a spawn counts against, in the spawn path, where a call per
    # record is a third of it
    total = 0.0
    for r in records:
        end = r.ended
        if end is None:
            end = now if r.key in running else max(r.last_seen, r.started)
        elif end > now:
            end = now
        start = r.started if r.started > since else since
        if end > start:
            total += r.gpus * (end - start)
    return total / HOUR


class UsageBook:
    """Records that may still count, by owner: each group (parents included) and
    each (user, group)."""

    def __init__(self, horizon: float = 0.0) -> None:
        #: how far back a record can count (the longest budget period), in seconds
        self.horizon = horizon
        self.records: dict[str, UsageRecord] = {}
        self.by_group: dict[str, dict[str, UsageRecord]] = {}
        self.by_user: dict[tuple[str, str], dict[str, UsageRecord]] = {}
        self.open_by_key: dict[str, UsageRecord] = {}
        #: GPU-hours summed lately, by (owner, window), while no record changed: a
        #: spawn's profile list and its admission ask for the same owners in turn
        self._sums: dict[tuple[Any, int], tuple[int, float, float]] = {}
        self._version = 0

    def used(
        self, owner: Any, records: Iterable[UsageRecord], period: int, now: float, running
    ) -> float:
        """GPU-hours of ``records`` (``owner``'s) in the ``period`` before ``now``; a sum
        made less than a second ago, with no record changed since, is reused (what the
        owner's running servers used in that second is not worth another pass)."""
        key = (owner, period)
        cached = self._sums.get(key)
        if cached is not None and cached[0] == self._version and 0 <= now - cached[1] < 1.0:
            return cached[2]
        value = gpu_hours(records, now - period, now, running)
        if len(self._sums) > 100_000:
            self._sums.clear()
        self._sums[key] = (self._version, now, value)
        return value

    @classmethod
    def for_policy(cls, policy: Policy) -> UsageBook:
        return cls(horizon=longest_period(policy))

    def put(self, policy: Policy, record: UsageRecord) -> None:
        """Add a record, or replace the one with its uid."""
        self._version += 1
        old = self.records.get(record.uid)
        if old is not None:
            self._unindex(policy, old)
        if record.ended is None:
            earlier = self.open_by_key.get(record.key)
            if earlier is not None and earlier.uid != record.uid:
                # a new pod for the same server: the old one's end was missed
                if earlier.started <= record.started:
                    earlier.ended = min(earlier.end(record.started), record.started)
                    del self.open_by_key[record.key]
                else:
                    record.ended = min(record.end(earlier.started), earlier.started)
        self.records[record.uid] = record
        for name in policy.charged_groups(record.group):
            self.by_group.setdefault(name, {})[record.uid] = record
        self.by_user.setdefault((record.user, record.group), {})[record.uid] = record
        if record.ended is None:
            self.open_by_key[record.key] = record

    def _unindex(self, policy: Policy, record: UsageRecord) -> None:
        for name in policy.charged_groups(record.group):
            self.by_group.get(name, {}).pop(record.uid, None)
        self.by_user.get((record.user, record.group), {}).pop(record.uid, None)
        if self.open_by_key.get(record.key) is record:
            del self.open_by_key[record.key]

    def end(self, key: str, at: float) -> UsageRecord | None:
        """The open record of server ``key`` ends at ``at``."""
        self._version += 1
        record = self.open_by_key.pop(key, None)
        if record is not None:
            record.ended = max(at, record.started)
        return record

    def prune(self, policy: Policy, now: float) -> int:
        """Drop records that ended before any budget's window: they never count again."""
        cutoff = now - self.horizon
        gone = [r for r in self.records.values() if r.ended is not None and r.ended < cutoff]
        for record in gone:
            self._unindex(policy, record)
            del self.records[record.uid]
        for index in (self.by_group, self.by_user):
            for owner in [o for o, owned in index.items() if not owned]:
                del index[owner]
        return len(gone)

    def group_records(self, group: str) -> Iterable[UsageRecord]:
        return self.by_group.get(group, {}).values()

    def user_records(self, user: str, group: str) -> Iterable[UsageRecord]:
        return self.by_user.get((user, group), {}).values()


def has_budget(policy: Policy, group: Group) -> bool:
    """Whether any budget applies to a GPU server charged to ``group``."""
    return group.user_budget is not None or any(
        level.budget is not None and not level.unlimited for level in policy.ancestors(group.name)
    )


def longest_period(policy: Policy) -> float:
    periods = [
        budget.period
        for group in policy.all_groups
        for budget in (group.budget, group.user_budget)
        if budget is not None
    ]
    return float(max(periods, default=0))


@dataclass(frozen=True)
class BudgetState:
    """One owner's budget at one instant."""

    owner: str  # "research", or "alice in research"
    budget: Budget
    used: float  # GPU-equivalent-hours in the window
    #: the owner's records (a live view of the book, not a copy)
    records: Iterable[UsageRecord] = field(default=(), compare=False, repr=False)
    group: str = ""  # the group whose budget it is (for a member's own: their group)
    user: str | None = None  # the member, for a member's own budget

    @property
    def exhausted(self) -> bool:
        return self.used >= float(self.budget.gpu_hours)

    @property
    def remaining(self) -> float:
        return max(float(self.budget.gpu_hours) - self.used, 0.0)


def budgets_of(
    policy: Policy,
    book: UsageBook,
    user: str,
    group: Group,
    now: float,
    running: Container[str] = (),
) -> list[BudgetState]:
    """The budgets a GPU server of ``user`` charged to ``group`` counts against: the
    group's, each parent's, and the user's own in the group; nearest first."""
    owners = [
        (level.display_name, level.budget, book.group_records(level.name), level.name, None)
        for level in policy.ancestors(group.name)
        if level.budget is not None and not level.unlimited
    ]
    if group.user_budget is not None:
        owners.append(
            (
                f"{user} in {group.display_name}",
                group.user_budget,
                book.user_records(user, group.name),
                group.name,
                user,
            )
        )
    return [
        BudgetState(
            owner,
            budget,
            book.used((group_name, member), records, budget.period, now, running),
            records,
            group_name,
            member,
        )
        for owner, budget, records, group_name, member in owners
    ]


def room_returns(
    records: Iterable[UsageRecord],
    budget: Budget,
    now: float,
    running: Container[str] = (),
) -> tuple[float, float] | None:
    """When some of an exhausted budget is free again, and how much: (time, GPU-hours).

    Counts what was used up to now and nothing after (as if the owner's servers
    stopped now): the first moment a whole record has left the window with room
    to show, rounded up to the minute (room may start to return a little earlier,
    as a record leaves in part). None if nothing ever leaves (no records).
    """
    period = float(budget.period)
    spans = [
        (r.started, r.end(now, running), r.gpus)
        for r in records
        if r.end(now, running) > now - period
    ]
    if not spans:
        return None
    cap = float(budget.gpu_hours)

    def used_at(t: float) -> float:
        since = t - period
        return sum(g * (e - max(s, since)) for s, e, g in spans if e > since) / HOUR

    # usage only leaves the window: each record's end + period is when it is wholly gone
    for moment in sorted({e + period for _, e, _ in spans}):
        free = cap - used_at(moment)
        if free > 1e-9:
            return math.ceil(moment / 60) * 60.0, free
    return None


def format_period(seconds: int) -> str:
    """ "30 days", "7 days", "12 hours", "90 minutes": a window in words."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}" if count == 1 else f"{count} {unit}s"
    return f"{seconds} seconds"


def format_hours(value: float) -> str:
    """GPU-hours to one decimal (2000 -> "2000.0"); below one, three digits (0.0125)."""
    return f"{value:.1f}" if value >= 1 or value == 0 else f"{value:.3g}"


def format_cap(value: float) -> str:
    return f"{value:g}"


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def used_line(owner: str, used: float, budget: Budget) -> str:
    """``research used 2000.0 of 2000 GPU-hours in the last 30 days``."""
    return (
        f"{owner} used {format_hours(used)} of {format_cap(float(budget.gpu_hours))} "
        f"GPU-hours in the last {format_period(budget.period)}"
    )


def exhausted_reason(state: BudgetState, now: float, running: Container[str] = ()) -> str:
    """``research used 2000.0 of 2000 GPU-hours in the last 30 days; 12.5 free again by
    2026-12-01 14:00 UTC``."""
    text = used_line(state.owner, state.used, state.budget)
    room = room_returns(state.records, state.budget, now, running)
    if room is not None:
        when, free = room
        text += f"; {format_hours(free)} free again by {format_time(when)}"
    return text


def budget_refusal(
    policy: Policy,
    book: UsageBook,
    user: str,
    group: Group,
    gpus: float,
    now: float,
    ledger: Ledger | None = None,
) -> str | None:
    """Why a server with ``gpus`` GPU-equivalents may not start now, or None.

    Refused when a budget it counts against is used up. A ``when_exhausted: stop``
    budget promises every server it admits its ``grace`` of run time: it admits a
    server only while what is left covers the grace of every GPU the owner's servers
    hold in ``ledger`` (running, starting, reserved) and this one's, so servers
    admitted together can never jointly promise more than the budget has. A server
    without GPUs is never refused for GPU time.
    """
    if not gpus:
        return None
    running: Container[str] = ledger.charges if ledger is not None else ()
    for state in budgets_of(policy, book, user, group, now, running):
        if state.exhausted:
            return exhausted_reason(state, now, running)
        if state.budget.when_exhausted != "stop" or ledger is None:
            continue
        held = float(
            ledger.user_usage(state.user, state.group).gpus
            if state.user is not None
            else ledger.usage(state.group).gpus
        )
        promised = (held + gpus) * state.budget.grace / HOUR
        if state.remaining < promised:
            return (
                f"{state.owner} has {format_hours(state.remaining)} of "
                f"{format_cap(float(state.budget.gpu_hours))} GPU-hours left in the last "
                f"{format_period(state.budget.period)}; its servers' "
                f"{format_cap(held)} GPUs and this server's {format_cap(gpus)} need "
                f"{format_hours(promised)} for the {format_period(state.budget.grace)} "
                "each may run once it is used up"
            )
    return None
