"""Kubernetes objects the policy implies, rendered as plain manifests.

Pure: ``desired_objects`` is what the service's reconciler keeps in step with the
policy, and ``jupyterhub-gpu manifests`` prints it together with ``rbac_objects``
(the cluster-wide RBAC an admin installs once; z2jh's chart does not grant it).

What is rendered, per group (``everyone`` included when it offers a profile):

- with ``namespace_per_group``: the group's Namespace, a ResourceQuota, a
  LimitRange, a NetworkPolicy and a RoleBinding letting the hub run servers there.
  The ResourceQuota holds the group's *limit* (its burst ceiling), the hard stop
  for anything created in the namespace, even outside the hub: ``requests.cpu``,
  ``requests.memory``, ``pods`` (servers), and ``requests.<resource>`` for every
  device resource a flavor of the policy uses, the GPU-equivalent limit turned
  into whole units of that resource (0 for resources the group's profiles never
  use, so an unlisted resource is not unlimited). An unlimited group gets no caps.
- without ``namespace_per_group`` every server runs in the hub's namespace, and a
  ResourceQuota is per namespace: it cannot tell one group from another. No
  ResourceQuota, LimitRange or NetworkPolicy is rendered then; the hub's
  admission (atomic, ledger rebuilt from pod labels) and the scheduler queues
  below are what hold each group to its quota.
- PriorityClasses for in-quota and over-quota servers (KAI brings its own).
- scheduler ``kai``: a ``scheduling.run.ai/v2`` Queue per group under one root
  queue ``jupyterhub-gpu`` (KAI schedules only queues that have a parent);
  ``volcano``: a ``scheduling.volcano.sh/v1beta1`` Queue per group; ``kueue``:
  one ResourceFlavor, a ClusterQueue per group (a Cohort per parent group) and a
  LocalQueue in the namespace its servers run in (``kueue.x-k8s.io/v1beta2``,
  the storage version of the pinned Kueue; see ``KUEUE_API``).
- a DRA ResourceClaimTemplate (``resource.k8s.io/v1``) per dra flavor and device
  count a profile offers, in every namespace servers run in, named
  ``Flavor.claim_template_name(count)`` as the spawner's pods reference them.

Every object carries ``OWNER_LABEL: OWNER`` and ``HUB_LABEL: <hub namespace>``:
the reconciler prunes only objects carrying both, so two hubs never prune each
other's objects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from .model import Amounts, Flavor, Group, Policy
from .quantities import format_bytes, format_cpu
from .shaping import GROUP_LABEL, dns_label, label_value, namespace_for

OWNER_LABEL = "app.kubernetes.io/managed-by"
OWNER = "jupyterhub-gpu"
HUB_LABEL = "gpu.jupyterhub.org/hub-namespace"
#: in-quota servers are never preempted by bursting ones; over-quota servers yield
IN_QUOTA_PRIORITY = 1000
OVER_QUOTA_PRIORITY = 100
#: the KAI queue every group queue hangs under (KAI v0.12 schedules only queues with a parent)
KAI_ROOT_QUEUE = "jupyterhub-gpu"
#: Kueue's storage version in the pinned release (v0.19): v1beta1 is served too, but
#: a cluster with Kueue's CRDs and no Kueue running has no conversion webhook, and
#: v1beta1's fields renamed in v1beta2 (a ClusterQueue's ``cohort``) would be lost
KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_FLAVOR = "jupyterhub-gpu"
#: Kueue has no "unlimited" nominal quota; an uncapped resource gets this many units
KUEUE_UNBOUNDED = 1_000_000
#: nor has Volcano an "unlimited" deserved share: an uncapped CPU or memory gets this
VOLCANO_UNBOUNDED = {"cpu": str(KUEUE_UNBOUNDED), "memory": f"{KUEUE_UNBOUNDED}Gi"}
#: the ClusterRole bound in each group namespace so the hub can run servers there
SPAWNER_ROLE = "jupyterhub-gpu-spawner"
RECONCILER_ROLE = "jupyterhub-gpu"
#: default requests for containers created without any (so the quota can count them)
DEFAULT_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 128 * 2**20


def _metadata(
    name: str, hub_namespace: str, namespace: str | None = None, **labels: str
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {OWNER_LABEL: OWNER, HUB_LABEL: hub_namespace, **labels}
    return meta


def all_groups(policy: Policy) -> list[Group]:
    """Every group servers can be charged to: the configured groups, and ``everyone``
    when it offers a profile (a group of the policy gets its objects even without
    profiles: it may be a parent, and its namespace and queue show where it stands)."""
    everyone = [policy.everyone] if policy.everyone.profiles else []
    return [*policy.groups.values(), *everyone]


def server_namespaces(policy: Policy, hub_namespace: str) -> list[str]:
    if not policy.namespace_per_group:
        return [hub_namespace]
    return [namespace_for(policy, g.name) or hub_namespace for g in all_groups(policy)]


def _reachable(policy: Policy, group: Group) -> dict[str, set[int]]:
    """Flavor name -> the device counts the group's profiles can ask for."""
    reach: dict[str, set[int]] = {}
    for name in group.profiles:
        profile = policy.profiles[name]
        if profile.gpu is None:
            continue
        flavors = {profile.gpu.flavor}
        counts = {profile.gpu.count}
        if "flavor" in profile.options:
            flavors |= {v for _, v in profile.options["flavor"].choices}
        if "gpus" in profile.options:
            counts |= {v for _, v in profile.options["gpus"].choices}
        for flavor in flavors:
            reach.setdefault(flavor, set()).update(counts)
    return reach


def _units(flavor: Flavor, amounts: Amounts) -> int | None:
    """Whole units of the flavor's resource that ``amounts`` allows; None: uncapped."""
    caps = []
    if amounts.gpus is not None:
        caps.append(math.floor(Fraction(amounts.gpus) / flavor.unit_equivalents))
    if flavor.name in amounts.flavors:
        caps.append(amounts.flavors[flavor.name])
    return min(caps) if caps else None


def device_caps(policy: Policy, group: Group, amounts: Amounts) -> dict[str, int | None]:
    """Resource name -> whole units ``amounts`` allows the group (None: uncapped).

    Every device resource of the policy is listed: one the group's profiles never
    reach gets 0. Where several flavors share a resource the loosest cap counts
    (this is a backstop; the hub's admission charges each flavor exactly).
    """
    reach = _reachable(policy, group)
    caps: dict[str, int | None] = {}
    for flavor in policy.flavors.values():
        resource = _device_resource(flavor)
        if resource is None:
            continue
        units = _units(flavor, amounts) if flavor.name in reach else 0
        if resource not in caps:
            caps[resource] = units
        elif caps[resource] is not None:
            caps[resource] = None if units is None else max(caps[resource] or 0, units)
    return caps


def _device_resource(flavor: Flavor) -> str | None:
    """The quota resource a unit of this flavor is counted in, or None (KAI fractions)."""
    if flavor.kind == "fraction":
        return None
    if flavor.kind == "dra":
        return f"{flavor.device_class}.deviceclass.resource.k8s.io/devices"
    return flavor.resource


# ---- namespaces and what lives in them ------------------------------------------


def namespace_objects(
    policy: Policy, hub_namespace: str, service_account: str = "hub"
) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    if not policy.namespace_per_group:
        return objects
    for group in all_groups(policy):
        ns = namespace_for(policy, group.name)
        assert ns is not None
        group_label = {GROUP_LABEL: label_value(group.name)}  # as on its servers' pods
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": _metadata(ns, hub_namespace, **group_label),
            }
        )
        if not group.unlimited:
            objects.append(resource_quota(policy, group, ns, hub_namespace))
        objects.append(limit_range(policy, group, ns, hub_namespace))
        objects.append(network_policy(ns, hub_namespace))
        objects.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": _metadata(SPAWNER_ROLE, hub_namespace, ns),
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": SPAWNER_ROLE,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": service_account, "namespace": hub_namespace}
                ],
            }
        )
    return objects


def resource_quota(policy: Policy, group: Group, namespace: str, hub: str) -> dict[str, Any]:
    limit = group.limit
    hard: dict[str, str] = {}
    if limit.cpu is not None:
        hard["requests.cpu"] = format_cpu(limit.cpu)
    if limit.memory is not None:
        hard["requests.memory"] = format_bytes(limit.memory)
    if limit.servers is not None:
        hard["pods"] = str(limit.servers)
    for resource, units in sorted(device_caps(policy, group, limit).items()):
        if units is None:
            continue
        key = resource if resource.endswith("resource.k8s.io/devices") else f"requests.{resource}"
        hard[key] = str(units)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _metadata("jupyterhub-gpu", hub, namespace),
        "spec": {"hard": hard},
    }


def limit_range(policy: Policy, group: Group, namespace: str, hub: str) -> dict[str, Any]:
    """Default requests for containers without any: the group's smallest profile.

    Only ``defaultRequest``: a default *limit* would be forced onto the servers
    the hub creates without one and could fall below their requests.
    """
    profiles = [policy.profiles[p] for p in group.profiles]
    cpu = min((p.cpu for p in profiles), default=DEFAULT_CPU_REQUEST)
    memory = min((p.memory for p in profiles), default=DEFAULT_MEMORY_REQUEST)
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _metadata("jupyterhub-gpu", hub, namespace),
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "defaultRequest": {"cpu": format_cpu(cpu), "memory": format_bytes(memory)},
                }
            ]
        },
    }


def network_policy(namespace: str, hub: str) -> dict[str, Any]:
    """Ingress only from the same namespace and the hub's (hub and proxy reach servers)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata("jupyterhub-gpu-isolate-groups", hub, namespace),
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {}},
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": hub}
                            }
                        },
                    ]
                }
            ],
        },
    }


def priority_classes(policy: Policy, hub: str = "") -> list[dict[str, Any]]:
    """Our PriorityClasses; with KAI its own (build, build-preemptible) are used instead."""
    if policy.scheduler.name == "kai":
        return []
    values = {
        policy.scheduler.in_quota_priority_class: (
            IN_QUOTA_PRIORITY,
            "Notebook servers within their group's guaranteed quota.",
        ),
        policy.scheduler.over_quota_priority_class: (
            OVER_QUOTA_PRIORITY,
            "Notebook servers bursting above their group's quota; preempted first.",
        ),
    }
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": _metadata(name, hub),
            "value": value,
            "globalDefault": False,
            "description": description,
        }
        for name, (value, description) in values.items()
    ]


# ---- scheduler queues -------------------------------------------------------------


def queue_name(group: Group) -> str:
    """The queue object a group's pods are labelled with (see shaping.shape)."""
    return dns_label(group.queue)


def _number(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)


def _kai_resource(quota: int | Fraction | None, limit: int | Fraction | None, scale=1):
    def amount(v):
        return -1 if v is None else _number(Fraction(v) / scale)

    return {"quota": amount(quota), "limit": amount(limit), "overQuotaWeight": 1}


def kai_queues(policy: Policy, hub: str) -> list[dict[str, Any]]:
    """KAI Queues: GPUs in GPU-equivalents, CPU in millicores, memory in MB; -1 unlimited."""
    objects = [
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": _metadata(KAI_ROOT_QUEUE, hub),
            "spec": {
                "displayName": "JupyterHub GPU",
                "resources": {
                    k: {"quota": -1, "limit": -1, "overQuotaWeight": 1}
                    for k in ("cpu", "gpu", "memory")
                },
            },
        }
    ]
    for group in all_groups(policy):
        parent = policy.groups[group.parent] if group.parent else None
        q, lim = group.quota, group.limit
        if group.unlimited:
            resources = {
                k: {"quota": -1, "limit": -1, "overQuotaWeight": 1}
                for k in ("cpu", "gpu", "memory")
            }
        else:
            resources = {
                "gpu": _kai_resource(q.gpus if q.gpus is not None else 0, lim.gpus),
                "cpu": _kai_resource(q.cpu if q.cpu is not None else 0, lim.cpu),
                "memory": _kai_resource(
                    q.memory if q.memory is not None else 0, lim.memory, scale=10**6
                ),
            }
        objects.append(
            {
                "apiVersion": "scheduling.run.ai/v2",
                "kind": "Queue",
                "metadata": _metadata(queue_name(group), hub),
                "spec": {
                    "displayName": group.display_name,
                    "parentQueue": queue_name(parent) if parent else KAI_ROOT_QUEUE,
                    "resources": resources,
                },
            }
        )
    return _unique(objects)


def _resource_list(policy: Policy, group: Group, amounts: Amounts) -> dict[str, str]:
    resources: dict[str, str] = {}
    if amounts.cpu is not None:
        resources["cpu"] = format_cpu(amounts.cpu)
    if amounts.memory is not None:
        resources["memory"] = format_bytes(amounts.memory)
    for resource, units in sorted(device_caps(policy, group, amounts).items()):
        if units is not None and not resource.endswith("resource.k8s.io/devices"):
            resources[resource] = str(units)
    return resources


def volcano_queues(policy: Policy, hub: str) -> list[dict[str, Any]]:
    """Volcano Queues: ``deserved`` the quota, ``capability`` the limit, ``parent`` the tree."""
    objects = []
    for group in all_groups(policy):
        spec: dict[str, Any] = {"weight": 1, "reclaimable": True}
        if group.parent:
            spec["parent"] = queue_name(policy.groups[group.parent])
        if not group.unlimited:
            if capability := _resource_list(policy, group, group.limit):
                spec["capability"] = capability
            if deserved := _resource_list(policy, group, group.quota):
                # Volcano reads a resource missing from ``deserved`` as none deserved,
                # and a queue whose servers would exceed its deserved share in any
                # resource never reclaims: what the quota leaves uncapped is unbounded
                for resource, unbounded in VOLCANO_UNBOUNDED.items():
                    deserved.setdefault(resource, unbounded)
                spec["deserved"] = deserved
        objects.append(
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "Queue",
                "metadata": _metadata(queue_name(group), hub),
                "spec": spec,
            }
        )
    return _unique(objects)


def kueue_objects(policy: Policy, hub: str) -> list[dict[str, Any]]:
    """One ResourceFlavor, a ClusterQueue (+ Cohort per parent) and LocalQueue per group.

    Kueue assigns one flavor per resource group to a whole pod, while the spawner
    already pins each server to its nodes; so the single ResourceFlavor carries no
    node labels and quotas are per device resource. ``nominalQuota`` is the quota,
    ``borrowingLimit`` the room up to the limit; a parent group's own ClusterQueue
    holds what its quota leaves beyond its children's, so the cohort adds up to it.
    """
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": KUEUE_API,
            "kind": "ResourceFlavor",
            "metadata": _metadata(KUEUE_FLAVOR, hub),
            "spec": {},
        }
    ]
    children: dict[str, list[Group]] = {}
    for group in policy.groups.values():
        if group.parent:
            children.setdefault(group.parent, []).append(group)
    for parent_name in children:
        parent = policy.groups[parent_name]
        spec: dict[str, Any] = {}
        if parent.parent:
            spec["parentName"] = queue_name(policy.groups[parent.parent])
        objects.append(
            {
                "apiVersion": KUEUE_API,
                "kind": "Cohort",
                "metadata": _metadata(queue_name(parent), hub),
                "spec": spec,
            }
        )
    # DRA devices are counted by ResourceQuota, not by Kueue's resource groups
    device_resources = sorted(
        {r for f in policy.flavors.values() if (r := _device_resource(f)) and f.kind != "dra"}
    )
    covered = ["cpu", "memory", "pods", *device_resources]
    for group in all_groups(policy):
        quota = _kueue_amounts(policy, group, group.quota, covered)
        limit = _kueue_amounts(policy, group, group.limit, covered)
        if group.name in children:  # the cohort adds up to the parent's own quota
            for child in children[group.name]:
                for r, v in _kueue_amounts(policy, child, child.quota, covered).items():
                    if quota[r] is not None and v is not None:
                        quota[r] = max(0, quota[r] - v)
        cohort = group.name if group.name in children else group.parent
        resources = []
        for r in covered:
            # outside a cohort there is nothing to borrow: the limit is all it may use
            nominal = quota[r] if cohort else limit[r]
            entry: dict[str, Any] = {
                "name": r,
                "nominalQuota": _kueue_quantity(
                    r, nominal if nominal is not None else KUEUE_UNBOUNDED
                ),
            }
            # Kueue allows a borrowing limit only inside a cohort
            if cohort and quota[r] is not None and limit[r] is not None:
                entry["borrowingLimit"] = _kueue_quantity(r, max(0, limit[r] - quota[r]))
            resources.append(entry)
        cq_spec: dict[str, Any] = {
            "namespaceSelector": {
                "matchLabels": {
                    "kubernetes.io/metadata.name": namespace_for(policy, group.name) or hub
                }
            },
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": covered,
                    "flavors": [{"name": KUEUE_FLAVOR, "resources": resources}],
                }
            ],
            "preemption": {
                "reclaimWithinCohort": "Any",
                "withinClusterQueue": "LowerPriority",
            },
        }
        if cohort:
            cq_spec["cohortName"] = queue_name(policy.groups[cohort])
        objects.append(
            {
                "apiVersion": KUEUE_API,
                "kind": "ClusterQueue",
                "metadata": _metadata(queue_name(group), hub),
                "spec": cq_spec,
            }
        )
        objects.append(
            {
                "apiVersion": KUEUE_API,
                "kind": "LocalQueue",
                "metadata": _metadata(
                    queue_name(group), hub, namespace_for(policy, group.name) or hub
                ),
                "spec": {"clusterQueue": queue_name(group)},
            }
        )
    return _unique(objects)


def _kueue_amounts(
    policy: Policy, group: Group, amounts: Amounts, covered: list[str]
) -> dict[str, int | None]:
    """Resource -> amount in base units (millicores, bytes, pods, devices); None: uncapped."""
    if group.unlimited:
        return dict.fromkeys(covered)
    devices = device_caps(policy, group, amounts)
    values: dict[str, int | None] = {}
    for r in covered:
        if r == "cpu":
            values[r] = amounts.cpu
        elif r == "memory":
            values[r] = amounts.memory
        elif r == "pods":
            values[r] = amounts.servers
        else:
            values[r] = devices.get(r)
    return values


def _kueue_quantity(resource: str, value: int) -> str:
    if resource == "cpu":
        return format_cpu(value * 1000 if value == KUEUE_UNBOUNDED else value)
    if resource == "memory":
        return format_bytes(value * 2**30 if value == KUEUE_UNBOUNDED else value)
    return str(value)


def scheduler_objects(policy: Policy, hub: str) -> list[dict[str, Any]]:
    return {
        "kai": kai_queues,
        "volcano": volcano_queues,
        "kueue": kueue_objects,
    }.get(policy.scheduler.name, lambda p, h: [])(policy, hub)


# ---- DRA --------------------------------------------------------------------------


def claim_templates(policy: Policy, hub: str) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per dra flavor and count offered, where servers run."""
    objects = []
    for group in all_groups(policy):
        namespace = namespace_for(policy, group.name) or hub
        for flavor_name, counts in sorted(_reachable(policy, group).items()):
            flavor = policy.flavors[flavor_name]
            if flavor.kind != "dra":
                continue
            for count in sorted(counts):
                objects.append(claim_template(flavor, count, namespace, hub))
    return _unique(objects)


def claim_template(flavor: Flavor, count: int, namespace: str, hub: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": flavor.device_class,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if flavor.selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in flavor.selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if flavor.sharing:
        devices["config"] = [
            {
                "requests": ["gpu"],
                "opaque": {
                    "driver": "gpu.nvidia.com",
                    "parameters": {
                        "apiVersion": "resource.nvidia.com/v1beta1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": flavor.sharing},
                    },
                },
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _metadata(flavor.claim_template_name(count), hub, namespace),
        "spec": {"spec": {"devices": devices}},
    }


# ---- all together -------------------------------------------------------------------


def _unique(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first object of each identity (groups sharing a queue share its object)."""
    seen: set[tuple[str, str, str | None, str]] = set()
    result = []
    for obj in objects:
        key = identity(obj)
        if key not in seen:
            seen.add(key)
            result.append(obj)
    return result


def identity(obj: Mapping[str, Any]) -> tuple[str, str, str | None, str]:
    """(apiVersion, kind, namespace, name): what tells two objects apart."""
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


def desired_objects(
    policy: Policy, hub_namespace: str, service_account: str = "hub"
) -> list[dict[str, Any]]:
    """Every object the reconciler keeps, in the order to create them.

    ``service_account`` is the hub's (z2jh: ``hub``), bound in each group namespace.
    """
    return _unique(
        [
            *namespace_objects(policy, hub_namespace, service_account),
            *priority_classes(policy, hub_namespace),
            *scheduler_objects(policy, hub_namespace),
            *claim_templates(policy, hub_namespace),
        ]
    )


# ---- RBAC the chart does not grant --------------------------------------------------

_SCHEDULER_RULES = [
    {"apiGroups": ["scheduling.run.ai"], "resources": ["queues"]},
    {"apiGroups": ["scheduling.volcano.sh"], "resources": ["queues"]},
    {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["resourceflavors", "clusterqueues", "localqueues", "cohorts"],
    },
]
_WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs}


def rbac_objects(hub_namespace: str, service_account: str = "hub") -> list[dict[str, Any]]:
    """ClusterRoles and a binding for the hub's service account (hub and service share it).

    ``jupyterhub-gpu``: what the reconciler, the capacity views and the spawn
    page's place in a Kueue queue (Kueue's Workloads) need, cluster wide.
    ``jupyterhub-gpu-spawner``: what KubeSpawner needs in a group namespace; the
    reconciler binds it there (hence ``bind`` on it) as it creates the namespace.
    """
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": hub_namespace}
    reconciler_rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": _WRITE},
        {"apiGroups": [""], "resources": ["resourcequotas", "limitranges"], "verbs": _WRITE},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _WRITE},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": _WRITE},
        _rule("resource.k8s.io", ["resourceclaimtemplates"], _WRITE),
        _rule("rbac.authorization.k8s.io", ["rolebindings"], _WRITE),
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": [SPAWNER_ROLE],
            "verbs": ["bind"],
        },
        *({**rule, "verbs": _WRITE} for rule in _SCHEDULER_RULES),
        # the spawn page says where a server waits in its Kueue or Volcano queue, from
        # Kueue's Workloads or Volcano's PodGroups
        _rule("kueue.x-k8s.io", ["workloads"], ["get", "list", "watch"]),
        _rule("scheduling.volcano.sh", ["podgroups"], ["get", "list", "watch"]),
    ]
    spawner_rules = [
        {
            "apiGroups": [""],
            "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    labels = {OWNER_LABEL: OWNER}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": RECONCILER_ROLE, "labels": labels},
            "rules": reconciler_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{RECONCILER_ROLE}-{hub_namespace}", "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": RECONCILER_ROLE,
            },
            "subjects": [subject],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": SPAWNER_ROLE, "labels": labels},
            "rules": spawner_rules,
        },
    ]
