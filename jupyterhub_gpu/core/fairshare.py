"""Fair share: GPU time used recently, against each owner's share, orders who waits.

**Decayed usage** (``decayed``): a usage record adds its GPU-seconds, each
weighted ``2^(-age / half_life)`` (billed unit-seconds with ``count:
billed_units``). The owners are each group (a server counts for its group and
every parent, as for quotas and budgets) and each member of a group (user, group).

**Kept incrementally.** Per owner the book keeps the decayed sum ``D`` of its
closed records at one reference time ``ref`` shared by all owners:
``D(now) = D(ref) · 2^(-(now - ref) / half_life)``. A closed record adds its
integral decayed to ``ref``; open records (servers running, few) are integrated
when asked. A record that changes (an inferred end undone, a correction) takes
back what it added and adds anew. ``ref`` is moved forward (every sum multiplied
once) whenever a record is more than two half-lives past it, so no term grows
large and a year of records never drifts: the sums stay within a relative 1e-9
of summing every record afresh (tests/unit/test_fairshare.py checks it).

Usage that ended more than ``FORGET_AFTER`` half-lives ago weighs under 0.1% of
what it did: it is not read at start-up, and the book forgets which records it
counted then (their part stays in the sums; a change to such a record is ignored).

**Standing** (the number users and admins see; lower goes first):

- a group: its share of its siblings' decayed usage (the groups of the same
  parent, or the top-level groups, ``everyone`` included) divided by its share
  of their ``share`` weights. 1: it used exactly its share; 0.5: half; 2: twice.
- a member: their share of the group's own decayed usage divided by 1/n, n the
  members with usage in the group (the member counted in): members' shares are
  equal.

**The line.** Waiting servers are ordered by ``line_order``: a server that has
waited ``max_wait`` or longer first (oldest first), then by standing from the
top of the group tree down (the top-level groups' usage per share, then the
next level's, ..., then the member's usage), arrival breaking ties. A server
only waits behind those ahead of it that wait for capacity it needs too.

Pure: no I/O; times are epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from . import words
from .decayed import LN2, counted_billing, decayed_seconds, decayed_units
from .model import Policy
from .usage import HOUR, UsageRecord

#: usage older than this many half-lives weighs under 1/1024 of what it did: not read
FORGET_AFTER = 10
#: the reference time is moved forward when a record is this many half-lives past it
RENORMALISE_AFTER = 2
#: seconds the siblings' total usage is kept for (it reads every sibling's servers)
TOTALS_KEPT = 30.0


def read_window(policy: Policy) -> float:
    """How far back usage must be read for fair share (0: it is off)."""
    return FORGET_AFTER * policy.fair_share.half_life if policy.fair_share else 0.0


@dataclass(frozen=True, slots=True)
class _Counted:
    """What a closed record added, to take it back if it changes."""

    user: str
    group: str
    flavor: str | None
    gpus: float
    started: float
    ended: float


@dataclass(frozen=True)
class Standing:
    """An owner's fair-share standing at one time."""

    usage: float  # decayed GPU-hours (billed units with ``count: billed_units``)
    share: float  # its fraction of the shares it is measured among (0..1]
    used: float  # its fraction of their decayed usage (0..1)

    @property
    def standing(self) -> float:
        """Usage fraction over share fraction: 1 is exactly its share (lower goes first)."""
        return self.used / self.share


class FairShareBook:
    """Each group's and member's decayed usage, kept as records come and change."""

    def __init__(self, policy: Policy, half_life: float | None = None) -> None:
        if half_life is None:
            if policy.fair_share is None:
                raise ValueError("FairShareBook: the policy has no fair_share")
            half_life = float(policy.fair_share.half_life)
        self.policy = policy
        self.half_life = float(half_life)
        #: the rates usage is weighed by (None: GPU-hours, every one alike)
        self.billing = counted_billing(policy)
        self._k = LN2 / self.half_life
        #: the reference time every kept sum is decayed to (None: nothing counted yet)
        self.ref: float | None = None
        #: the latest time a record reached: what is older than the window is not read
        self.latest = -math.inf
        #: closed records' decayed GPU-seconds at ``ref``: per group (its children's
        #: included), per group of its own servers only, per (user, group), and per parent
        #: (None: the top level) of its children's
        self.groups: dict[str, float] = {}
        self.own: dict[str, float] = {}
        self.members: dict[tuple[str, str], float] = {}
        self.children: dict[str | None, float] = {}
        self.counted: dict[str, _Counted] = {}
        #: records not ended yet, integrated when asked (a few: the servers running)
        self.open: dict[str, UsageRecord] = {}
        self.open_by_group: dict[str, dict[str, UsageRecord]] = {}
        self.open_by_member: dict[tuple[str, str], dict[str, UsageRecord]] = {}
        #: group -> the users with usage in it (its own servers)
        self.member_names: dict[str, set[str]] = {}
        #: the groups measured together: parent (None: top level) -> children, and shares
        self.siblings: dict[str | None, list[str]] = {}
        for group in policy.all_groups:
            self.siblings.setdefault(group.parent, []).append(group.name)
        self._share_sums = {
            parent: sum(policy.group(n).share for n in names)
            for parent, names in self.siblings.items()
        }
        self._totals: dict[str | None, tuple[float, float]] = {}

    # ---- feeding -------------------------------------------------------------------

    def put(self, record: UsageRecord) -> None:
        """Count a record, or count it again (a record of the same uid replaces it)."""
        uid = record.uid
        old = self.counted.pop(uid, None)
        if old is not None:
            self._add(old, -1.0)
        self._unopen(uid)
        end = record.end(record.last_seen) if record.ended is not None else record.last_seen
        if old is None and record.ended is not None and end < self.latest - self._window:
            return  # too old to weigh; maybe counted before and forgotten since
        self.member_names.setdefault(record.group, set()).add(record.user)
        if record.ended is None:
            self.open[uid] = record
            for name in self.policy.charged_groups(record.group):
                self.open_by_group.setdefault(name, {})[uid] = record
            self.open_by_member.setdefault((record.user, record.group), {})[uid] = record
            self.latest = max(self.latest, record.started)
            return
        counted = _Counted(
            record.user, record.group, record.flavor, record.gpus, record.started, end
        )
        self.counted[uid] = counted
        self._add(counted, 1.0)

    def ended(self, record: UsageRecord) -> None:
        """An open record was ended in place (``UsageBook.end``): count it closed."""
        if record.uid in self.open and record.ended is not None:
            self.put(record)

    @property
    def _window(self) -> float:
        return FORGET_AFTER * self.half_life

    def _unopen(self, uid: str) -> None:
        record = self.open.pop(uid, None)
        if record is None:
            return
        for name in self.policy.charged_groups(record.group):
            owned = self.open_by_group.get(name)
            if owned is not None:
                owned.pop(uid, None)
                if not owned:
                    del self.open_by_group[name]
        member = (record.user, record.group)
        owned = self.open_by_member.get(member)
        if owned is not None:
            owned.pop(uid, None)
            if not owned:
                del self.open_by_member[member]

    def _add(self, c: _Counted, sign: float) -> None:
        if self.ref is None:
            self.ref = c.ended
        elif c.ended - self.ref > RENORMALISE_AFTER * self.half_life:
            self.advance(c.ended)
        self.latest = max(self.latest, c.ended)
        if self.billing is None:  # GPU-hours: no weights to look up
            value = sign * decayed_seconds(c.gpus, c.started, c.ended, self.ref, self.half_life)
        else:
            value = sign * decayed_units(
                self.billing, c.flavor, c.gpus, c.started, c.ended, self.ref, self.half_life
            )
        if value == 0.0:
            return
        chain = self.policy.charged_groups(c.group)
        for name in chain:
            self.groups[name] = self.groups.get(name, 0.0) + value
            group = self.policy.find_group(name)
            parent = group.parent if group is not None else None
            self.children[parent] = self.children.get(parent, 0.0) + value
        self.own[c.group] = self.own.get(c.group, 0.0) + value
        member = (c.user, c.group)
        self.members[member] = self.members.get(member, 0.0) + value

    def advance(self, now: float) -> None:
        """Move the reference time to ``now`` (every sum decayed to it), and forget
        which records ended before the window (their part stays in the sums)."""
        if self.ref is None or now <= self.ref:
            return
        factor = math.exp(-self._k * (now - self.ref))
        for sums in (self.groups, self.own, self.members, self.children):
            for owner in sums:
                sums[owner] *= factor
        self.ref = now
        self.latest = max(self.latest, now)
        cutoff = now - self._window
        for uid in [u for u, c in self.counted.items() if c.ended < cutoff]:
            del self.counted[uid]

    def settle(self, now: float) -> None:
        """Count open records that were ended in place as closed, and move the
        reference time forward once it is two half-lives old (the caller's periodic
        upkeep, never needed for a correct answer)."""
        for record in [r for r in self.open.values() if r.ended is not None]:
            self.put(record)
        if self.ref is not None and now - self.ref > RENORMALISE_AFTER * self.half_life:
            self.advance(now)

    # ---- asking --------------------------------------------------------------------

    def _decay(self, value: float, now: float) -> float:
        if not value or self.ref is None:
            return 0.0
        return value * math.exp(-self._k * (now - self.ref))

    def _open_seconds(
        self,
        records: Iterable[UsageRecord],
        now: float,
        running: Container[str],
        skip_group: str | None = None,
    ) -> float:
        total = 0.0
        billing, half_life = self.billing, self.half_life
        for r in records:
            if r.group == skip_group:
                continue
            end = min(r.end(now, running), now)
            if billing is None:  # GPU-hours: no weights to look up
                total += decayed_seconds(r.gpus, r.started, end, now, half_life)
                continue
            rates = billing.rates.get(r.flavor) if r.flavor is not None else None
            if rates is None or r.started >= rates[-1].since:
                # a server started under its flavor's latest rate (nearly every one
                # running): one weight; ``decayed_units`` inlined, for 5,000 of them
                weight = rates[-1].weight if rates is not None else 1.0
                total += weight * decayed_seconds(r.gpus, r.started, end, now, half_life)
            else:
                total += decayed_units(billing, r.flavor, r.gpus, r.started, end, now, half_life)
        return total

    def group_usage(self, group: str, now: float, running: Container[str] = ()) -> float:
        """``group``'s decayed GPU-hours (its children's included) at ``now``."""
        seconds = self._decay(self.groups.get(group, 0.0), now)
        opened = self.open_by_group.get(group)
        if opened:
            seconds += self._open_seconds(opened.values(), now, running)
        return max(seconds, 0.0) / HOUR

    def member_usage(
        self, user: str, group: str, now: float, running: Container[str] = ()
    ) -> float:
        """``user``'s decayed GPU-hours in ``group`` (their servers charged to it)."""
        seconds = self._decay(self.members.get((user, group), 0.0), now)
        opened = self.open_by_member.get((user, group))
        if opened:
            seconds += self._open_seconds(opened.values(), now, running)
        return max(seconds, 0.0) / HOUR

    def own_usage(self, group: str, now: float, running: Container[str] = ()) -> float:
        """The decayed GPU-hours of ``group``'s own servers (not its children's): what
        its members' usage adds up to."""
        seconds = self._decay(self.own.get(group, 0.0), now)
        opened = self.open_by_group.get(group)
        if opened:
            own = (r for r in opened.values() if r.group == group)
            seconds += self._open_seconds(own, now, running)
        return max(seconds, 0.0) / HOUR

    def siblings_usage(self, parent: str | None, now: float, running: Container[str] = ()) -> float:
        """The decayed GPU-hours of the children of ``parent`` (None: the top-level
        groups) together; kept ``TOTALS_KEPT`` seconds, as it reads every one of their
        running servers."""
        kept = self._totals.get(parent)
        if kept is not None and 0 <= now - kept[0] < TOTALS_KEPT:
            return kept[1]
        seconds = self._decay(self.children.get(parent, 0.0), now)
        if parent is None:
            seconds += self._open_seconds(self.open.values(), now, running)
        else:
            opened = self.open_by_group.get(parent)
            if opened:
                # the parent's own servers are not its children's
                seconds += self._open_seconds(opened.values(), now, running, skip_group=parent)
        hours = max(seconds, 0.0) / HOUR
        self._totals[parent] = (now, hours)
        return hours

    def share_fraction(self, group: str) -> float:
        """``group``'s fraction of its siblings' shares (1 for a group the policy dropped)."""
        found = self.policy.find_group(group)
        if found is None:
            return 1.0
        return found.share / self._share_sums[found.parent]

    def group_standing(self, group: str, now: float, running: Container[str] = ()) -> Standing:
        found = self.policy.find_group(group)
        usage = self.group_usage(group, now, running)
        total = self.siblings_usage(found.parent if found else None, now, running)
        return Standing(usage, self.share_fraction(group), usage / total if total > 0 else 0.0)

    def member_standing(
        self, user: str, group: str, now: float, running: Container[str] = ()
    ) -> Standing:
        usage = self.member_usage(user, group, now, running)
        members = self.member_names.get(group, set())
        n = len(members) + (user not in members)
        total = self.own_usage(group, now, running)
        return Standing(usage, 1.0 / n, usage / total if total > 0 else 0.0)

    def order_key(
        self, user: str, group: str, now: float, running: Container[str] = ()
    ) -> tuple[float, ...]:
        """What orders a waiting server of ``user`` charged to ``group``: each level's
        usage per share from the top-level group down, then the member's usage (lower
        first). Siblings share a parent, so at the first level two servers differ, their
        groups are measured against the same siblings."""
        return line_key(
            self.policy,
            group,
            lambda name: self.group_usage(name, now, running),
            self.member_usage(user, group, now, running),
        )


def line_key(
    policy: Policy, group: str, group_usage: Callable[[str], float], member_usage: float
) -> tuple[float, ...]:
    """What orders a waiting server charged to ``group`` (``FairShareBook.order_key``),
    from each level's decayed usage (``group_usage``) and its member's."""
    key = []
    for name in reversed(policy.charged_groups(group)):
        found = policy.find_group(name)
        key.append(group_usage(name) / (found.share if found is not None else 1.0))
    key.append(member_usage)
    return tuple(key)


# ---- the line -------------------------------------------------------------------------


@dataclass(eq=False)
class Waiter:
    """A server waiting for capacity."""

    key: str
    user: str
    group: str
    #: the groups its server would be charged to: its group and every parent
    chain: tuple[str, ...]
    arrived: float  # epoch seconds
    seq: int  # arrival order
    #: the group whose limit it waits for (None: it has not been decided yet)
    blocked_on: str | None = None
    #: what orders it (``FairShareBook.order_key``; empty: first come, first served)
    standing: tuple[float, ...] = field(default=())
    #: when ``standing`` was worked out (None: not yet)
    standing_at: float | None = None

    def waited_long(self, now: float, max_wait: float | None) -> bool:
        return max_wait is not None and now - self.arrived >= max_wait


def burst_band(group: Standing, member: Standing) -> str:
    """The band of an over-quota server's PriorityClass by its user's standing overall
    (the group's among its siblings times the member's within it): ``light`` under
    half their share, ``heavy`` over twice it, else ``fair``. Schedulers preempt the
    lowest band first, so the heaviest users' bursts go first."""
    overall = group.standing * member.standing
    if overall < 0.5:
        return "light"
    return "heavy" if overall > 2 else "fair"


def line_order(
    waiters: Iterable[Waiter], now: float, max_wait: float | None = None
) -> list[Waiter]:
    """Waiters in the order they go: those that have waited ``max_wait`` or longer
    first, oldest first; then the rest by standing, arrival breaking ties (without
    fair share every standing is empty: arrival order)."""

    def key(w: Waiter) -> tuple:
        if w.waited_long(now, max_wait):
            return (0, (), w.seq)
        return (1, w.standing, w.seq)

    return sorted(waiters, key=key)


def blocks(ahead: Waiter, me: Waiter) -> bool:
    """Whether ``ahead`` waits for capacity ``me`` would take too: the group it waits
    for is one ``me`` is charged to."""
    return ahead.blocked_on is not None and ahead.blocked_on in me.chain


@dataclass(frozen=True)
class Place:
    position: int  # 1: next
    of: int  # the servers waiting for the same capacity, this one counted
    ahead: tuple[Waiter, ...]  # those that go first
    behind: tuple[Waiter, ...]  # those it goes before


def place(me: Waiter, ordered: Sequence[Waiter]) -> Place:
    """``me``'s place among those waiting for the same capacity, in ``ordered``."""
    ahead: list[Waiter] = []
    behind: list[Waiter] = []
    seen = False
    for w in ordered:
        if w is me:
            seen = True
        elif not seen and blocks(w, me):
            ahead.append(w)
        elif seen and blocks(me, w):
            behind.append(w)
    return Place(len(ahead) + 1, len(ahead) + len(behind) + 1, tuple(ahead), tuple(behind))


def _first_difference(a: tuple[float, ...], b: tuple[float, ...]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _less(ahead: Waiter, me: Waiter) -> str:
    """Who used less: the member (same group levels) or the group."""
    i = _first_difference(ahead.standing, me.standing)
    return "user" if i >= min(len(ahead.standing), len(me.standing)) - 1 else "group"


#: how a message says someone used less, by what fair share counts (``FairShare.count``)
USED_LESS = {"gpu_hours": "less GPU time", "billed_units": "fewer billed units"}


def used_words(count: str, amount: float) -> str:
    """Decayed usage as fair share counts it: ``3.2 GPU-hours``, ``9.6 billed units``."""
    return words.billed_units(amount) if count == "billed_units" else words.gpu_hours(amount)


def why_placed(
    me: Waiter, where: Place, now: float, max_wait: float, count: str = "gpu_hours"
) -> str:
    """Why ``me`` is where it is in a fair-share line, in words (``count``: what fair
    share counts, ``FairShare.count``)."""
    wait = words.duration(max_wait)
    less_time = USED_LESS[count]
    if where.position == 1:
        if me.waited_long(now, max_wait):
            return f"you have waited longer than {wait}, so you go first"
        if any(w.standing > me.standing for w in where.behind):
            return f"you used {less_time} recently than others waiting"
        return "you asked first"
    long_ago = [w for w in where.ahead if w.waited_long(now, max_wait)]
    less = [w for w in where.ahead if w not in long_ago and w.standing < me.standing]
    first = [w for w in where.ahead if w not in long_ago and w not in less]
    parts = []
    if long_ago:
        parts.append(f"{len(long_ago)} waited longer than {wait}")
    groups = [w for w in less if _less(w, me) == "group"]
    if len(less) > len(groups):
        users = len(less) - len(groups)
        parts.append(
            f"{users} whose user{'s' if users > 1 else ''} used {less_time} recently than you"
        )
    if groups:
        parts.append(
            f"{len(groups)} whose group{'s' if len(groups) > 1 else ''} used {less_time} "
            "recently for its share than yours"
        )
    if first:
        parts.append(f"{len(first)} that asked before you")
    return "ahead of you: " + ", ".join(parts)


def standing_line(
    group_name: str,
    group: Standing,
    member: Standing,
    half_life: float,
    count: str = "gpu_hours",
) -> str:
    """What a user is told of their standing: ``Lab fair share: you used 3.2 GPU-hours
    recently (half-life 7 days), 0.50 x your share; Lab 1.20 x its share`` (billed
    units where fair share counts them)."""
    return (
        f"{group_name} fair share: you used {used_words(count, member.usage)} recently "
        f"(half-life {words.duration(half_life)}), {member.standing:.2f} x your share; "
        f"{group_name} {group.standing:.2f} x its share"
    )


def format_usage(hours: float) -> str:
    return words.number(hours)


# ---- every owner at once (the service's views) -------------------------------------


def standings(
    policy: Policy,
    groups_usage: Mapping[str, float],
    members_usage: Mapping[tuple[str, str], float],
) -> tuple[dict[str, Standing], dict[tuple[str, str], Standing]]:
    """Every group's and member's standing from their decayed usage (a group's with its
    children's; a member's in the group their servers are charged to), by the same
    formulas as ``FairShareBook.group_standing`` and ``member_standing``."""
    groups: dict[str, Standing] = {}
    siblings: dict[str | None, list[str]] = {}
    for group in policy.all_groups:
        siblings.setdefault(group.parent, []).append(group.name)
    for names in siblings.values():
        total = sum(groups_usage.get(n, 0.0) for n in names)
        shares = sum(policy.group(n).share for n in names)
        for name in names:
            usage = groups_usage.get(name, 0.0)
            fraction = policy.group(name).share / shares
            groups[name] = Standing(usage, fraction, usage / total if total > 0 else 0.0)
    own: dict[str, list[tuple[str, float]]] = {}
    for (user, group), usage in members_usage.items():
        own.setdefault(group, []).append((user, usage))
    members: dict[tuple[str, str], Standing] = {}
    for group, owned in own.items():
        total = sum(u for _, u in owned)
        for user, usage in owned:
            used = usage / total if total > 0 else 0.0
            members[(user, group)] = Standing(usage, 1.0 / len(owned), used)
    return groups, members
