"""The profile list the spawner offers: one entry per (group, profile) the user's
groups allow, each with its group's live remaining quota and budgets, the user's and
the group's fair-share standing (with ``fair_share``) and, where the site shows it,
the free cluster capacity of its flavor.

Capacity comes from one watch of nodes and bound pods shared by every spawner of
the hub (``kube.clusterview``), started by the first list that needs it.
"""

from __future__ import annotations

from typing import Any

from ..core.admission import Ledger
from ..core.budgets import BudgetState
from ..core.capacity import FlavorCapacity
from ..core.fairshare import standing_line
from ..core.model import Policy
from ..core.profiles import profile_entry, with_usable_default
from ..core.selection import offers
from ..kube.clusterview import ClusterView
from .ports import ProfileViewer

#: the watch of nodes and bound pods the profile list's capacity is read from
_cluster_view: ClusterView | None = None


def cluster_view() -> ClusterView | None:
    """The hub's watch of the cluster, once a profile list has started it."""
    return _cluster_view


async def offered_profiles(
    spawner: ProfileViewer, policy: Policy, ledger: Ledger, *, wait: bool
) -> list[dict[str, Any]]:
    """The spawner's user's profile list; ``wait``: for the first list of nodes and
    pods, so that capacity shows from the very first page."""
    capacity = await _capacity(spawner, policy, wait)
    budgets = spawner.admission.budgets
    per_group: dict[str, list[BudgetState]] = {}
    usable_again: dict[str, float | None] = {}
    standings: dict[str, str | None] = {}
    entries = []
    for offer in offers(policy, spawner._user_groups()):
        group = offer.group
        if group.name not in per_group:
            states = per_group[group.name] = budgets(policy, spawner.user.name, group)
            usable_again[group.name] = spawner.admission.usable_again(states)
        entry = profile_entry(
            policy,
            ledger,
            offer,
            capacity,
            per_group[group.name],
            usable_again[group.name],
            user=spawner.user.name,
        )
        if offer.profile.gpu and policy.fair_share is not None:
            if group.name not in standings:
                standings[group.name] = _standing(spawner, policy, group.name)
            if standings[group.name]:
                entry["description"] += f" · {standings[group.name]}"
        entries.append(entry)
    return with_usable_default(entries)


def _standing(spawner: ProfileViewer, policy: Policy, group: str) -> str | None:
    """The user's and the group's fair-share standing, in words (None: not known yet)."""
    admission = spawner.admission
    if policy.fair_share is None or not admission.usage_loaded:
        return None
    book = admission.fair_book(policy)
    now, running = admission.clock(), admission.ledger.charges
    return standing_line(
        policy.group(group).display_name,
        book.group_standing(group, now, running),
        book.member_standing(spawner.user.name, group, now, running),
        policy.fair_share.half_life,
        policy.fair_share.count,
    )


async def _capacity(
    spawner: ProfileViewer, policy: Policy, wait: bool
) -> dict[str, FlavorCapacity] | None:
    """Free cluster capacity per flavor, or None when it is unknown or turned off."""
    global _cluster_view
    if not spawner.show_cluster_capacity:
        return None
    if _cluster_view is None:
        view = _cluster_view = ClusterView(spawner.api.api_client, spawner.log).start()
        if wait:
            # the first list of nodes and pods, so the very first page shows capacity
            await view.wait_ready(spawner.k8s_api_request_timeout)
    return _cluster_view.capacity(policy)
