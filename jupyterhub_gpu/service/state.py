"""What the service knows, all of it rebuilt from Kubernetes and the hub API.

``ServiceState`` holds the server pods (with their charges), the cluster's
nodes and bound pods (for capacity) and the hub's servers, each as its watcher
or poller last saw it. Derived values (the ledger, capacity, the servers joined
to their pods) are computed once per change, not per request, so a view with
5,000 servers costs only its own rendering.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ..admission import Charge, Ledger
from ..capacity import FlavorCapacity, flavor_capacity
from ..model import Policy
from ..shaping import charge_from_pod
from .views import Notice, Server, Snapshot

log = logging.getLogger("jupyterhub_gpu.service")

USERNAME_ANNOTATION = "hub.jupyter.org/username"
SERVERNAME_ANNOTATION = "hub.jupyter.org/servername"


@dataclass(frozen=True)
class ServerPod:
    """A pod labelled as a server of ours: what it is charged, and whose server it is."""

    key: str
    charge: Charge | None  # None: terminating, finished, or unreadable
    user: str | None
    servername: str
    created: datetime | None


def server_pod(pod: Mapping[str, Any]) -> ServerPod:
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    try:
        charge = charge_from_pod(pod)
    except ValueError as e:
        log.warning("%s; it is not counted", e)
        charge = None
    created = metadata.get("creationTimestamp")
    return ServerPod(
        key=key,
        charge=charge,
        user=annotations.get(USERNAME_ANNOTATION) or (charge.user if charge else None),
        servername=annotations.get(SERVERNAME_ANNOTATION, ""),
        created=datetime.fromisoformat(created.replace("Z", "+00:00")) if created else None,
    )


class ServiceState:
    def __init__(self, policy: Policy, notices: int = 200) -> None:
        self.policy = policy
        self.server_pods: dict[str, ServerPod] | None = None
        self.nodes: dict[str, Any] | None = None
        self.cluster_pods: dict[str, Any] | None = None
        self.servers: list[Server] | None = None
        self.notices: deque[Notice] = deque(maxlen=notices)
        self.over_limit: dict[str, str] = {}
        self._ledger: Ledger | None = None
        self._capacity: dict[str, FlavorCapacity] | None = None
        self._capacity_stale = True
        self._joined: list[Server] | None = None

    # ---- change notifications from the watchers and pollers ---------------------

    def pods_changed(self) -> None:
        self._ledger = None
        self._joined = None

    def capacity_changed(self) -> None:
        self._capacity_stale = True

    def set_servers(self, servers: list[Server]) -> None:
        self.servers = servers
        self._joined = None

    # ---- derived, cached -----------------------------------------------------------

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            charges = [p.charge for p in (self.server_pods or {}).values() if p.charge]
            self._ledger = Ledger.from_charges(self.policy, charges)
        return self._ledger

    @property
    def capacity(self) -> dict[str, FlavorCapacity] | None:
        if self.nodes is None or self.cluster_pods is None:
            return None
        if self._capacity_stale or self._capacity is None:
            self._capacity = flavor_capacity(
                self.policy, self.nodes.values(), self.cluster_pods.values()
            )
            self._capacity_stale = False
        return self._capacity

    @property
    def joined_servers(self) -> list[Server]:
        """The hub's servers, each marked with whether its pod exists yet."""
        if self._joined is None:
            with_pods = {(p.user, p.servername) for p in (self.server_pods or {}).values()}
            self._joined = [
                replace(s, has_pod=(s.user, s.name) in with_pods) for s in self.servers or []
            ]
        return self._joined

    def pod_of(self, user: str, servername: str) -> ServerPod | None:
        for pod in (self.server_pods or {}).values():
            if pod.user == user and pod.servername == servername:
                return pod
        return None

    def notice(self, notice: Notice) -> None:
        self.notices.append(notice)
        log.warning("%s", notice.text)

    def snapshot(self, tasks: Sequence[Mapping[str, Any]]) -> Snapshot:
        return Snapshot(
            ledger=self.ledger,
            servers=self.joined_servers,
            capacity=self.capacity,
            notices=list(self.notices),
            tasks=tasks,
            over_limit=self.over_limit,
        )
