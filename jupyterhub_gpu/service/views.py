"""What one viewer may see: the usage, capacity and servers view models (pure).

Tenant isolation lives here, in one place, tested without I/O:

- a hub admin, or a member of a policy group with ``admin: true``, sees every
  group and every server; so does a token with the custom scope
  ``custom:gpu-usage:read`` asking the JSON/CSV API (a billing job's), which
  makes it no admin of anything else;
- anyone else sees only the policy groups they belong to plus ``everyone``
  (every user is in it; its numbers are totals, with no names), and only
  their own servers and the notices about them.

A group's parent is not shown to a member of a child group: it aggregates
sibling groups the member does not belong to.

Cluster capacity per flavor is the same for everyone: it names flavors, never
groups or users.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Any

from ..core.admission import Ledger, Usage
from ..core.capacity import FlavorCapacity
from ..core.datasets import DatasetState
from ..core.dra import DraInventory, pod_allocation
from ..core.model import Group, Policy
from ..core.quantities import format_bytes, format_cpu, format_gpus
from ..core.selection import member_groups
from .fair_share import fair_share_view
from .tasks import error_for_viewer

#: the hub custom scope that reads every group's usage, history and showback through
#: the service's API, and nothing else: what a billing job's service token is given
USAGE_READ_SCOPE = "custom:gpu-usage:read"
#: its definition, as ``JupyterHub.custom_scopes`` takes it (z2jh:
#: ``hub.config.JupyterHub.custom_scopes``)
CUSTOM_SCOPES = {
    USAGE_READ_SCOPE: {
        "description": "Read every group's GPU usage, history and showback from the GPU service"
    }
}


@dataclass(frozen=True)
class Viewer:
    """Who is asking, as the hub identified them (OAuth or token)."""

    name: str
    admin: bool = False
    groups: frozenset[str] = frozenset()
    #: the request's token has ``custom:gpu-usage:read``: sees what an admin sees
    reads_all: bool = False

    @classmethod
    def from_hub_model(cls, model: Mapping[str, Any], *, api: bool = False) -> Viewer:
        """The viewer a hub model names; ``api``: a request of the JSON/CSV API, where
        the token's ``custom:gpu-usage:read`` counts (only unfiltered: a filtered
        form such as ``custom:gpu-usage:read!group=x`` reads nothing more)."""
        return cls(
            name=str(model.get("name", "")),
            admin=bool(model.get("admin")),
            groups=frozenset(model.get("groups") or ()),
            reads_all=api and USAGE_READ_SCOPE in (model.get("scopes") or ()),
        )


@dataclass(frozen=True)
class Server:
    """A server as the hub reports it, joined to the group it is charged to."""

    user: str
    name: str  # "" for the default server
    #: the group its pod is labelled with; for a spawn without a pod yet, the one its
    #: options name ("<group>--<profile>"); None: not charged to any group
    group: str | None
    profile: str | None
    started: datetime | None
    ready: bool
    pending: str | None  # "spawn", "stop", or None
    has_pod: bool = True  # False: no pod yet (e.g. waiting in its group's line)
    #: the hub's last sign of use (proxied requests, the server's own activity reports)
    last_activity: datetime | None = None
    #: started before the policy (its pod has none of the policy's labels): charged to
    #: ``group`` by the adoption rule, and never stopped by the runtime or idle rules
    before_policy: bool = False
    #: its pod's uid (what its DRA claims name as their owner); None: no pod known
    pod_uid: str | None = None

    @property
    def label(self) -> str:
        return server_label(self.user, self.name)


def server_label(user: str, name: str) -> str:
    """``ann`` for a user's default server, ``ann/b`` for their named server ``b``:
    what notices call a server, so a user with several knows which one."""
    return f"{user}/{name}" if name else user


@dataclass(frozen=True)
class Notice:
    """Something the service did or found, shown on the page and in the log."""

    at: datetime
    text: str
    group: str | None = None
    user: str | None = None
    #: the server it is about (its name, its pod's uid), what kind, and the stop it
    #: announces: kept per server in the usage database (``server_events``)
    server: str | None = None
    uid: str | None = None
    kind: str = "notice"
    stop_at: datetime | None = None


@dataclass
class Snapshot:
    """Everything the views read, as the watchers and pollers last saw it."""

    ledger: Ledger
    servers: Sequence[Server]
    capacity: Mapping[str, FlavorCapacity] | None  # None: unknown (no node access)
    notices: Sequence[Notice] = ()
    tasks: Sequence[Mapping[str, Any]] = ()
    over_limit: Mapping[str, str] = field(default_factory=dict)  # group -> reason
    #: precomputed by the state (None: computed here from ``servers``)
    waiting: Mapping[str, Sequence[Server]] | None = None
    by_user: Mapping[str, Sequence[Server]] | None = None
    #: GPU-hours per group and per member (``gpu_time.GPUTimeSnapshot``); None: not read
    gpu_time: Any = None
    #: the idle rule's last run: servers judged by DCGM and those without a series
    #: (``idle.Coverage``); None: no run yet, no Prometheus, or it did not answer
    idle: Any = None
    #: server pods no hub server owns (``orphans.Orphan.to_json``), as last found
    orphans: Sequence[Mapping[str, Any]] = ()
    #: the replicas' Lease, its timings and who leads (``LeaseElector.to_json``); None:
    #: one process in the hub's pod
    lease: Mapping[str, Any] | None = None
    #: servers due to stop that wait for the hub to answer
    stops_waiting_for_hub: int = 0
    #: server pods whose labels cannot be true, charged to nobody (``ServerPod.foreign_json``)
    foreign_pods: Sequence[Mapping[str, Any]] = ()
    #: per group, its datasets and whether their claims exist, as last read
    #: (``datasets.DatasetClaims``); a group not in it shows no datasets
    datasets: Mapping[str, Sequence[DatasetState]] = field(default_factory=dict)
    #: the DRA objects, for the devices each server's claims were allocated (None: the
    #: policy has no DRA flavor)
    dra: DraInventory | None = None

    def lines(self) -> Mapping[str, Sequence[Server]]:
        """Per group, the spawns waiting in its line, oldest first."""
        return self.waiting if self.waiting is not None else waiting_lines(self.servers)


def shown_flavors(group: Group, usage: Usage) -> list[str]:
    """The flavors a group's numbers are given for: those it holds or is capped in."""
    return sorted(set(usage.flavors) | set(group.limit.flavors) | set(group.quota.flavors))


#: servers listed per view unless asked for more (an admin of 5,000 servers pages)
SERVERS_PAGE = 200


def is_policy_admin(policy: Policy, viewer: Viewer) -> bool:
    """Sees every group and server (a reader with the usage scope too; it may do nothing
    more: anything the service ever lets admins do must ask ``viewer.admin``)."""
    return (
        viewer.admin
        or viewer.reads_all
        or any(policy.groups[g].admin for g in viewer.groups if g in policy.groups)
    )


def visible_groups(policy: Policy, viewer: Viewer) -> list[Group]:
    """The groups this viewer may see, in policy order, ``everyone`` last."""
    if is_policy_admin(policy, viewer):
        return policy.all_groups
    return member_groups(policy, viewer.groups)


def _amount(used: Any, quota: Any, limit: Any, fmt) -> dict[str, Any]:
    def number(value: Any) -> float | int | None:
        if value is None:
            return None
        if isinstance(value, Fraction):
            return int(value) if value.denominator == 1 else round(float(value), 4)
        return value

    return {
        "used": number(used),
        "quota": number(quota),
        "limit": number(limit),
        "text": f"{fmt(used)} of {fmt(limit)}" if limit is not None else f"{fmt(used)}",
    }


def group_view(
    policy: Policy,
    group: Group,
    usage: Usage,
    waiting: int,
    over_limit: str | None,
    datasets: Sequence[DatasetState] = (),
) -> dict[str, Any]:
    quota, limit = group.quota, group.limit
    flavors = []
    for flavor in shown_flavors(group, usage):
        flavors.append(
            {
                "flavor": flavor,
                "display_name": policy.flavors[flavor].display_name
                if flavor in policy.flavors
                else flavor,
                **_amount(
                    usage.flavors.get(flavor, 0),
                    quota.flavors.get(flavor),
                    limit.flavors.get(flavor),
                    str,
                ),
            }
        )
    return {
        "name": group.name,
        "display_name": group.display_name,
        "unlimited": group.unlimited,
        "max_runtime_seconds": group.max_runtime,
        "gpus": _amount(usage.gpus, quota.gpus, limit.gpus, format_gpus),
        "cpu": _amount(usage.cpu, quota.cpu, limit.cpu, format_cpu),
        "memory": _amount(usage.memory, quota.memory, limit.memory, format_bytes),
        "servers": _amount(usage.servers, quota.servers, limit.servers, str),
        "flavors": flavors,
        "waiting": waiting,
        "over_limit": over_limit,
        # what its servers mount; a dataset whose claim is missing refuses every spawn
        "datasets": [state.to_json() for state in datasets],
    }


def capacity_view(capacity: Mapping[str, FlavorCapacity] | None, policy: Policy) -> dict[str, Any]:
    if capacity is None:
        return {"known": False, "flavors": []}
    flavors = []
    for name, cap in capacity.items():
        flavors.append(
            {
                "flavor": name,
                "display_name": policy.flavors[name].display_name
                if name in policy.flavors
                else name,
                "unit": cap.unit,
                "allocatable": cap.allocatable,
                "allocated": cap.allocated,
                "free": cap.free,
                "free_gpus": None if cap.free_gpus is None else round(float(cap.free_gpus), 4),
                "nodes": cap.nodes,
                "note": cap.note,
            }
        )
    return {"known": True, "flavors": flavors}


def waiting_lines(servers: Iterable[Server]) -> dict[str, list[Server]]:
    """Per group, spawns without a pod yet, oldest first: the group's line as the hub runs it."""
    lines: dict[str, list[Server]] = {}
    for server in servers:
        if server.group and server.pending == "spawn" and not server.has_pod:
            lines.setdefault(server.group, []).append(server)
    for line in lines.values():
        line.sort(key=lambda s: (s.started or datetime.max, s.label))
    return lines


def server_view(
    policy: Policy,
    server: Server,
    now: datetime,
    position: int | None,
    dra: DraInventory | None = None,
) -> dict[str, Any]:
    group = policy.find_group(server.group)
    runtime = (now - server.started).total_seconds() if server.started else None
    # a server from before the policy is never stopped for its runtime
    max_runtime = group.max_runtime if group and not server.before_policy else None
    return {
        "user": server.user,
        "name": server.name,
        "group": server.group,
        "profile": server.profile,
        "started": server.started.isoformat() if server.started else None,
        "ready": server.ready,
        "pending": server.pending,
        "runtime_seconds": None if runtime is None else int(runtime),
        "max_runtime_seconds": max_runtime,
        "stops_in_seconds": None
        if runtime is None or max_runtime is None
        else max(int(max_runtime - runtime), 0),
        "queue_position": position,
        "before_policy": server.before_policy,
        "devices": list(allocated_words(dra, server.pod_uid)),
    }


def allocated_words(dra: DraInventory | None, pod_uid: str | None) -> tuple[str, ...]:
    """The DRA devices a server's claims were allocated, in words (``gpu-1 (NVIDIA H200
    NVL) on h200-dra-0``); none for a server without DRA devices, or unknown."""
    if dra is None or dra.problem is not None or not pod_uid:
        return ()
    allocation = pod_allocation(dra, pod_uid)
    return allocation.words if allocation is not None else ()


def _group_view(
    policy: Policy,
    snapshot: Snapshot,
    group: Group,
    lines: Mapping[str, Sequence[Server]],
    cache: dict[str, tuple[Any, dict[str, Any]]] | None,
) -> dict[str, Any]:
    usage = snapshot.ledger.usage(group.name)
    waiting = len(lines.get(group.name, ()))
    over_limit = snapshot.over_limit.get(group.name)
    datasets = snapshot.datasets.get(group.name, ())
    # everything the view is made of: an unchanged group reuses its view object
    key = (
        usage.gpus,
        usage.cpu,
        usage.memory,
        usage.servers,
        tuple(sorted(usage.flavors.items())),
        waiting,
        over_limit,
        tuple((state.dataset.name, state.status) for state in datasets),
    )
    if cache is not None:
        cached = cache.get(group.name)
        if cached is not None and cached[0] == key:
            return cached[1]
    view = group_view(policy, group, usage, waiting, over_limit, datasets)
    if cache is not None:
        cache[group.name] = (key, view)
    return view


def usage_view(
    policy: Policy,
    snapshot: Snapshot,
    viewer: Viewer,
    now: datetime,
    *,
    servers_offset: int = 0,
    servers_limit: int = SERVERS_PAGE,
    group_cache: dict[str, tuple[Any, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The whole view for one viewer: groups, capacity, servers, notices, service health.

    Servers are listed ``servers_limit`` at a time from ``servers_offset``
    (``servers_total`` says how many the viewer may see). ``group_cache``
    (kept by the caller across calls) memoises each group's view, the same for
    every viewer, until what it is made of changes.
    """
    admin = is_policy_admin(policy, viewer)
    groups = visible_groups(policy, viewer)
    lines = snapshot.lines()
    positions = {(s.user, s.name): i + 1 for line in lines.values() for i, s in enumerate(line)}
    if admin:
        visible: Sequence[Server] = snapshot.servers
    elif snapshot.by_user is not None:
        visible = snapshot.by_user.get(viewer.name, ())
    else:
        visible = [s for s in snapshot.servers if s.user == viewer.name]
    page = visible[servers_offset : servers_offset + max(servers_limit, 0)]
    servers = [
        server_view(policy, s, now, positions.get((s.user, s.name)), snapshot.dra) for s in page
    ]
    notices = [
        {
            "at": n.at.isoformat(),
            "text": n.text,
            "group": n.group,
            "user": n.user,
            # the stop it announces, to the second (its text says it to the minute)
            "stop_at": n.stop_at.isoformat() if n.stop_at is not None else None,
        }
        for n in snapshot.notices
        if admin or n.user == viewer.name
    ]
    return {
        "user": viewer.name,
        "admin": admin,
        "groups": [_group_view(policy, snapshot, g, lines, group_cache) for g in groups],
        "capacity": capacity_view(snapshot.capacity, policy),
        "servers": servers,
        "servers_total": len(visible),
        "servers_offset": servers_offset,
        "notices": notices,
        # what the service's own loops last did: admins only (errors name namespaces)
        # a group's admins and billing tokens see them too, but a database's error (its
        # host and user) only a hub admin
        "tasks": [task_view(t, viewer.admin) for t in snapshot.tasks] if admin else [],
        # server pods no hub server owns (they name pods and namespaces): admins only
        "orphans": list(snapshot.orphans) if admin else [],
        # pods labelled as servers they cannot be, charged to nobody: admins only
        "foreign_pods": list(snapshot.foreign_pods) if admin else [],
        # which replica acts and the Lease's timings (replica names): admins only
        "lease": dict(snapshot.lease) if admin and snapshot.lease else None,
        "stops_waiting_for_hub": snapshot.stops_waiting_for_hub if admin else 0,
        "gpu_hours": gpu_hours_view(snapshot.gpu_time, groups, viewer),
        "fair_share": fair_share_view(
            getattr(snapshot.gpu_time, "fair_share", None), groups, viewer.name, admin
        ),
    }


def task_view(task: Mapping[str, Any], hub_admin: bool) -> Mapping[str, Any]:
    """A background task's status as this viewer may read it (``error_for_viewer``)."""
    shown = error_for_viewer(task.get("last_error"), hub_admin)
    return task if shown == task.get("last_error") else {**task, "last_error": shown}


#: what a user who is not an admin is told when the usage database cannot be read (its
#: own error names the database's host and user)
DATABASE_UNAVAILABLE = "the GPU usage database cannot be read now; an admin can see why"


def gpu_hours_view(gpu_time: Any, groups: Sequence[Group], viewer: Viewer) -> dict[str, Any]:
    """GPU-hours used in each visible group's window and its budget, and the viewer's own
    in each of their groups; and whether the usage database can be read."""
    if gpu_time is None:
        return {
            "groups": {},
            "mine": {},
            "accounting": {"ok": None, "error": None, "when_unavailable": None},
        }
    mine = {
        group.name: hours.to_json()
        for group in groups
        if (hours := gpu_time.users.get((viewer.name, group.name))) is not None
    }
    return {
        "groups": {
            g.name: gpu_time.groups[g.name].to_json() for g in groups if g.name in gpu_time.groups
        },
        "mine": mine,
        "accounting": {
            "ok": gpu_time.error is None,
            # the database's own words name its host and user: admins only
            "error": gpu_time.error
            if viewer.admin or gpu_time.error is None
            else DATABASE_UNAVAILABLE,
            # what a GPU spawn of a group with a budget does while the database is down
            "when_unavailable": "admit" if gpu_time.fail_open else "refuse",
            # how far behind the accounting is: what is kept to be written, and since
            # when the numbers shown are
            **gpu_time.lag.to_json(time.time()),
            "numbers_from": gpu_time.read_at,
        },
    }


class CachedUsage:
    """``usage_view`` and its JSON, each group's part built and encoded once per change.

    An admin's view of 500 groups is mostly group views, the same for every viewer
    until the group changes; building and encoding each once takes most of the
    cost out of repeated requests.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._views: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._json: dict[str, tuple[dict[str, Any], str]] = {}

    def view(
        self, snapshot: Snapshot, viewer: Viewer, now: datetime, **paging: int
    ) -> dict[str, Any]:
        return usage_view(self.policy, snapshot, viewer, now, group_cache=self._views, **paging)

    def json(self, snapshot: Snapshot, viewer: Viewer, now: datetime, **paging: int) -> str:
        """``view`` as JSON, each group's part from its cached encoding."""
        view = self.view(snapshot, viewer, now, **paging)
        groups = view.pop("groups")
        parts = []
        for group in groups:
            cached = self._json.get(group["name"])
            if cached is None or cached[0] is not group:
                cached = self._json[group["name"]] = (group, json.dumps(group))
            parts.append(cached[1])
        rest = json.dumps(view)
        return f'{rest[:-1]}, "groups": [{",".join(parts)}]}}'
