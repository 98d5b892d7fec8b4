"""One object per scheduler, behind one interface (``Scheduler``), chosen once from
the policy's ``scheduler.name`` by ``scheduler_for``.

Each module is one scheduler: how it shapes a server's pod, the objects that carry
the policy into it, and, for one that holds pods in a queue, where a pod waits and
why. Nothing outside this package compares a scheduler's name; a new scheduler is a
new module here and its entry in ``SCHEDULERS``. Pure: no I/O.

(The modules import the rest of the core by absolute path: the core's lint rule
allows no relative import out of a folder.)
"""

from __future__ import annotations

from jupyterhub_gpu.core.model import Policy

from .base import ObjectKind, QueuePlace, Resource, Scheduler
from .default import KubeScheduler
from .kai import KAI
from .kueue import Kueue
from .volcano import Volcano

#: every scheduler a policy may name, by its ``scheduler.name``; the reconciler creates
#: their kinds, and the hub's ClusterRole lists their objects, in this order
SCHEDULERS: dict[str, type[Scheduler]] = {s.name: s for s in (KubeScheduler, KAI, Volcano, Kueue)}

__all__ = [
    "SCHEDULERS",
    "ObjectKind",
    "QueuePlace",
    "Resource",
    "Scheduler",
    "object_kinds",
    "scheduler_for",
]


def scheduler_for(policy: Policy) -> Scheduler:
    """The scheduler the policy names, for that policy."""
    return SCHEDULERS[policy.scheduler.name](policy)


def object_kinds() -> list[ObjectKind]:
    """The kinds of every scheduler's objects: a policy may change scheduler, and what the
    old one's objects were must still be known to prune them."""
    return [kind for scheduler in SCHEDULERS.values() for kind in scheduler.kinds]
