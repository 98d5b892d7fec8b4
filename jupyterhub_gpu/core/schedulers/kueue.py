"""Kueue: a ClusterQueue per group (a Cohort per parent group) and a LocalQueue where
its servers run.

A server's pod names its group's LocalQueue (label ``kueue.x-k8s.io/queue-name``);
Kueue's pod integration gates it (``kueue.x-k8s.io/admission``) until its Workload
is admitted, then kube-scheduler places it. Meanwhile the spawn page shows the
server's place among the LocalQueue's pending Workloads and Kueue's reason. The
objects are ``kueue.x-k8s.io/v1beta2``, the storage version of the pinned Kueue
(see ``KUEUE_API``).
"""

from __future__ import annotations

from typing import Any

from jupyterhub_gpu.core.model import Amounts, Group, Policy
from jupyterhub_gpu.core.objects import (
    UNBOUNDED,
    all_groups,
    counted_in,
    device_caps,
    device_class_resource,
    metadata,
    namespace_for,
    queue_name,
    share_weights,
    unique,
)
from jupyterhub_gpu.core.pending import (
    gated_by_kueue,
    kueue_position,
    kueue_queue_line,
    workload_of,
)
from jupyterhub_gpu.core.quantities import format_bytes, format_cpu

from .base import ObjectKind, QueuePlace, Scheduler

#: Kueue's storage version in the pinned release (v0.19): v1beta1 is served too, but
#: a cluster with Kueue's CRDs and no Kueue running has no conversion webhook, and
#: v1beta1's fields renamed in v1beta2 (a ClusterQueue's ``cohort``) would be lost
KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_FLAVOR = "jupyterhub-gpu"
#: Kueue has no "unlimited" nominal quota; an uncapped resource gets this many units
KUEUE_UNBOUNDED = UNBOUNDED
_FIX = (
    "install Kueue (CRDs *.kueue.x-k8s.io, config/components/crd/bases), "
    "or set GPUPolicy.scheduler.name to what the cluster runs"
)


def _kind(kind: str, plural: str, namespaced: bool = False) -> ObjectKind:
    return ObjectKind(KUEUE_API, kind, plural, namespaced, _FIX)


class Kueue(Scheduler):
    name = "kueue"
    display_name = "Kueue"
    queue_label = "kueue.x-k8s.io/queue-name"
    #: Kueue's Workloads, in the version the pinned Kueue stores (it serves v1beta1 too)
    queue_objects = ("kueue.x-k8s.io", "v1beta2", "workloads")
    kinds = (
        _kind("ResourceFlavor", "resourceflavors"),
        _kind("Cohort", "cohorts"),
        _kind("ClusterQueue", "clusterqueues"),
        _kind("LocalQueue", "localqueues", namespaced=True),
    )
    rbac_resources = ("resourceflavors", "clusterqueues", "localqueues", "cohorts")

    def objects(self, hub: str) -> list[dict[str, Any]]:
        """One ResourceFlavor, a ClusterQueue (+ Cohort per parent) and LocalQueue per group.

        Kueue assigns one flavor per resource group to a whole pod, while the spawner
        already pins each server to its nodes; so the single ResourceFlavor carries no
        node labels and quotas are per device resource. ``nominalQuota`` is the quota,
        ``borrowingLimit`` the room up to the limit; a parent group's own ClusterQueue
        holds what its quota leaves beyond its children's, so the cohort adds up to it.
        """
        policy = self.policy
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": KUEUE_API,
                "kind": "ResourceFlavor",
                "metadata": metadata(KUEUE_FLAVOR, hub),
                "spec": {},
            }
        ]
        children: dict[str, list[Group]] = {}
        for group in policy.groups.values():
            if group.parent:
                children.setdefault(group.parent, []).append(group)
        # with fair share, Kueue's fair sharing weighs sibling queues and cohorts by share
        # (it needs ``fairSharing`` in Kueue's own configuration, which is the site's)
        weights = share_weights(policy) if policy.fair_share else None
        for parent_name in children:
            parent = policy.groups[parent_name]
            spec: dict[str, Any] = {}
            if parent.parent:
                spec["parentName"] = queue_name(policy.groups[parent.parent])
                if weights is not None:
                    spec["fairSharing"] = {"weight": str(weights[parent.name])}
            objects.append(
                {
                    "apiVersion": KUEUE_API,
                    "kind": "Cohort",
                    "metadata": metadata(queue_name(parent), hub),
                    "spec": spec,
                }
            )
        # DRA devices as Kueue counts them: by the name its Configuration maps their
        # DeviceClass to (``device_class_mappings``)
        device_resources = sorted(
            {r for f in policy.flavors.values() for r in counted_in(policy, f)}
        )
        covered = ["cpu", "memory", "pods", *device_resources]
        for group in all_groups(policy):
            quota = self._amounts(group, group.quota, covered)
            limit = self._amounts(group, group.limit, covered)
            if group.name in children:  # the cohort adds up to the parent's own quota
                for child in children[group.name]:
                    for r, v in self._amounts(child, child.quota, covered).items():
                        if quota[r] is not None and v is not None:
                            quota[r] = max(0, quota[r] - v)
            cohort = group.name if group.name in children else group.parent
            resources = []
            for r in covered:
                # outside a cohort there is nothing to borrow: the limit is all it may use
                nominal = quota[r] if cohort else limit[r]
                entry: dict[str, Any] = {
                    "name": r,
                    "nominalQuota": _quantity(
                        r, nominal if nominal is not None else KUEUE_UNBOUNDED
                    ),
                }
                # Kueue allows a borrowing limit only inside a cohort
                if cohort and quota[r] is not None and limit[r] is not None:
                    entry["borrowingLimit"] = _quantity(r, max(0, limit[r] - quota[r]))
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
                if weights is not None:
                    # a parent's own queue holds what its children's quotas leave: it
                    # competes with them as the parent itself would, at the parent's share
                    cq_spec["fairSharing"] = {"weight": str(weights[group.name])}
            objects.append(
                {
                    "apiVersion": KUEUE_API,
                    "kind": "ClusterQueue",
                    "metadata": metadata(queue_name(group), hub),
                    "spec": cq_spec,
                }
            )
            objects.append(
                {
                    "apiVersion": KUEUE_API,
                    "kind": "LocalQueue",
                    "metadata": metadata(
                        queue_name(group), hub, namespace_for(policy, group.name) or hub
                    ),
                    "spec": {"clusterQueue": queue_name(group)},
                }
            )
        return unique(objects)

    def _amounts(self, group: Group, amounts: Amounts, covered: list[str]) -> dict[str, int | None]:
        """Resource -> amount in base units (millicores, bytes, pods, devices); None: uncapped."""
        if group.unlimited:
            return dict.fromkeys(covered)
        devices = device_caps(self.policy, group, amounts)
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

    def holds(self, pod: dict) -> bool:
        # Kueue holds a pod behind its admission gate until its Workload is admitted
        return gated_by_kueue(pod)

    def place(self, pod: dict, listed: list[dict]) -> QueuePlace:
        workload = workload_of(pod, listed)
        position = kueue_position(workload, listed) if workload is not None else None
        return QueuePlace(self.queue_of(pod), workload, position)

    def queue_line(self, place: QueuePlace, queue_state: str | None = None) -> str:
        return kueue_queue_line(place.queue, place.entry, place.position)

    def unread_line(self, queue: str) -> str:
        return kueue_queue_line(queue, None, None)


def device_class_mappings(policy: Policy) -> list[dict[str, Any]]:
    """What Kueue's own Configuration must say for the policy's DRA devices to be
    counted (``resources.deviceClassMappings``, Kueue 0.14 on): each DeviceClass a
    ``dra`` or bridged flavor uses, under the name its ClusterQueues' quota uses.
    Kueue refuses to admit a pod whose ResourceClaimTemplate names a class it does
    not map; a bridged flavor's extended resource is counted under the mapped name
    once its class is mapped, under the extended resource's own name otherwise."""
    classes = sorted({f.device_class for f in policy.flavors.values() if f.device_class})
    return [{"name": device_class_resource(c), "deviceClassNames": [c]} for c in classes]


def _quantity(resource: str, value: int) -> str:
    if resource == "cpu":
        return format_cpu(value * 1000 if value == KUEUE_UNBOUNDED else value)
    if resource == "memory":
        return format_bytes(value * 2**30 if value == KUEUE_UNBOUNDED else value)
    return str(value)
