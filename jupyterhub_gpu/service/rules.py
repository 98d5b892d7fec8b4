"""Runtime rules (pure): which servers are past ``max_runtime``, which groups over limit.

Both read only what Kubernetes and the hub report now, so a restarted service
reaches the same answers with no state of its own. The one thing kept in
memory is when a group was first seen over its limit (for the optional grace
period before stopping): after a restart the grace period starts again, which
only ever delays a stop, never hastens one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from ..core.admission import Charge, Ledger, amount
from ..core.model import Amounts, Policy
from .views import Server


def overdue(policy: Policy, servers: Iterable[Server], now: datetime) -> list[tuple[Server, int]]:
    """Servers running longer than their group's ``max_runtime``, with that limit in seconds.

    A server still starting or already stopping is left alone: the first is not
    running yet, the second is on its way out; so is one started before the policy.
    """
    result = []
    for server in servers:
        if server.started is None or server.pending or server.before_policy:
            continue
        group = policy.find_group(server.group)
        if group is None or group.max_runtime is None:
            continue
        if (now - server.started).total_seconds() > group.max_runtime:
            result.append((server, group.max_runtime))
    return result


def over_limit(policy: Policy, ledger: Ledger) -> dict[str, str]:
    """Groups whose servers now exceed their limit (e.g. after a policy change), with why."""
    result = {}
    for group in policy.all_groups:
        if group.unlimited:
            continue
        reason = _over(policy, group.display_name, ledger, group.name, group.limit)
        if reason:
            result[group.name] = reason
    return result


def _over(policy: Policy, name: str, ledger: Ledger, group: str, limit: Amounts) -> str | None:
    # the group's whole usage as the need: which cap does it pass on its own
    passed = limit.first_passed(ledger.usage(group))
    if passed is None:
        return None
    return (
        f"{name} uses {amount(policy, passed.need, passed.unit)}, over its limit of "
        f"{amount(policy, passed.cap, passed.unit)}"
    )


def to_stop_for_limit(
    policy: Policy,
    ledger: Ledger,
    group: str,
    created: Mapping[str, datetime],
) -> list[Charge]:
    """The youngest servers of a group whose stopping brings it back within its limit."""
    limit = policy.group(group).limit
    charges = sorted(
        (c for c in ledger.charges.values() if c.group == group),
        key=lambda c: created.get(c.key, datetime.min),
        reverse=True,
    )
    trial = Ledger.from_charges(policy, ledger.charges.values())
    chosen = []
    for charge in charges:
        if _over(policy, group, trial, group, limit) is None:
            break
        trial.release(policy, charge.key)
        chosen.append(charge)
    return chosen
