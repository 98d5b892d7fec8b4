"""What the service knows, all of it rebuilt from Kubernetes and the hub API.

``ServiceState`` holds the server pods (with their charges), the cluster's
nodes and bound pods (for capacity) and the hub's servers, each as its watcher
or poller last saw it. Derived values are kept so that a request costs only
its own view, even at 5,000 servers with pods churning:

- the ledger is rebuilt when a full list arrives and then updated by each
  watch event's difference (release the old charge, record the new);
- the devices requested per node are updated the same way, so capacity is a
  pass over nodes, not over every pod;
- the hub's servers are indexed by user, and the spawns still pending are
  kept apart for the waiting lines;
- a pod whose labels cannot be true (``core.claims``: labelled for a group outside
  the namespaces that group's servers run in, or naming a server whose pod is
  another) is foreign: kept apart for the admins' report and the log, charged to
  nobody, and never taken for any server's pod, so no rule judges a server by it.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from kubernetes_asyncio import client

from ..core.admission import Ledger
from ..core.adoption import DEFAULT_COMPONENT, adopt, servers_selector
from ..core.budgets import UsageRecord
from ..core.capacity import FlavorCapacity, counted_resources, flavor_capacity, pod_requests
from ..core.claims import Claim, foreign_namespace, foreign_user, impostors, parse_time
from ..core.dra import DraInventory
from ..core.model import Policy
from ..core.shaping import HUB_LABEL, label_value, namespace_for, of_another_hub
from ..kube.clusterview import capacity_watches, dra_inventory, dra_watches
from ..kube.reflector import Reflector
from .server_pods import ServerPod, as_foreign, as_labelled, newer, server_pod
from .views import Notice, Server, Snapshot, server_label, waiting_lines

# what callers import from here, some of it defined in the modules above
__all__ = ["ServerPod", "ServiceState", "server_pod"]

log = logging.getLogger("jupyterhub_gpu.service")

_FINISHED = ("Succeeded", "Failed")


def _node_requests(pod: Mapping[str, Any] | None, resources: set[str]):
    """(node, {resource: amount}) a bound, unfinished pod holds, or None."""
    if not pod:
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in _FINISHED:
        return None
    requests = pod_requests(pod)
    return node, {r: requests[r] for r in resources.intersection(requests)}


class ServiceState:
    def __init__(
        self,
        policy: Policy,
        notices: int = 200,
        hub_namespace: str | None = None,
        component: str = DEFAULT_COMPONENT,
    ) -> None:
        self.policy = policy
        #: KubeSpawner's component label of the hub's servers (``component_label``)
        self.component = component
        #: where the hub's servers from before the policy run (None: any namespace)
        self.hub_namespace = hub_namespace
        #: whether the hub's last answer told every user's servers (see ``set_servers``)
        self.servers_complete = False
        #: when the hub was asked for that answer (epoch seconds; 0: never)
        self.servers_asked_at = 0.0
        #: the hub's last answer as it came, joined to the pods again when they are listed
        self._hub_servers: list[Server] | None = None
        #: each user's JupyterHub groups, as the hub last reported them (None: not yet)
        self.user_groups: dict[str, tuple[str, ...]] | None = None
        #: the policy's group namespaces (with namespace_per_group), where servers run
        self._group_namespaces = frozenset(
            namespace_for(policy, g.name) for g in policy.all_groups
        ) - {None}
        #: servers from before the policy already announced as charged to no group
        self._told_unattributed: set[str] = set()
        #: when each server from before the policy was first charged here (pod uid ->
        #: epoch seconds): its GPU time counts from then, not from its pod's start
        self._adopted_since: dict[str, float] = {}
        self.resources = counted_resources(policy)
        self.server_pods: dict[str, ServerPod] | None = None
        #: the server-pod watch (None: fed by hand, as in tests)
        self.server_pods_watch: Reflector | None = None
        self.nodes: dict[str, Any] | None = None
        self.cluster_pods: dict[str, Any] | None = None
        #: the DRA watches (slices, classes, claims), for a policy with dra flavors
        self._dra: tuple[Reflector, ...] = ()
        self._dra_inventory: DraInventory | None = None
        self.servers: list[Server] | None = None
        self.notices: deque[Notice] = deque(maxlen=notices)
        self.over_limit: dict[str, str] = {}
        self._ledger: Ledger | None = None
        self._with_pods: Counter[tuple[str | None, str]] = Counter()
        #: (user, server name) -> {pod key: pod} of the charged pods: a server's own pod
        #: found without a pass over every pod (a server's JupyterLab asks every few s)
        self._charged: dict[tuple[str | None, str], dict[str, ServerPod]] = {}
        #: told of every notice and of every server pod that is gone (``server_events``)
        self.on_notice: Callable[[Notice], None] | None = None
        self.on_pod_gone: Callable[[ServerPod], None] | None = None
        self._allocated: dict[str, dict[str, Fraction]] | None = None
        self._capacity: dict[str, FlavorCapacity] | None = None
        self._by_user: dict[str, list[Server]] = {}
        self._pending: list[Server] = []
        #: (user, server name) -> the keys of the pods that name it and could be its pod
        #: (charged by their labels, where their group's servers run), and each such
        #: pod's entry there
        self._claims: dict[tuple[str, str], set[str]] = {}
        self._claim_of: dict[str, tuple[str, str]] = {}
        #: (user, server name) -> the hub's start of each server in its last answer
        self._hub_started: dict[tuple[str, str], datetime | None] = {}
        #: the foreign pods (``core.claims``), by key, for the admins' report
        self.foreign: dict[str, ServerPod] = {}
        #: foreign pods already told in the log (by uid and why)
        self._told_foreign: set[tuple[str | None, str]] = set()

    def watches(
        self,
        list_servers: Callable[..., Any] | None,
        core: client.CoreV1Api | None,
        watch_timeout: int = 300,
    ) -> list[Reflector]:
        """The server-pod, node and bound-pod watches, each feeding this state
        (``core`` and ``list_servers`` None: fed by hand, as in tests)."""
        servers = Reflector(
            "server pods",
            list_servers,
            transform=self.server_pod,
            on_change=lambda r: self.server_pods_listed(r.items),
            on_event=self.server_pod_event,
            watch_timeout=watch_timeout,
            # KubeSpawner's label on every server pod: the policy's, and those started
            # before it (charged by the adoption rule)
            label_selector=servers_selector(self.component),
        )
        self.server_pods_watch = servers
        nodes, bound_pods = capacity_watches(
            core,
            on_nodes=lambda r: self.nodes_changed(r.items),
            on_pods=lambda r: self.bound_pods_listed(r.items),
            on_pod_event=self.bound_pod_event,
            watch_timeout=watch_timeout,
        )
        if any(f.kind == "dra" or f.bridged for f in self.policy.flavors.values()):
            # dra (and bridged) flavors' devices are counted from the DRA objects, and
            # what a server was allocated is read from its claims
            self._dra = dra_watches(
                client.CustomObjectsApi(core.api_client) if core is not None else None,
                on_change=self._dra_changed,
                watch_timeout=watch_timeout,
            )
        return [servers, nodes, bound_pods, *self._dra]

    # ---- server pods -----------------------------------------------------------------

    @property
    def server_pods_behind_since(self) -> float | None:
        """Since when ``server_pods`` may be behind the pods (epoch seconds): its watch
        or list failed then, and no list has succeeded since, so a pod in it may be
        gone. None: it is what the API server holds, as far as anyone can know."""
        watch = self.server_pods_watch
        return watch.failing_since if watch is not None else None

    def server_pod(self, pod: Mapping[str, Any]) -> ServerPod | None:
        """``server_pod``, a server from before the policy charged by its user's groups
        (None for one outside the hub's namespace: another hub's)."""
        if of_another_hub(pod, self.hub_namespace):
            return None  # another hub's server in a namespace this service watches
        found = server_pod(pod)
        namespace = found.key.split("/", 1)[0]
        if found.before_policy is None:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            ours = self.hub_namespace is not None and labels.get(HUB_LABEL) == label_value(
                self.hub_namespace
            )
            if not self._ours(namespace) and (not ours or found.charge is None):
                # one from before hubs were labelled: this hub's where its namespaces are
                return None
            return self._where_it_can_be(found, namespace)
        if self.hub_namespace is not None and namespace != self.hub_namespace:
            return None
        return self._adopted(found)

    def _where_it_can_be(self, found: ServerPod, namespace: str) -> ServerPod:
        """``found``, or foreign where its labels cannot be true on their own: its group's
        servers run elsewhere, or its charge names another user than it says it is."""
        charge = found.charge
        if charge is None:
            return found
        why = foreign_namespace(
            self.policy, charge.group, namespace, self.hub_namespace
        ) or foreign_user(found.user, charge.user)
        return as_foreign(found, why) if why else found

    def _ours(self, namespace: str) -> bool:
        """Whether this hub's servers may run in ``namespace``: the hub's own, or one of
        the policy's group namespaces (any, where the hub's is not known)."""
        if self.hub_namespace is None or namespace == self.hub_namespace:
            return True
        return namespace in self._group_namespaces

    def _adopted(self, found: ServerPod) -> ServerPod:
        """A server from before the policy, charged and recording GPU time as the
        adoption rule says for its user's groups now."""
        assert found.before_policy is not None
        pod = found.before_policy
        groups = (self.user_groups or {}).get(found.user or "", ())
        adoption = adopt(self.policy, pod, groups, self.component)
        if adoption is None:  # finished
            return replace(found, charge=None, usage=None)
        uid = (pod.get("metadata") or {}).get("uid")
        usage = None
        if (
            adoption.group is not None
            and adoption.request.gpus
            and uid
            and found.started
            # the row, once written, keeps its group: not before the hub has said the
            # user's groups, which may charge another group than the fallback
            and self.user_groups is not None
        ):
            # its time before the policy was nobody's budget: counted from when it is
            # first charged (the row, once written, keeps that start)
            since = self._adopted_since.setdefault(uid, datetime.now(UTC).timestamp())
            started = max(found.started.timestamp(), since)
            usage = UsageRecord(
                uid=uid,
                key=adoption.key,
                user=adoption.user,
                group=adoption.group,
                profile="",
                flavor=adoption.flavor,
                gpus=float(adoption.request.gpus),
                started=started,
                last_seen=started,
            )
        elif (
            adoption.group is None
            and self.user_groups is not None  # said once the hub's groups are known
            and adoption.key not in self._told_unattributed
        ):
            self._told_unattributed.add(adoption.key)
            self.notice(
                Notice(
                    at=found.started or datetime.now(UTC),
                    text=f"{adoption.user}'s server {adoption.key}, started before the GPU "
                    f"policy, is charged to no group ({adoption.why}); its GPU time is not "
                    "recorded. Set GPUPolicy.adopted_servers_group, or ask the user to "
                    "restart it through a policy profile.",
                    user=adoption.user,
                )
            )
        return replace(found, charge=adoption.charge, usage=usage)

    def set_user_groups(self, user_groups: Mapping[str, Sequence[str]]) -> None:
        """The users' groups as the hub reports them: servers from before the policy
        are charged again where a user's groups changed."""
        groups = {user: tuple(names) for user, names in user_groups.items()}
        if groups == self.user_groups:
            return
        self.user_groups = groups
        for key, found in list((self.server_pods or {}).items()):
            if found.before_policy is None:
                continue
            adopted = self._adopted(found)
            if adopted != found:
                assert self.server_pods is not None
                self.server_pods[key] = adopted
                self.server_pod_event(key, found, adopted)

    def server_pods_listed(self, items: dict[str, ServerPod]) -> None:
        """A full list: everything derived from server pods is rebuilt.

        Called after every change; only a new list (a new dict) is rebuilt,
        events were applied one by one by ``server_pod_event``.
        """
        if items is self.server_pods and self._ledger is not None:
            return
        if self.server_pods is not None and self.on_pod_gone is not None:
            # a new list after the watch failed: the pods gone meanwhile ended unseen
            for key in self.server_pods.keys() - items.keys():
                self.on_pod_gone(self.server_pods[key])
        self.server_pods = items
        # which pod is each server's, told again from what is listed
        self._claims, self._claim_of = {}, {}
        for key, found in items.items():
            self._claim(key, as_labelled(found))
        for claim in list(self._claims):
            self._resolve(claim, apply=False)
        self.foreign = {}
        for key, found in items.items():
            if found.foreign is not None:
                self.foreign[key] = found
                self._tell_foreign(found)
        self._ledger = Ledger.from_charges(
            self.policy, [p.charge for p in items.values() if p.charge]
        )
        self._with_pods = Counter((p.user, p.servername) for p in items.values())
        self._charged = {}
        for key, found in items.items():
            if found.charge is not None:
                self._charged.setdefault((found.user, found.servername), {})[key] = found
        if self._hub_servers is not None:
            # the hub's last answer, joined to the pods as they are now listed (a
            # poll may have come before the watch's first list, as after a restart)
            self.set_servers(self._hub_servers, self.servers_complete)

    def server_pod_event(self, key: str, old: ServerPod | None, new: ServerPod | None) -> None:
        """One watch event: the difference is applied to the ledger and the index, and
        which pod is the server's is told again for the servers ``old`` and ``new`` name."""
        before = self._claim_of.get(key)
        self._unclaim(key)
        if new is not None:
            self._claim(key, as_labelled(new))
        self._apply(key, old, new)
        for claim in {before, self._claim_of.get(key)} - {None}:
            assert claim is not None
            self._resolve(claim)

    # ---- which pod is a server's (core.claims) ----------------------------------------

    def _claim(self, key: str, labelled: ServerPod) -> None:
        """Index a pod by the server it names, if it could be that server's pod."""
        if (
            labelled.foreign is None
            and labelled.charge is not None
            and labelled.before_policy is None
            and labelled.user is not None
        ):
            claim = (labelled.user, labelled.servername)
            self._claims.setdefault(claim, set()).add(key)
            self._claim_of[key] = claim

    def _unclaim(self, key: str) -> None:
        claim = self._claim_of.pop(key, None)
        if claim is not None:
            keys = self._claims.get(claim, set())
            keys.discard(key)
            if not keys:
                self._claims.pop(claim, None)

    def _resolve(self, claim: tuple[str, str], apply: bool = True) -> None:
        """Tell which of the pods naming the server ``claim`` can be its pod, against
        the hub's start of it; the others become foreign (and back, when they can be
        again). ``apply``: apply each change to the ledger and the indexes (False while
        a full list is being rebuilt from)."""
        pods = self.server_pods
        keys = self._claims.get(claim)
        if pods is None or not keys:
            return
        labelled = {k: as_labelled(pods[k]) for k in keys if k in pods}
        found = impostors(
            (
                Claim(k, p.created, parse_time(p.spawn_started), p.terminating)
                for k, p in labelled.items()
            ),
            self._hub_started.get(claim),
            server_label(*claim),
        )
        for key, pod in labelled.items():
            why = found.get(key)
            wanted = as_foreign(pod, why, impostor=True) if why else pod
            current = pods[key]
            if wanted is current or wanted == current:
                continue
            pods[key] = wanted
            if apply:
                self._apply(key, current, wanted)

    def _tell_foreign(self, pod: ServerPod) -> None:
        """Say once in the log that a pod is foreign, and why."""
        told = (pod.uid, pod.foreign or "")
        if told in self._told_foreign:
            return
        self._told_foreign.add(told)
        claimed = pod.claimed or pod
        log.warning(
            "Pod %s is not counted for %s (as %s's server %s): %s. It is charged to no "
            "group and no rule acts on a server because of it; see the GPU dashboard's "
            "foreign pods. Delete it if nobody knows it.",
            pod.key,
            claimed.charge.group if claimed.charge else "any group",
            claimed.user,
            claimed.servername or "(default)",
            pod.foreign,
        )

    def _apply(self, key: str, old: ServerPod | None, new: ServerPod | None) -> None:
        """A pod's change applied to the ledger and the indexes."""
        if old is not None and old.foreign is not None:
            self.foreign.pop(key, None)
        if new is not None and new.foreign is not None:
            self.foreign[key] = new
            self._tell_foreign(new)
        if self._ledger is not None:
            if old is not None and old.charge is not None:
                self._ledger.release(self.policy, key)
            if new is not None and new.charge is not None:
                self._ledger.record(self.policy, new.charge)
        if old is not None:
            self._with_pods[(old.user, old.servername)] -= 1
            if self._with_pods[(old.user, old.servername)] <= 0:
                del self._with_pods[(old.user, old.servername)]
        if new is not None:
            self._with_pods[(new.user, new.servername)] += 1
        if old is not None and old.charge is not None:
            pods = self._charged.get((old.user, old.servername), {})
            pods.pop(key, None)
            if not pods:
                self._charged.pop((old.user, old.servername), None)
        if new is not None and new.charge is not None:
            self._charged.setdefault((new.user, new.servername), {})[key] = new
        if old is not None and new is None and self.on_pod_gone is not None:
            self.on_pod_gone(old)

    def pod_of(self, user: str, name: str) -> ServerPod | None:
        """The charged pod of server ``user/name`` (one that is not being deleted, the
        newest, where a new pod of the server came before the old one was gone)."""
        pods = self._charged.get((user, name))
        if not pods:
            return None
        return min(
            pods.values(),
            key=lambda p: (p.terminating, -(p.created.timestamp() if p.created else 0.0)),
        )

    # ---- nodes and bound pods (capacity) ---------------------------------------------

    def nodes_changed(self, items: dict[str, Any]) -> None:
        self.nodes = items
        self._capacity = None

    def _dra_changed(self, _reflector: Reflector) -> None:
        self._capacity = None
        self._dra_inventory = None

    @property
    def dra(self) -> DraInventory | None:
        """The DRA objects as last listed (None: the policy has no DRA flavor)."""
        if not self._dra:
            return None
        if self._dra_inventory is None:
            self._dra_inventory = dra_inventory(*self._dra)
        return self._dra_inventory

    def bound_pods_listed(self, items: dict[str, Any]) -> None:
        if items is self.cluster_pods:
            return  # the same list, changed by events already applied
        self.cluster_pods = items
        self._allocated = {}
        for pod in items.values():
            self._add_requests(pod, 1)
        self._capacity = None

    def bound_pod_event(self, key: str, old: Any, new: Any) -> None:
        if self._allocated is not None:
            self._add_requests(old, -1)
            self._add_requests(new, 1)
        self._capacity = None

    def _add_requests(self, pod: Any, sign: int) -> None:
        held = _node_requests(pod, self.resources)
        if held is None or self._allocated is None:
            return
        node, requests = held
        usage = self._allocated.setdefault(node, {})
        for resource, amount in requests.items():
            usage[resource] = usage.get(resource, Fraction(0)) + sign * amount

    # ---- the hub's servers -----------------------------------------------------------

    def set_servers(self, servers: list[Server], complete: bool = True) -> None:
        """The hub's servers, each charged to the group its pod is labelled with.

        The pod's group label is the authority: every rule that acts on a server
        (max_runtime, idle) acts only on one whose pod says its group. The profile
        in ``user_options`` names a group only for a spawn that has no pod yet
        (its place in its group's waiting line); a running server without a
        labelled pod (one started before the policy, whose slug such as
        ``lab--big`` may look like one of ours) belongs to no group here.
        """
        self._hub_servers = servers
        started = {(s.user, s.name): s.started for s in servers}
        if started != self._hub_started:
            changed = [c for c in self._claims if started.get(c) != self._hub_started.get(c)]
            self._hub_started = started
            for claim in changed:
                self._resolve(claim)
        # each server's own pod (of several: one not being deleted, the newest), never a
        # foreign one (charged to nobody)
        pods: dict[tuple[str | None, str], ServerPod] = {}
        for p in (self.server_pods or {}).values():
            if p.charge is not None:
                known = pods.get((p.user, p.servername))
                if known is None or newer(p, known):
                    pods[(p.user, p.servername)] = p
        servers = [
            # a server's runtime counts from its pod's start, not from the spawn: time
            # waiting in a scheduler's queue is not runtime
            replace(
                s,
                group=pod.charge.group,
                profile=pod.profile or s.profile,
                started=pod.started or s.started,
                before_policy=pod.before_policy is not None,
                pod_uid=pod.uid,
            )
            if (pod := pods.get((s.user, s.name))) and pod.charge
            else s
            if s.pending == "spawn"
            else replace(s, group=None)
            for s in servers
        ]
        self.servers = servers
        self.servers_complete = complete
        by_user: dict[str, list[Server]] = {}
        for server in servers:
            by_user.setdefault(server.user, []).append(server)
        self._by_user = by_user
        self._pending = [s for s in servers if s.pending == "spawn" and s.group]

    # ---- derived ---------------------------------------------------------------------

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self.server_pods_listed(self.server_pods or {})
        assert self._ledger is not None
        return self._ledger

    @property
    def capacity(self) -> dict[str, FlavorCapacity] | None:
        if self.nodes is None or self.cluster_pods is None:
            return None
        if self._capacity is None:
            self._capacity = flavor_capacity(
                self.policy,
                self.nodes.values(),
                allocated=self._allocated or {},
                dra=self.dra,
            )
        return self._capacity

    def waiting(self) -> dict[str, list[Server]]:
        """Per group, spawns the hub reports pending that have no pod yet, oldest first."""
        return waiting_lines(
            replace(s, has_pod=(s.user, s.name) in self._with_pods) for s in self._pending
        )

    def set_over_limit(self, over_limit: dict[str, str]) -> None:
        if over_limit != self.over_limit:
            self.over_limit = over_limit

    def notice(self, notice: Notice) -> None:
        self.notices.append(notice)
        if self.on_notice is not None:
            self.on_notice(notice)
        log.warning("%s", notice.text)

    def snapshot(self, tasks: Sequence[Mapping[str, Any]]) -> Snapshot:
        return Snapshot(
            foreign_pods=[p.foreign_json() for _, p in sorted(self.foreign.items())],
            ledger=self.ledger,
            servers=self.servers or [],
            capacity=self.capacity,
            notices=list(self.notices),
            tasks=tasks,
            over_limit=self.over_limit,
            waiting=self.waiting(),
            by_user=self._by_user,
            dra=self.dra,
        )
