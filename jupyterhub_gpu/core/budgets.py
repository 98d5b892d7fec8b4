"""GPU budgets: what a server counts against, the check at admission, and the notices.

``budgets_of`` says which budgets a GPU server counts against (its group's, each
parent's, the member's own) and how much of each is used, from the usage book
(``usage_book``); ``budget_refusal`` is the check, run in the same synchronous step
as the quota check and reservation, with when room returns (``room``);
``budget_notices`` what a running server over used-up budgets is told, and when it
stops. The records and the book are ``usage`` and ``usage_book`` (their names are
imported from here too). Pure: no I/O; times are epoch seconds.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from . import words
from .admission import Ledger
from .billed_book import BilledBook
from .model import Budget, Group, Policy
from .room import UsageAfter, first_room

# the records and the book (``usage``, ``usage_book``): many modules import them from here
from .usage import HOUR, UsageRecord
from .usage import gpu_hours as gpu_hours
from .usage import gpu_seconds as gpu_seconds
from .usage import used_seconds as used_seconds
from .usage_book import UsageBook
from .usage_book import longest_period as longest_period


def has_budget(policy: Policy, group: Group) -> bool:
    """Whether any budget applies to a GPU server charged to ``group``."""
    return group.user_budget is not None or any(
        level.budget is not None and not level.unlimited for level in policy.ancestors(group.name)
    )


@dataclass(frozen=True)
class BudgetState:
    """One owner's budget at one instant."""

    owner: str  # "research", or "alice in research"
    budget: Budget
    used: float  # GPU-equivalent-hours in the window (billed units, for a budget in units)
    #: the owner's records (a live view of the book, not a copy)
    records: Iterable[UsageRecord] = field(default=(), compare=False, repr=False)
    group: str = ""  # the group whose budget it is (for a member's own: their group)
    user: str | None = None  # the member, for a member's own budget
    #: the book its use is read from (billed units for a budget in units)
    book: UsageBook | BilledBook | None = field(default=None, compare=False, repr=False)

    @property
    def exhausted(self) -> bool:
        return self.used >= self.budget.amount

    @property
    def remaining(self) -> float:
        return max(self.budget.amount - self.used, 0.0)


def budgets_of(
    policy: Policy,
    book: UsageBook,
    user: str,
    group: Group,
    now: float,
    running: Container[str] = (),
    billed: BilledBook | None = None,
) -> list[BudgetState]:
    """The budgets a GPU server of ``user`` charged to ``group`` counts against: the
    group's, each parent's, and the user's own in the group; nearest first. A budget in
    units reads ``billed`` (None: every flavor bills a unit per GPU-hour, so ``book``)."""

    def book_of(budget: Budget) -> UsageBook | BilledBook:
        return billed if budget.in_units and billed is not None else book

    owners = [
        (level.display_name, level.budget, level.name, None)
        for level in policy.ancestors(group.name)
        if level.budget is not None and not level.unlimited
    ]
    if group.user_budget is not None:
        owners.append((f"{user} in {group.display_name}", group.user_budget, group.name, user))
    states = []
    for owner, budget, group_name, member in owners:
        kept = book_of(budget)
        records = (
            kept.group_records(group_name)
            if member is None
            else kept.user_records(member, group_name)
        )
        used = kept.used(group_name, member, budget.period, now, running)
        states.append(BudgetState(owner, budget, used, records, group_name, member, kept))
    return states


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

    One sort of the records' starts and ends, then each moment a record leaves is
    weighed in O(log n) (``UsageAfter``); ``UsageBook.room_returns`` keeps the sort
    between calls.
    """
    floor = now - float(budget.period)
    starts: list[float] = []
    ends: list[float] = []
    gpus: list[float] = []
    for r in records:
        end = r.end(now, running)
        if end > floor:
            starts.append(r.started)
            ends.append(end)
            gpus.append(r.gpus)
    if not ends:
        return None
    return first_room([UsageAfter(starts, ends, gpus)], budget, now)


def format_period(seconds: int) -> str:
    """ "30 days", "7 days", "12 hours", "1 hour 30 minutes": a window in words."""
    return words.duration(seconds)


def format_hours(value: float, *, grouped: bool = False) -> str:
    """GPU-hours as every message writes them (``words.number``): 2000, 20.5, 0.0125.

    ``grouped``: thousands separated, for tables ("12,345.6"); a message keeps the
    plain number ("12345.6"), which reads the same in a log line and a refusal."""
    return words.number(value, grouped=grouped)


def format_cap(value: float) -> str:
    return words.number(value)


def format_time(epoch: float) -> str:
    return words.moment(epoch)


def used_line(owner: str, used: float, budget: Budget) -> str:
    """``Research used 1999.96 of 2000 GPU-hours in the last 30 days`` (or billed
    units, for a budget in units)."""
    return f"{owner} used {_amount_of(used, budget)} in the last {words.period(budget.period)}"


def _amount_of(part: float, budget: Budget) -> str:
    """``12.5 of 100 GPU-hours``, ``0.5 of 1 GPU-hour``, ``40 of 500 billed units``."""
    a, b = words.numbers([part, budget.amount])
    return f"{a} of {b} {words.budget_measure(budget.in_units, b)}"


def amount_words(value: float, budget: Budget) -> str:
    """``12.5 GPU-hours``, or ``12.5 billed units`` for a budget in units."""
    return words.billed_units(value) if budget.in_units else words.gpu_hours(value)


def exhausted_reason(
    state: BudgetState,
    now: float,
    running: Container[str] = (),
    book: UsageBook | BilledBook | None = None,
) -> str:
    """``Research used 2000 of 2000 GPU-hours in the last 30 days: GPU servers can start
    again at 2026-12-01 14:00 UTC, when 12.5 GPU-hours are free again; until then, start
    one without GPUs, or ask an admin to raise the budget``. With the ``book`` the
    state's records are in, when room returns is worked out from what the book kept of
    an earlier refusal."""
    book = state.book if state.book is not None else book
    if book is not None:
        room = book.room_returns(state.group, state.user, state.budget, now, running)
    else:
        room = room_returns(state.records, state.budget, now, running)
    return used_up_refusal(state.owner, state.used, state.budget, room)


def used_up_refusal(
    owner: str, used: float, budget: Budget, room: tuple[float, float] | None
) -> str:
    """A GPU spawn refused for a used-up budget: the numbers, when it can start again
    (``room``: when, and how many GPU-hours are free then; None: not known), and what
    to do meanwhile."""
    text = used_line(owner, used, budget)
    if room is not None:
        when, free = room
        free_text = amount_words(free, budget)
        text += (
            f": GPU servers can start again at {format_time(when)}, when {free_text} "
            f"{'is' if free_text.startswith('1 ') else 'are'} free again"
        )
    else:
        text += ": GPU servers can start again once some of it is free"
    return text + "; until then, start one without GPUs, or ask an admin to raise the budget"


def grace_refusal(
    owner: str,
    budget: Budget,
    remaining: float,
    held: float,
    gpus: float,
    promised: float | None = None,
) -> str:
    """A GPU spawn refused by a ``when_exhausted: stop`` budget whose rest cannot cover
    the grace of every GPU its servers hold and this server's (``promised``: what that
    grace uses in the budget's measure; None: GPU-hours of ``held + gpus``)."""
    if promised is None:
        promised = (held + gpus) * budget.grace / HOUR
    left, cap, need = words.numbers([remaining, budget.amount, promised])
    return (
        f"{owner} has {left} of {cap} {words.budget_measure(budget.in_units, cap)} "
        f"left in the last {words.period(budget.period)}, less than the {need} "
        f"{words.budget_measure(budget.in_units, need)} its servers' "
        f"{words.gpus(held)} and this server's {words.number(gpus)} would use in the "
        f"{format_period(budget.grace)} each may still run once they are used up: try again "
        "when one of its servers stops, or choose fewer GPUs"
    )


def budget_refusal(
    policy: Policy,
    book: UsageBook,
    user: str,
    group: Group,
    gpus: float,
    now: float,
    ledger: Ledger | None = None,
    billed: BilledBook | None = None,
    devices: Iterable[tuple[str, int]] = (),
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
    for state in budgets_of(policy, book, user, group, now, running, billed):
        if state.exhausted:
            return exhausted_reason(state, now, running, book)
        if state.budget.when_exhausted != "stop" or ledger is None:
            continue
        usage = (
            ledger.user_usage(state.user, state.group)
            if state.user is not None
            else ledger.usage(state.group)
        )
        held = float(usage.gpus)
        hourly = held + gpus
        if state.budget.in_units and billed is not None:
            # an hour of each server at its flavor's weight now
            hourly = billed.billing.hourly_units(policy, (*usage.flavors.items(), *devices), now)
        promised = hourly * state.budget.grace / HOUR
        if state.remaining < promised:
            return grace_refusal(state.owner, state.budget, state.remaining, held, gpus, promised)
    return None


# ---- what a server running on used-up budgets is told, and when it stops ------------------

#: a budget by who owns it: (group, "") for a group's own, (group, member) for a
#: member's own budget in that group
BudgetKey = tuple[str, str]


@dataclass(frozen=True)
class UsedUp:
    """A used-up budget a running server counts against."""

    key: BudgetKey
    owner: str  # "research", or "alice in research"
    budget: Budget
    used: float  # GPU-equivalent-hours in its window

    @property
    def stops(self) -> bool:
        return self.budget.when_exhausted == "stop"


@dataclass(frozen=True)
class Told:
    """What one server was told of one used-up budget: when, and the stop it announced
    (None: a ``warn`` budget, which stops nothing); ``stop_said``: when the server was
    told it is being stopped now (the stop this announcement set)."""

    key: BudgetKey
    at: float
    stop_at: float | None
    stop_said: float | None = None


@dataclass(frozen=True)
class BudgetNotices:
    """What to do about one server at one run (``budget_notices``)."""

    #: new notices, one per budget not told yet, each with its own stop (or none)
    tell: tuple[Told, ...] = ()
    #: budgets told before that are no longer used up, or whose kind (warn or stop)
    #: changed: forgotten, so a later exhaustion tells anew
    forget: tuple[BudgetKey, ...] = ()
    #: the earliest stop announced for a budget still used up (None: no stop is due
    #: ever for what is used up now), and the announcement that set it
    stop: Told | None = None
    #: that stop's time has come
    due: bool = False


def budget_notices(used_up: Iterable[UsedUp], told: Iterable[Told], now: float) -> BudgetNotices:
    """Which of a server's used-up budgets to tell, and whether it stops now.

    Each used-up budget is told once, with its own notice: a ``stop`` budget
    announces its stop ``grace`` after its own notice, a ``warn`` budget announces
    none (and so shortens no stop budget's grace). The server stops at the earliest
    stop announced for a budget still used up, never earlier; a budget with room
    again is forgotten, so its next exhaustion is told anew with a fresh grace. A
    budget whose ``when_exhausted`` changed since it was told (a new policy) is told
    anew as what it is now. ``told`` is what was told before, read back from where it
    is kept: a restart neither tells again nor gives a fresh grace.
    """
    now_used = {u.key: u for u in used_up}
    kept: dict[BudgetKey, Told] = {}
    forget: list[BudgetKey] = []
    for t in told:
        u = now_used.get(t.key)
        if u is None or u.stops != (t.stop_at is not None):
            forget.append(t.key)
        else:
            kept[t.key] = t
    tell = tuple(
        Told(key, now, now + u.budget.grace if u.stops else None)
        for key, u in now_used.items()
        if key not in kept
    )
    stopping = [t for t in (*kept.values(), *tell) if t.stop_at is not None]
    # the earliest; between equal times, one already told (it may have said the stop)
    stop = min(stopping, key=lambda t: (t.stop_at, t in tell), default=None)
    due = stop is not None and stop.stop_at is not None and stop.stop_at <= now
    return BudgetNotices(tell, tuple(forget), stop, due)


def earliest_stop(told: Iterable[Told]) -> Told | None:
    """The announcement with the earliest stop among ``told`` (None: none stops)."""
    return min((t for t in told if t.stop_at is not None), key=lambda t: t.stop_at, default=None)
