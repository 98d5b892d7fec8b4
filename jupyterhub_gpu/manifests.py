"""Kubernetes objects the policy implies, rendered as plain manifests (DESIGN §5).

Pure: the service reconciles these and ``jupyterhub-gpu manifests`` prints them.
So far: the PriorityClasses in-quota and over-quota servers run with.
"""

from __future__ import annotations

from typing import Any

from .model import Policy

OWNER_LABEL = "app.kubernetes.io/managed-by"
OWNER = "jupyterhub-gpu"
#: in-quota servers are never preempted by bursting ones; over-quota servers yield
IN_QUOTA_PRIORITY = 1000
OVER_QUOTA_PRIORITY = 100


def priority_classes(policy: Policy) -> list[dict[str, Any]]:
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
            "metadata": {"name": name, "labels": {OWNER_LABEL: OWNER}},
            "value": value,
            "globalDefault": False,
            "description": description,
        }
        for name, (value, description) in values.items()
    ]
