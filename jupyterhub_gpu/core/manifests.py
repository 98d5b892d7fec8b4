"""Kubernetes objects the policy implies, rendered as plain manifests.

Pure: ``desired_objects`` is what the service's reconciler keeps in step with the
policy, and ``jupyterhub-gpu manifests`` prints it together with ``rbac_objects``
(``rbac``: the RBAC an admin applies for the policy; z2jh's chart does not grant it).

What is rendered, per group (``everyone`` included when it offers a profile):

- with ``namespace_per_group``: the group's Namespace, a ResourceQuota, a
  LimitRange and a NetworkPolicy (the RoleBindings letting the hub and the service
  work there are ``rbac_objects``', applied by the admin: the hub never writes RBAC).
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
- the scheduler's own objects, each scheduler's module rendering them
  (``schedulers``): scheduler ``kai``: a ``scheduling.run.ai/v2`` Queue per group under one root
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

from typing import Any

from .model import Flavor, Group, Policy
from .objects import HUB_LABEL as HUB_LABEL
from .objects import IN_QUOTA_PRIORITY as IN_QUOTA_PRIORITY
from .objects import (
    NO_PREEMPTION_SUFFIX,
    all_groups,
    device_caps,
    metadata,
    priority_values,
    reachable,
    unique,
)
from .objects import OVER_QUOTA_PRIORITY as OVER_QUOTA_PRIORITY
from .objects import OWNER as OWNER
from .objects import OWNER_LABEL as OWNER_LABEL
from .objects import identity as identity
from .quantities import format_bytes, format_cpu
from .schedulers import scheduler_for
from .schedulers.kai import KAI_ROOT_QUEUE as KAI_ROOT_QUEUE
from .schedulers.kueue import KUEUE_API as KUEUE_API
from .shaping import GROUP_LABEL, label_value, namespace_for

#: default requests for containers created without any (so the quota can count them)
DEFAULT_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 128 * 2**20


def server_namespaces(policy: Policy, hub_namespace: str) -> list[str]:
    if not policy.namespace_per_group:
        return [hub_namespace]
    return [namespace_for(policy, g.name) or hub_namespace for g in all_groups(policy)]


# ---- namespaces and what lives in them ------------------------------------------


def namespace_objects(policy: Policy, hub_namespace: str) -> list[dict[str, Any]]:
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
                "metadata": metadata(ns, hub_namespace, **group_label),
            }
        )
        if not group.unlimited:
            objects.append(resource_quota(policy, group, ns, hub_namespace))
        objects.append(limit_range(policy, group, ns, hub_namespace))
        objects.append(network_policy(ns, hub_namespace))
        if policy.egress is not None:
            objects.append(egress_policy(policy, group, ns, hub_namespace))
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
        "metadata": metadata("jupyterhub-gpu", hub, namespace),
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
        "metadata": metadata("jupyterhub-gpu", hub, namespace),
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
        "metadata": metadata("jupyterhub-gpu-isolate-groups", hub, namespace),
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


#: the cluster's DNS (CoreDNS and kube-dns pods both carry this label), and the
#: address NodeLocal DNSCache answers on in every node where it runs
CLUSTER_DNS = {"k8s-app": "kube-dns"}
NODE_LOCAL_DNS = "169.254.20.10/32"
#: z2jh's hub and proxy pods, by the label the chart gives them
HUB_AND_PROXY = {"key": "component", "operator": "In", "values": ["hub", "proxy"]}


def egress_policy(policy: Policy, group: Group, namespace: str, hub: str) -> dict[str, Any]:
    """What the servers in a group namespace may connect to (``GPUPolicy.egress``).

    Always: pods of the same namespace (as ingress allows), DNS on port 53, and the
    hub and proxy pods in the hub's namespace. Then the open networks minus the denied
    ones (by default: every address but the private ranges), and ``allow_cidrs`` and
    the group's NFS dataset servers even inside a denied range. NetworkPolicy rules only
    allow, so an address is reachable when any rule allows it."""
    egress = policy.egress
    assert egress is not None
    denied = egress.denied_networks
    open_blocks = []
    for network in egress.open_networks:
        block: dict[str, Any] = {"cidr": network}
        if network in ("0.0.0.0/0", "::/0"):
            # ipBlock's except must lie inside its cidr: the same address family
            same_family = [d for d in denied if (":" in d) == (":" in network)]
            if same_family:
                block["except"] = same_family
        open_blocks.append({"ipBlock": block})
    allowed = egress.allowed_networks(policy.datasets_of(group.name))
    rules: list[dict[str, Any]] = [
        {"to": [{"podSelector": {}}]},
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                    },
                    "podSelector": {"matchLabels": CLUSTER_DNS},
                },
                {"ipBlock": {"cidr": NODE_LOCAL_DNS}},
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": hub}},
                    "podSelector": {"matchExpressions": [HUB_AND_PROXY]},
                }
            ]
        },
    ]
    peers = [*open_blocks, *({"ipBlock": {"cidr": network}} for network in allowed)]
    if peers:
        rules.append({"to": peers})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata("jupyterhub-gpu-egress", hub, namespace),
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": rules},
    }


def priority_classes(policy: Policy, hub: str = "") -> list[dict[str, Any]]:
    """Our PriorityClasses, each with its twin that never preempts (see
    ``shaping.without_preemption``); a scheduler that brings its own (KAI: build,
    build-preemptible) gets none."""
    if scheduler_for(policy).own_priority_classes:
        return []
    descriptions = {
        policy.scheduler.in_quota_priority_class: (
            "Notebook servers within their group's guaranteed quota."
        ),
        policy.scheduler.over_quota_priority_class: (
            "Notebook servers bursting above their group's quota; preempted first."
        ),
    }
    over = policy.scheduler.over_quota_priority_class
    descriptions[f"{over}-fair"] = (
        "Notebook servers bursting above their group's quota, of users near their fair "
        "share; preempted after those of users above it."
    )
    descriptions[f"{over}-light"] = (
        "Notebook servers bursting above their group's quota, of users under half their "
        "fair share; the last bursting servers preempted."
    )
    objects = []
    for name, value in priority_values(policy).items():
        twin_of = name.removesuffix(NO_PREEMPTION_SUFFIX)
        body: dict[str, Any] = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": metadata(name, hub),
            "value": value,
            "globalDefault": False,
        }
        if twin_of != name:
            body["preemptionPolicy"] = "Never"
            body["description"] = (
                f"{descriptions[twin_of]} Never preempts: used while servers started "
                "before the GPU policy run."
            )
        else:
            body["description"] = descriptions[name]
        objects.append(body)
    return objects


# ---- scheduler queues -------------------------------------------------------------


def scheduler_objects(policy: Policy, hub: str) -> list[dict[str, Any]]:
    """The objects of the policy's scheduler (its queues; see ``schedulers``)."""
    return scheduler_for(policy).objects(hub)


# ---- DRA --------------------------------------------------------------------------


def claim_templates(policy: Policy, hub: str) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per dra flavor and count offered, where servers run."""
    objects = []
    for group in all_groups(policy):
        namespace = namespace_for(policy, group.name) or hub
        for flavor_name, counts in sorted(reachable(policy, group).items()):
            flavor = policy.flavors[flavor_name]
            if flavor.kind != "dra":
                continue
            for count in sorted(counts):
                objects.append(claim_template(flavor, count, namespace, hub))
    return unique(objects)


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
        "metadata": metadata(flavor.claim_template_name(count), hub, namespace),
        "spec": {"spec": {"devices": devices}},
    }


# ---- all together -------------------------------------------------------------------


def desired_objects(policy: Policy, hub_namespace: str) -> list[dict[str, Any]]:
    """Every object the reconciler keeps, in the order to create them.

    The RBAC that lets the hub and the service work with them is not among them: the
    hub never writes RBAC (``rbac_objects``, applied by the admin).
    """
    return unique(
        [
            *namespace_objects(policy, hub_namespace),
            *priority_classes(policy, hub_namespace),
            *scheduler_objects(policy, hub_namespace),
            *claim_templates(policy, hub_namespace),
        ]
    )


# ---- RBAC the chart does not grant: rendered per policy, applied by the admin --------

from .rbac import SPAWNER_ROLE as SPAWNER_ROLE  # noqa: E402
from .rbac import rbac_objects as rbac_objects  # noqa: E402
