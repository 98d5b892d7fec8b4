"""What every scheduler answers: the one interface the spawn path, the manifests and
the reconciler ask, whichever scheduler the policy names.

A scheduler object is made for one policy (``scheduler_for``). Its class says what
the scheduler is (its ``schedulerName``, the label naming a pod's queue, the objects
it keeps per queued pod); its methods shape a server's pod for it, render the
objects that carry the policy into it, and, for a scheduler that holds pods in a
queue before they are scheduled, say where a pod waits and why, in one line. Pure:
what to list is declared here, the listing is the spawner's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from jupyterhub_gpu.core.model import Group, Policy, dns_label

if TYPE_CHECKING:
    from jupyterhub_gpu.core.shaping import PodShape

#: a kind of custom object as the API serves it: (group, version, plural)
Resource = tuple[str, str, str]


@dataclass(frozen=True)
class ObjectKind:
    """A kind of object a scheduler's policy objects are, as the reconciler keeps it."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    #: what to do when the API server does not know the kind
    fix: str = ""


@dataclass(frozen=True)
class QueuePlace:
    """Where a pod waits in its scheduler's queue."""

    #: the queue the pod names
    queue: str
    #: the scheduler's object for the pod (a Workload, a PodGroup); None: not made yet
    entry: dict | None
    #: 1: next; None when not known
    position: int | None


class Scheduler:
    """A scheduler, for one policy. What a scheduler does not override it does not do:
    no pod fields of its own, no objects, no queue."""

    #: the policy's ``scheduler.name``
    name: ClassVar[str]
    #: the scheduler as the spawn page and the hub log name it
    display_name: ClassVar[str]
    #: the pod's ``schedulerName``; None keeps the chart's
    pod_scheduler_name: ClassVar[str | None] = None
    #: the label naming the pod's queue (the group's queue object), if it has one
    queue_label: ClassVar[str | None] = None
    #: what the scheduler keeps per queued pod (Kueue's Workloads, Volcano's PodGroups):
    #: set for a scheduler that holds server pods in a queue before scheduling them
    queue_objects: ClassVar[Resource | None] = None
    #: cluster-scoped queues whose state says whether one admits anything (Volcano's)
    queue_states: ClassVar[Resource | None] = None
    #: it brings its own PriorityClasses, so the policy renders none
    own_priority_classes: ClassVar[bool] = False
    #: the kinds of the objects ``objects`` renders, in creation order
    kinds: ClassVar[tuple[ObjectKind, ...]] = ()
    #: their resources as the hub's ClusterRole grants them, all of one API group
    rbac_resources: ClassVar[tuple[str, ...]] = ()

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    # ---- the pod ---------------------------------------------------------------------

    def shape_pod(self, pod: PodShape, group: Group, tier: str) -> None:
        """Put on ``pod`` what the scheduler reads: its name and the group's queue."""
        if self.pod_scheduler_name:
            pod.scheduler_name = self.pod_scheduler_name
        if self.queue_label:
            pod.labels[self.queue_label] = dns_label(group.queue)

    # ---- the objects that carry the policy into it -------------------------------------

    def objects(self, hub: str) -> list[dict[str, Any]]:
        """The scheduler's objects for the policy's groups (queues), labelled for ``hub``."""
        return []

    # ---- waiting in its queue ----------------------------------------------------------

    @property
    def queues_pods(self) -> bool:
        """Whether it holds server pods in a queue before scheduling them."""
        return self.queue_objects is not None

    def holds(self, pod: dict) -> bool:
        """Whether the scheduler may be holding ``pod`` (API form) in its queue now; when
        not, nothing needs to be read to know it is not waiting there."""
        return False

    def queue_of(self, pod: dict) -> str:
        """The queue ``pod`` names."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return labels.get(self.queue_label or "", "?")

    def place(self, pod: dict, listed: list[dict]) -> QueuePlace | None:
        """Where ``pod`` waits among ``listed`` (the ``queue_objects`` of its namespace);
        None when the scheduler does not hold it."""
        return None

    def queue_line(self, place: QueuePlace, queue_state: str | None = None) -> str:
        """What the spawn page says while the pod waits at ``place``; ``queue_state`` is
        the state of its queue (``queue_states``), when read."""
        return self.unread_line(place.queue)

    def unread_line(self, queue: str) -> str:
        """The line while the scheduler's objects cannot be read: where, not which place."""
        return (
            f"Waiting in {self.display_name} queue {queue}. The server starts by itself "
            f"when {self.display_name} lets it in; stop it to give up."
        )
