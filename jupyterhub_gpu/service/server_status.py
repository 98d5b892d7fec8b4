"""One server's GPU time, as its own JupyterLab shows it (``api/servers/<user>/<name>``).

The JupyterLab extension's server side asks this with the server's own token
(``JUPYTERHUB_API_TOKEN``). Who may read a server's state is decided by the hub's
own access scope for it: ``access:servers!server=<user>/<name>`` (every server
token has it for its own server and for no other), ``access:servers!user=<user>``
(the user's own full tokens) or ``access:servers`` (an admin's). A server token
of any other server, an admin's included, reads nothing here.

Answered from memory (the state, the GPU-time snapshot, what the rules
remember): a request costs a look-up of the server's pod by (user, server name)
(``ServiceState.pod_of``), a pass over the user's servers and the last notices,
never a query or a pass over every server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..core import words
from ..core.model import Budget, Group, Policy
from ..core.quantities import format_gpus
from ..core.shaping import label_value
from .hours import HoursView
from .state import ServerPod
from .views import Server

#: how many of the user's latest notices an answer carries
NOTICES = 20

#: what avoids each kind of scheduled stop, in words for the user
AVOID = {
    "idle": "use the GPU before then: run a cell that uses it",
    "budget": "nothing in this server: the stop comes unless the budget frees or is raised",
    "max_runtime": "save your work; start a new server afterwards to go on",
}


#: why each kind of scheduled stop comes, in words for the user
STOP_WHY = {
    "budget": "the GPU budget of {owner} is used up",
    "idle": "the GPU is idle: {signal}",
    "max_runtime": "servers in {group} run at most {runtime}",
}


def may_read(scopes: Iterable[str], user: str, name: str) -> bool:
    """Whether a token with these (expanded) hub scopes may read server ``user/name``."""
    wanted = {
        "access:servers",
        f"access:servers!user={user}",
        f"access:servers!server={user}/{name}",
    }
    return not wanted.isdisjoint(scopes)


@dataclass(frozen=True)
class LastStop:
    """Why a server was last stopped by the service (or found stopped by others)."""

    at: float  # epoch seconds
    reason: str  # "idle", "budget", "max_runtime", "over_limit", "admin", "preempted", ...
    text: str  # in words, for the user
    what_to_do: str

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "reason": self.reason,
            "text": self.text,
            "what_to_do": self.what_to_do,
        }


WHAT_TO_DO = {
    "idle": "Start the server again from the hub when you need the GPU.",
    "budget": "Start a GPU server again when the budget frees, or a CPU-only one now.",
    "max_runtime": "Start a new server from the hub to go on.",
    "over_limit": "Start it again from the hub; it may wait until the group has room.",
}


def period_text(seconds: int) -> str:
    """A budget's window as people say it: 7 days, 1 day, 12 hours, 1 hour 30 minutes."""
    return words.duration(seconds)


def _stamp(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def budget_lines(
    policy: Policy,
    group: Group,
    user: str,
    groups: Mapping[str, HoursView],
    users: Mapping[tuple[str, str], HoursView],
) -> list[dict[str, Any]]:
    """Each budget the server counts against: its group's and parents', and the user's."""
    found: list[tuple[str, str, Budget, HoursView | None]] = []
    for level in policy.ancestors(group.name):
        if level.budget is not None:
            found.append(("group", level.display_name, level.budget, groups.get(level.name)))
    if group.user_budget is not None:
        found.append(
            (
                "user",
                f"{user} in {group.display_name}",
                group.user_budget,
                users.get((user, group.name)),
            )
        )
    lines = []
    for owner, name, budget, hours in found:
        limit = budget.amount
        used = hours.used if hours is not None else None
        lines.append(
            {
                "owner": owner,
                "name": name,
                # in the budget's unit: GPU-hours, or billed units (``in_units``)
                "in_units": budget.in_units,
                "limit_gpu_hours": limit,
                "used_gpu_hours": None if used is None else round(used, 4),
                "left_gpu_hours": None if used is None else round(max(limit - used, 0.0), 4),
                "period_seconds": budget.period,
                "period": period_text(budget.period),
                "exhausted": bool(hours and hours.exhausted),
                "when_exhausted": budget.when_exhausted,
                "grace_seconds": budget.grace if budget.when_exhausted == "stop" else None,
            }
        )
    return lines


def server_status(
    app: Any, user: str, name: str, now: datetime, last_stop: LastStop | None
) -> dict[str, Any]:
    """The answer for server ``user/name`` (``app``: the running ``GPUService``)."""
    policy: Policy = app.policy
    state = app.state
    server: Server | None = next(
        (s for s in (state._by_user.get(user) or ()) if s.name == name), None
    )
    pod: ServerPod | None = state.pod_of(user, name)
    answer: dict[str, Any] = {
        "user": user,
        "server": name,
        "now": now.timestamp(),
        "running": server is not None and server.ready and not server.pending,
        "pending": server.pending if server else None,
        # the start of the server running now: a last stop before it is an earlier run's
        "started": _stamp(server.started) if server else None,
        "group": None,
        "profile": server.profile if server else None,
        "flavor": None,
        "gpus": 0.0,
        "gpus_text": "0",
        "budgets": [],
        "budgets_current": bool(app.gpu_time.snapshot.current),
        "quota": None,
        "stops": [],
        "notices": [],
        "last_stop": last_stop.to_json() if last_stop else None,
        "dashboard_url": app.service_prefix,
        "hub_url": app.hub_prefix + "home",
        "rule_interval": app.rules_interval,
        "policy_change": policy_change(policy, pod),
    }
    answer["notices"] = [
        {"at": n.at, "text": n.message, "kind": n.kind, "stop_at": n.stop_at}
        for n in app.server_events.of_server(user, name)[-NOTICES:]
    ]
    group = policy.find_group(pod.charge.group if pod and pod.charge else None)
    if group is None or pod is None or pod.charge is None:
        return answer
    request = pod.charge.request
    answer["group"] = {"name": group.name, "display_name": group.display_name}
    answer["gpus"] = float(request.gpus)
    answer["gpus_text"] = format_gpus(request.gpus)
    if request.devices:
        flavor_name, units = request.devices[0]
        flavor = policy.flavors.get(flavor_name)
        answer["flavor"] = {
            "name": flavor_name,
            "display_name": flavor.display_name if flavor else flavor_name,
            "kind": flavor.kind if flavor else None,
            "units": units,
        }
    snapshot = app.gpu_time.snapshot
    answer["budgets"] = budget_lines(policy, group, user, snapshot.groups, snapshot.users)
    usage = state.ledger.usage(group.name)
    answer["quota"] = {
        "group": group.display_name,
        "gpus_used": float(usage.gpus),
        "gpus_used_text": format_gpus(usage.gpus),
        "quota_gpus": float(group.quota.gpus) if group.quota.gpus is not None else None,
        "limit_gpus": float(group.limit.gpus) if group.limit.gpus is not None else None,
        "servers": usage.servers,
    }
    answer["stops"] = scheduled_stops(app, group, server, pod)
    return answer


def policy_change(policy: Policy, pod: ServerPod | None) -> str | None:
    """Words for a server whose profile its group no longer offers, or whose group is
    gone (the policy changed while it ran): it runs on, but cannot be started the
    same way again. None for any other server."""
    if pod is None or pod.charge is None or pod.before_policy is not None or not pod.profile:
        return None
    group = policy.find_group(pod.charge.group)
    if group is None:
        return (
            f"The GPU policy no longer has this server's group ({pod.charge.group}): the "
            "server runs on, but cannot be started again the same way"
        )
    if pod.profile not in {label_value(p) for p in group.profiles}:
        return (
            f"The GPU policy no longer offers this server's profile ({pod.profile}) to "
            f"{group.display_name}: the server runs on, but next time choose another profile"
        )
    return None


def scheduled_stops(
    app: Any, group: Group, server: Server | None, pod: ServerPod
) -> list[dict[str, Any]]:
    """The stops ahead of this server, soonest first: budget grace, idle, max_runtime."""
    stops = []
    # the earliest stop a used-up budget announced, and whose budget it is
    budget_stop = app.budget_rule.scheduled_stop(pod)
    if budget_stop is not None:
        at, owner = budget_stop
        stops.append(
            {
                "kind": "budget",
                "at": at,
                "why": STOP_WHY["budget"].format(owner=owner),
                "avoid": AVOID["budget"],
            }
        )
    if server is not None:
        warning = app.idle_servers.warned.get((server.user, server.name, server.started))
        if warning is not None:
            stops.append(
                {
                    "kind": "idle",
                    "at": warning.stop_at.timestamp(),
                    "why": STOP_WHY["idle"].format(signal=warning.signal),
                    "avoid": AVOID["idle"],
                }
            )
        if (
            group.max_runtime is not None
            and server.started is not None
            and not server.before_policy
        ):
            stops.append(
                {
                    "kind": "max_runtime",
                    "at": server.started.timestamp() + group.max_runtime,
                    "why": STOP_WHY["max_runtime"].format(
                        group=group.display_name, runtime=words.duration(group.max_runtime)
                    ),
                    "avoid": AVOID["max_runtime"],
                }
            )
    stops.sort(key=lambda s: s["at"])
    return stops


def stop_text(reason: str, detail: str | None = None) -> str:
    """Why the service stopped a server, in words for its user."""
    words = {
        "idle": "its GPU was idle past the group's idle time, and the notice ran out",
        "budget": "a GPU budget it counts against was used up, and the grace ran out",
        "max_runtime": "it reached its group's maximum runtime",
        "over_limit": "its group stayed over its GPU limit",
    }.get(reason, reason)
    return f"The GPU service stopped this server: {words}" + (f" ({detail})" if detail else "")
