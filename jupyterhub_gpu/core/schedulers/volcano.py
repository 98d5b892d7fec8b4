"""Volcano: a queue per group, with a deserved share (the quota) and a capability
(the limit).

A server's pod names ``volcano`` and its group's queue (annotation
``scheduling.volcano.sh/queue-name``); Volcano's controller makes a PodGroup for
it, which stays ``Pending`` (out of the queue, no node considered) until the
queue has room. Meanwhile the spawn page shows the server's place among the
queue's PodGroups and why it waits. Only servers above their quota may be
reclaimed (``volcano.sh/preemptable``). The policy renders a
``scheduling.volcano.sh/v1beta1`` Queue per group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jupyterhub_gpu.core.admission import IN_QUOTA
from jupyterhub_gpu.core.model import Group, dns_label
from jupyterhub_gpu.core.objects import (
    UNBOUNDED,
    all_groups,
    metadata,
    priority_values,
    queue_name,
    resource_list,
    share_weights,
    unique,
)
from jupyterhub_gpu.core.pending import (
    podgroup_of,
    volcano_position,
    volcano_queue_line,
    volcano_queued,
)

from .base import ObjectKind, QueuePlace, Scheduler

if TYPE_CHECKING:
    from jupyterhub_gpu.core.shaping import PodShape

VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
#: whether Volcano's preempt and reclaim actions may evict the pod (Volcano's default: yes)
VOLCANO_PREEMPTABLE_ANNOTATION = "volcano.sh/preemptable"
#: nor has Volcano an "unlimited" deserved share: an uncapped CPU or memory gets this
VOLCANO_UNBOUNDED = {"cpu": str(UNBOUNDED), "memory": f"{UNBOUNDED}Gi"}
_FIX = (
    "install Volcano (CRD queues.scheduling.volcano.sh, config/crd/volcano/bases), "
    "or set GPUPolicy.scheduler.name to what the cluster runs"
)


class Volcano(Scheduler):
    name = "volcano"
    display_name = "Volcano"
    pod_scheduler_name = "volcano"
    queue_objects = ("scheduling.volcano.sh", "v1beta1", "podgroups")
    queue_states = ("scheduling.volcano.sh", "v1beta1", "queues")
    kinds = (ObjectKind("scheduling.volcano.sh/v1beta1", "Queue", "queues", False, _FIX),)
    rbac_resources = ("queues",)

    def shape_pod(self, pod: PodShape, group: Group, tier: str) -> None:
        super().shape_pod(pod, group, tier)
        pod.annotations[VOLCANO_QUEUE_ANNOTATION] = dns_label(group.queue)
        # Volcano's reclaim takes any preemptable pod of a queue above its deserved
        # share, whatever its priority: only servers above their quota may be taken
        pod.annotations[VOLCANO_PREEMPTABLE_ANNOTATION] = str(tier != IN_QUOTA).lower()

    def objects(self, hub: str) -> list[dict[str, Any]]:
        """Volcano Queues: ``deserved`` the quota, ``capability`` the limit, ``parent`` the tree."""
        policy = self.policy
        objects = []
        # Volcano's proportion plugin divides what is left among queues by weight
        weights = share_weights(policy)
        for group in all_groups(policy):
            spec: dict[str, Any] = {"weight": weights[group.name], "reclaimable": True}
            if group.parent:
                spec["parent"] = queue_name(policy.groups[group.parent])
            if not group.unlimited:
                if capability := resource_list(policy, group, group.limit):
                    spec["capability"] = capability
                if deserved := resource_list(policy, group, group.quota):
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
                    "metadata": metadata(queue_name(group), hub),
                    "spec": spec,
                }
            )
        return unique(objects)

    def holds(self, pod: dict) -> bool:
        # a pod bound to a node is past the queue
        return not pod.get("spec", {}).get("nodeName")

    def queue_of(self, pod: dict) -> str:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        return annotations.get(VOLCANO_QUEUE_ANNOTATION, "?")

    def place(self, pod: dict, listed: list[dict]) -> QueuePlace | None:
        podgroup = podgroup_of(pod, listed)
        if podgroup is None or not volcano_queued(podgroup):
            return None  # not yet grouped by Volcano's controller, or let into its queue
        position = volcano_position(podgroup, listed, priority_values(self.policy))
        return QueuePlace(self.queue_of(pod), podgroup, position)

    def queue_line(self, place: QueuePlace, queue_state: str | None = None) -> str:
        assert place.entry is not None  # a place in Volcano's queue is its PodGroup's
        return volcano_queue_line(place.queue, place.entry, place.position, queue_state)
