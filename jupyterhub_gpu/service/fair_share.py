"""The service's part in fair share: every group's and member's standing, per pass.

The service keeps a ``FairShareBook`` fed with the same rows as its ``UsageBook``
(``GPUTime.read``); each pass computes every standing now and a day ago (the
records of the last day taken back from today's usage), for ``api/usage``, the
dashboard and the metrics, in what fair share counts: GPU-hours, or billed units
with ``count: billed_units`` (``decayed_gpu_hours`` or ``decayed_billed_units`` in
``api/usage``). The hub keeps its own book, from the same database,
for its waiting line.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from ..core import words
from ..core.budgets import UsageRecord
from ..core.decayed import usage_since
from ..core.fairshare import (
    FairShareBook,
    Standing,
    Waiter,
    format_usage,
    line_key,
    line_order,
    standings,
    used_words,
)
from ..core.model import Group, Policy

if TYPE_CHECKING:
    from .views import Server

#: how far back "how it changed" looks
CHANGE_OVER = 86400.0
#: the users an admin's view lists, highest standing first
USERS_LISTED = 200


@dataclass(frozen=True)
class Owner:
    """One group's or member's standing now and a day ago."""

    usage: float  # decayed GPU-hours (or billed units: ``FairShareSnapshot.count``) now
    share: float  # fraction of the shares it is measured among
    standing: float
    day_ago: float  # its standing a day ago

    def to_json(self, count: str = "gpu_hours") -> dict[str, float]:
        return {
            f"decayed_{count}": round(self.usage, 4),
            "share": round(self.share, 4),
            "standing": round(self.standing, 4),
            "standing_day_ago": round(self.day_ago, 4),
            "change": round(self.standing - self.day_ago, 4),
        }


@dataclass(frozen=True)
class FairShareSnapshot:
    half_life: int
    max_wait: int
    groups: dict[str, Owner]
    users: dict[tuple[str, str], Owner]  # (user, group)
    #: what the usage is in: ``gpu_hours`` or ``billed_units`` (``FairShare.count``)
    count: str = "gpu_hours"


def fair_lines(
    policy: Policy,
    fair: FairShareSnapshot | None,
    lines: Mapping[str, Sequence[Server]],
    now: float,
) -> dict[str, list[Server]]:
    """Each group's waiting line in the order the hub lets its servers go with fair
    share (``core.fairshare.line_order``): those that waited ``max_wait`` first, then
    by usage per share from the top-level group down and the member's own usage,
    arrival breaking ties. Without fair share (or before the first read), arrival
    order as given."""
    if fair is None or policy.fair_share is None:
        return {group: list(line) for group, line in lines.items()}

    def group_usage(name: str) -> float:
        owner = fair.groups.get(name)
        return owner.usage if owner else 0.0

    ordered = {}
    for group, line in lines.items():
        waiters = []
        for seq, server in enumerate(line):
            member = fair.users.get((server.user, group))
            waiters.append(
                Waiter(
                    key=server.label,
                    user=server.user,
                    group=group,
                    chain=tuple(policy.charged_groups(group)),
                    arrived=server.started.timestamp() if server.started else now,
                    seq=seq,
                    standing=line_key(policy, group, group_usage, member.usage if member else 0.0),
                )
            )
        by_key = {w.key: s for w, s in zip(waiters, line, strict=True)}
        order = line_order(waiters, now, policy.fair_share.max_wait)
        ordered[group] = [by_key[w.key] for w in order]
    return ordered


def _owners(now: Mapping[Any, Standing], then: Mapping[Any, Standing]) -> dict[Any, Owner]:
    zero = Standing(0.0, 1.0, 0.0)
    return {
        key: Owner(s.usage, s.share, s.standing, then.get(key, zero).standing)
        for key, s in now.items()
    }


def fair_share_snapshot(
    policy: Policy,
    book: FairShareBook,
    records: Iterable[UsageRecord],
    now: float,
    running: Container[str],
) -> FairShareSnapshot:
    """Every standing now and ``CHANGE_OVER`` ago; ``records``: at least every record
    that overlaps that time (the service's book holds them)."""
    assert policy.fair_share is not None
    groups_now = {g.name: book.group_usage(g.name, now, running) for g in policy.all_groups}
    members_now = {
        (user, group): book.member_usage(user, group, now, running)
        for group, users in book.member_names.items()
        for user in users
    }
    since = now - CHANGE_OVER
    recent = [r for r in records if r.end(now, running) > since]
    groups_recent, members_recent = usage_since(
        policy, recent, since, now, book.half_life, running, book.billing
    )
    groups_then = {g: max(u - groups_recent.get(g, 0.0), 0.0) for g, u in groups_now.items()}
    members_then = {m: max(u - members_recent.get(m, 0.0), 0.0) for m, u in members_now.items()}
    # standings are ratios: the usage a day ago needs no decaying back to compare
    g_now, m_now = standings(policy, groups_now, members_now)
    g_then, m_then = standings(policy, groups_then, members_then)
    return FairShareSnapshot(
        policy.fair_share.half_life,
        policy.fair_share.max_wait,
        _owners(g_now, g_then),
        _owners(m_now, m_then),
        policy.fair_share.count,
    )


def fair_share_view(
    snapshot: FairShareSnapshot | None, groups: Sequence[Group], user: str, admin: bool
) -> dict[str, Any] | None:
    """``api/usage``'s ``fair_share``: the visible groups' standings, the viewer's own in
    each of their groups and, for admins, every member's (highest standing first)."""
    if snapshot is None:
        return None
    visible, count = {g.name for g in groups}, snapshot.count
    view: dict[str, Any] = {
        "half_life_seconds": snapshot.half_life,
        "max_wait_seconds": snapshot.max_wait,
        "count": count,
        "groups": {n: o.to_json(count) for n, o in snapshot.groups.items() if n in visible},
        "mine": {
            g: o.to_json(count)
            for (u, g), o in snapshot.users.items()
            if u == user and g in visible
        },
    }
    if admin:
        ranked = sorted(snapshot.users.items(), key=lambda item: -item[1].standing)
        view["users"] = [
            {"user": u, "group": g, **o.to_json(count)} for (u, g), o in ranked[:USERS_LISTED]
        ]
        view["users_total"] = len(ranked)
    return view


def _change(value: float) -> str:
    if math.isclose(value, 0.0, abs_tol=5e-3):
        return "="
    return f"{'+' if value > 0 else '-'}{abs(value):.2f}"


def _row(cells: Sequence[str], o: dict[str, float], count: str) -> str:
    return (
        "<tr>"
        + "".join(f"<td>{escape(c)}</td>" for c in cells)
        + f'<td class="num">{format_usage(o[f"decayed_{count}"])}</td>'
        + f'<td class="num">{o["share"]:.0%}</td>'
        + f'<td class="num">{o["standing"]:.2f}</td>'
        + f'<td class="num">{_change(o["change"])}</td></tr>'
    )


def fair_share_section(view: dict[str, Any] | None) -> str:
    """The dashboard's fair-share part: the viewer's standing and their groups'; for
    admins, the groups and users by standing and how each changed over a day."""
    if not view:
        return ""
    half_life = words.duration(view["half_life_seconds"])
    count = view.get("count", "gpu_hours")
    billed = count == "billed_units"
    head = (
        f'<th class="num">Recent {"billed units" if billed else "GPU-hours"}</th>'
        '<th class="num">Share</th>'
        '<th class="num">Standing</th><th class="num">Change (1 day)</th></tr>'
    )
    groups = sorted(view["groups"].items(), key=lambda item: -item[1]["standing"])
    used = (
        "billed units used recently (each GPU-hour times its flavor's billing weight)"
        if billed
        else "GPU time used recently"
    )
    parts = [
        "<h2>Fair share</h2>",
        f'<p class="muted">Who waits for a GPU goes in order of standing: {used} '
        f"(counting half after {half_life}, a quarter after twice that) against "
        "the share. 1 is exactly the share, below 1 less (goes first), above 1 more.</p>",
    ]
    for group, o in view["mine"].items():
        parts.append(
            f'<p class="standing">{escape(group)}: you used '
            f"{used_words(count, o[f'decayed_{count}'])} recently, {o['standing']:.2f} x your "
            f"share ({_change(o['change'])} since yesterday)</p>"
        )
    parts.append(
        '<table class="fair-share-groups"><tr><th>Group</th>'
        + head
        + "".join(_row([name], o, count) for name, o in groups)
        + "</table>"
    )
    if view.get("users"):
        parts.append(
            f"<h3>Users by standing ({len(view['users'])} of {view['users_total']})</h3>"
            '<table class="fair-share-users"><tr><th>User</th><th>Group</th>'
            + head
            + "".join(_row([u["user"], u["group"]], u, count) for u in view["users"])
            + "</table>"
        )
    return "".join(parts)
