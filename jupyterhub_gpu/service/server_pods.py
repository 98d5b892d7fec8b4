"""A server's pod as the service reads it from the cluster: whose server it is, what it
is charged, the GPU time it records, and what says it is ending; a pod whose labels
cannot be true taken for nothing it claims."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ..core.admission import Charge
from ..core.adoption import USERNAME_ANNOTATION, username_of
from ..core.budgets import UsageRecord
from ..core.shaping import (
    GROUP_LABEL,
    PROFILE_LABEL,
    SPAWN_ANNOTATION,
    charge_from_pod,
    pod_key,
    terminating,
    usage_record_from_pod,
)
from ..kube.reflector import slim_pod

log = logging.getLogger("jupyterhub_gpu.service")

SERVERNAME_ANNOTATION = "hub.jupyter.org/servername"


@dataclass(frozen=True)
class ServerPod:
    """A server pod of this hub: what it is charged, and whose server it is."""

    key: str
    charge: Charge | None  # None: finished, or unreadable
    user: str | None
    servername: str
    created: datetime | None
    profile: str | None = None  # the profile label
    #: the GPU time it is recording (None: no GPUs, or not started yet)
    usage: UsageRecord | None = None
    #: when the pod started (``status.startTime``: after any time in a scheduler's queue)
    started: datetime | None = None
    #: the pod's uid (a delete names it, so a newer pod of the same name is never hit)
    uid: str | None = None
    #: which of its server's starts made it: the hub's ``started`` of that start (None:
    #: a pod made before the spawner wrote it down)
    spawn_started: str | None = None
    #: a server started before the policy (none of its labels): the pod as the adoption
    #: rule reads it (``core.adoption``); its charge and GPU time follow from its user's
    #: groups, which ``ServiceState`` knows
    before_policy: Mapping[str, Any] | None = None
    #: being deleted (still charged until it is gone; never taken for an orphan)
    terminating: bool = False
    #: (condition type, reason, message) of a condition saying who is ending the pod:
    #: Kubernetes' ``DisruptionTarget`` (preemption, eviction) or Kueue's ``TerminationTarget``
    disruption: tuple[str, str, str] | None = None
    #: why its labels cannot be true (``core.claims``); such a pod is charged to nobody,
    #: records no GPU time, names no server (``user`` None) and is only reported
    foreign: str | None = None
    #: for a foreign pod: what its labels say (the pod as it would have been counted)
    claimed: ServerPod | None = None
    #: foreign because another pod is the server it names (told again as pods come
    #: and go, and as the hub's starts change); False: for what it is on its own
    impostor: bool = False

    def foreign_json(self) -> dict[str, Any]:
        """A foreign pod as the admins' report shows it: what it claims, and why not."""
        claimed = self.claimed or self
        return {
            "pod": self.key,
            "user": claimed.user,
            "server": claimed.servername,
            "group": claimed.charge.group if claimed.charge else None,
            "why": self.foreign,
        }


def as_foreign(found: ServerPod, why: str, *, impostor: bool = False) -> ServerPod:
    """``found`` taken for nothing it claims: not charged, no GPU time, no server."""
    return replace(
        found,
        charge=None,
        usage=None,
        user=None,
        servername="",
        foreign=why,
        claimed=found,
        impostor=impostor,
    )


def _as_adoption_reads_it(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the adoption rule and the usage record need of a pod from before the policy."""
    slim = slim_pod(pod)
    metadata, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    keep = ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp")
    return {
        "metadata": {k: metadata.get(k) for k in keep},
        "spec": {**slim["spec"], "nodeSelector": spec.get("nodeSelector") or {}},
        "status": {**slim["status"], "startTime": status.get("startTime")},
    }


def server_pod(pod: Mapping[str, Any]) -> ServerPod:
    metadata = pod.get("metadata") or {}
    if GROUP_LABEL not in (metadata.get("labels") or {}):
        annotations = metadata.get("annotations") or {}
        return ServerPod(
            key=pod_key(pod),
            charge=None,
            user=username_of(pod) or None,
            servername=annotations.get(SERVERNAME_ANNOTATION, ""),
            created=_timestamp(metadata.get("creationTimestamp")),
            started=_timestamp((pod.get("status") or {}).get("startTime")),
            before_policy=_as_adoption_reads_it(pod),
            uid=metadata.get("uid"),
            terminating=terminating(pod),
            disruption=_disruption(pod),
        )
    annotations = metadata.get("annotations") or {}
    key = pod_key(pod)
    try:
        charge = charge_from_pod(pod)
    except ValueError as e:
        log.warning("%s; it is not counted", e)
        charge = None
    created = metadata.get("creationTimestamp")
    started = (pod.get("status") or {}).get("startTime")
    try:
        usage = usage_record_from_pod(pod)
    except ValueError:
        usage = None  # warned about above
    return ServerPod(
        key=key,
        charge=charge,
        user=annotations.get(USERNAME_ANNOTATION) or (charge.user if charge else None),
        servername=annotations.get(SERVERNAME_ANNOTATION, ""),
        created=_timestamp(created),
        profile=(metadata.get("labels") or {}).get(PROFILE_LABEL),
        usage=usage,
        started=_timestamp(started),
        uid=metadata.get("uid"),
        spawn_started=annotations.get(SPAWN_ANNOTATION),
        terminating=terminating(pod),
        disruption=_disruption(pod),
    )


def newer(pod: ServerPod, than: ServerPod) -> bool:
    """Whether ``pod`` is rather a server's pod than ``than``: not being deleted, newer."""
    return (pod.terminating, -_created(pod)) < (than.terminating, -_created(than))


def _created(pod: ServerPod) -> float:
    return pod.created.timestamp() if pod.created else 0.0


def as_labelled(pod: ServerPod) -> ServerPod:
    """A pod as its labels say, before it was found to name a server whose pod is another."""
    return pod.claimed if pod.impostor and pod.claimed is not None else pod


def _disruption(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        kind = condition.get("type")
        if kind in ("DisruptionTarget", "TerminationTarget") and condition.get("status") == "True":
            return kind, condition.get("reason") or "", condition.get("message") or ""
    return None


def _timestamp(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
