"""The line spawns wait in while their group is full (``when_full: wait``): first
come, first served, or with ``fair_share`` by standing (``core.fairshare``), every
waiter's standing worked out for one moment."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict, deque
from collections.abc import Callable

from ..core import words
from ..core.fairshare import Place, Waiter, why_placed
from ..core.line import Line
from ..core.model import Group, Policy
from ..core.pending import STARTS_BY_ITSELF

#: seconds between two workings-out of every waiting server's standing (standings
#: move slowly: a half-life is days), all for one moment, off any spawn's path; a
#: newcomer's is worked out for that same moment, so the line compares like with like
#: (a group's usage grows while its servers run: standings of two moments differ)
ORDER_KEPT = 1.0
#: standings worked out between two turns of the event loop, when all are
STANDINGS_PER_TURN = 200

#: a waiter's standing at a moment: (user, group, moment) -> the line's sort key
Standing = Callable[[str, str, float], tuple]


class WaitingLine:
    """The servers waiting for capacity, in the order they go."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.line = Line()
        self._arrivals = itertools.count()
        #: the moment every waiting server's standing was worked out for, and the task
        #: that works them out again every ``ORDER_KEPT`` while any server waits
        self._standings_at: float | None = None
        self._restanding: asyncio.Task | None = None

    def waiter(self, policy: Policy, key: str, user: str, group: Group, now: float) -> Waiter:
        """A newcomer to the line (not in it yet: ``join``)."""
        chain = tuple(policy.charged_groups(group.name))
        return Waiter(key, user, group.name, chain, now, next(self._arrivals))

    def join(self, policy: Policy, me: Waiter, now: float, standing: Standing | None) -> None:
        """``me`` joins the line; with fair share (``standing``), with its standing
        worked out for the moment every other waiter's was (now, if none waits or
        theirs are older than ``ORDER_KEPT``), and the standings worked out again every
        ``ORDER_KEPT``."""
        line = self.ordered_by(policy, now)
        if standing is not None:
            at = self._standings_at
            if not len(line) or at is None or not 0 <= now - at < ORDER_KEPT:
                at = self._standings_at = now
            me.standing = standing(me.user, me.group, at)
            me.standing_at = at
            if self._restanding is None or self._restanding.done():
                with contextlib.suppress(RuntimeError):  # no event loop: nothing to keep
                    self._restanding = asyncio.get_running_loop().create_task(
                        self._restand_while_waiting(standing)
                    )
        line.join(me, now)

    def place(self, policy: Policy, me: Waiter, now: float) -> Place:
        """``me``'s place in the line now, among those waiting for the same capacity."""
        return self.ordered_by(policy, now).place(me, now)

    async def _restand_while_waiting(self, standing: Standing) -> None:
        """Every ``ORDER_KEPT`` while anyone waits: every waiter's standing worked out
        for one moment, ``STANDINGS_PER_TURN`` between two turns of the event loop,
        then the line filed anew at once."""
        while True:
            await asyncio.sleep(ORDER_KEPT)
            waiters = list(self.line)
            if not waiters:
                return
            now = self.clock()
            standings = []
            for i, w in enumerate(waiters):
                if i and i % STANDINGS_PER_TURN == 0:
                    await asyncio.sleep(0)
                standings.append(standing(w.user, w.group, now))
            for w, kept in zip(waiters, standings, strict=True):
                self.line.restand(w, kept, now)  # one that left meanwhile: passed over
            self._standings_at = now

    def ordered_by(self, policy: Policy, now: float) -> Line:
        """The line, ordered with ``policy``'s ``max_wait`` (filed anew for another)."""
        fair = policy.fair_share
        max_wait = fair.max_wait if fair is not None else None
        if self.line.max_wait != max_wait:
            waiters, self.line = list(self.line), Line(max_wait)
            for w in waiters:
                self.line.join(w, now)
        return self.line

    def by_group(self, policy: Policy | None) -> dict[str, deque[str]]:
        """Group -> the keys of its servers waiting, in the order they go."""
        lines: defaultdict[str, deque[str]] = defaultdict(deque)
        now = self.clock()
        line = self.ordered_by(policy, now) if policy is not None else self.line
        for w in line.ordered(now):
            lines[w.group].append(w.key)
        return lines


def wait_message(
    policy: Policy, group: Group, me: Waiter, where: Place, reason: str | None, now: float
) -> str:
    """What the spawn page says of a server waiting in its group's line: its place, why
    (fair share's order, what the group holds), and that it starts by itself."""
    text = f"Waiting for {group.display_name}: position {where.position} of {where.of}"
    fair = policy.fair_share
    why = []
    if fair is not None and where.of > 1:
        why.append(why_placed(me, where, now, fair.max_wait, fair.count))
    elif where.position > 1:
        text += f", {words.count(where.position - 1, 'spawn')} ahead of you"
    if reason:
        why.append(reason)
    if why:
        text += ": " + "; ".join(why)
    return f"{text}. {STARTS_BY_ITSELF}"
