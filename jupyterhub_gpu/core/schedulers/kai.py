"""NVIDIA's KAI scheduler: a queue per group, with quota and over-quota limit.

A server's pod names ``kai-scheduler`` and its group's queue (label
``kai.scheduler/queue``); KAI places it, or leaves it Pending with its own events,
which the spawn page explains like kube-scheduler's. The policy renders a
``scheduling.run.ai/v2`` Queue per group under one root queue ``jupyterhub-gpu``
(KAI schedules only queues that have a parent), and no PriorityClasses: KAI brings
its own (``build``, ``build-preemptible``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from jupyterhub_gpu.core.objects import (
    all_groups,
    metadata,
    number,
    queue_name,
    share_weights,
    unique,
)

from .base import ObjectKind, Scheduler

#: the KAI queue every group queue hangs under (KAI v0.12 schedules only queues with a parent)
KAI_ROOT_QUEUE = "jupyterhub-gpu"
_FIX = (
    "install the KAI scheduler (its CRD queues.scheduling.run.ai comes with its Helm chart, "
    "deployments/kai-scheduler/crds), or set GPUPolicy.scheduler.name to what the cluster runs"
)


def _kai_resource(
    quota: int | Fraction | None, limit: int | Fraction | None, scale=1, weight: int = 1
):
    def amount(v):
        return -1 if v is None else number(Fraction(v) / scale)

    return {"quota": amount(quota), "limit": amount(limit), "overQuotaWeight": weight}


class KAI(Scheduler):
    name = "kai"
    display_name = "KAI"
    pod_scheduler_name = "kai-scheduler"
    queue_label = "kai.scheduler/queue"
    own_priority_classes = True
    kinds = (ObjectKind("scheduling.run.ai/v2", "Queue", "queues", False, _FIX),)
    rbac_resources = ("queues",)

    def objects(self, hub: str) -> list[dict[str, Any]]:
        """KAI Queues: GPUs in GPU-equivalents, CPU in millicores, memory in MB; -1 unlimited."""
        policy = self.policy
        objects = [
            {
                "apiVersion": "scheduling.run.ai/v2",
                "kind": "Queue",
                "metadata": metadata(KAI_ROOT_QUEUE, hub),
                "spec": {
                    "displayName": "JupyterHub GPU",
                    "resources": {
                        k: {"quota": -1, "limit": -1, "overQuotaWeight": 1}
                        for k in ("cpu", "gpu", "memory")
                    },
                },
            }
        ]
        # KAI divides what is left above the queues' quotas among siblings by weight
        weights = share_weights(policy)
        for group in all_groups(policy):
            parent = policy.groups[group.parent] if group.parent else None
            q, lim = group.quota, group.limit
            weight = weights[group.name]
            if group.unlimited:
                resources = {
                    k: {"quota": -1, "limit": -1, "overQuotaWeight": weight}
                    for k in ("cpu", "gpu", "memory")
                }
            else:
                resources = {
                    "gpu": _kai_resource(q.gpus if q.gpus is not None else 0, lim.gpus, 1, weight),
                    "cpu": _kai_resource(q.cpu if q.cpu is not None else 0, lim.cpu, 1, weight),
                    "memory": _kai_resource(
                        q.memory if q.memory is not None else 0, lim.memory, 10**6, weight
                    ),
                }
            objects.append(
                {
                    "apiVersion": "scheduling.run.ai/v2",
                    "kind": "Queue",
                    "metadata": metadata(queue_name(group), hub),
                    "spec": {
                        "displayName": group.display_name,
                        "parentQueue": queue_name(parent) if parent else KAI_ROOT_QUEUE,
                        "resources": resources,
                    },
                }
            )
        return unique(objects)
