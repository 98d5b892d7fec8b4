"""When a server's pod ended, as far as its pod says, and whether it had (pure).

A stop the hub makes is one of two kinds. Either the hub asks a running pod to go
(a user's Stop, an admin's, the GPU service's through the hub's API): the end is
witnessed, at the moment it was asked. Or the hub stops a server it found already
stopped (its poll saw the pod gone or its process exited; a hub start found the
pod gone): the end happened before the hub noticed, so it is never the time of
noticing. It is the pod's own end when the API still showed it (its notebook
container's ``finishedAt``, or the deletion's ``deletionTimestamp``), else the last
time the pod was seen alive (an inferred end).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .exits import NOTEBOOK_CONTAINER

#: the phases of a pod whose containers all ended
FINISHED_PHASES = ("Succeeded", "Failed")


def _epoch(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _notebook_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    chosen = next((s for s in statuses if s.get("name") == NOTEBOOK_CONTAINER), None)
    if chosen is None and statuses:
        # a pod shaped otherwise: its first container is the server's
        first = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name")
        chosen = next((s for s in statuses if s.get("name") == first), None)
    return chosen


def has_ended(pod: Mapping[str, Any] | None) -> bool:
    """The pod is going or gone on its own: deleted (``deletionTimestamp``), finished
    (``Succeeded``/``Failed``) or its server's container exited. A stop of it is not
    one the hub asked for."""
    if not pod:
        return True
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
        return True
    status = _notebook_status(pod)
    return bool(status and "terminated" in (status.get("state") or {}))


def pod_ended_at(pod: Mapping[str, Any] | None, now: float) -> float | None:
    """When the pod's server ended, from the pod itself, never after ``now``: its
    notebook container's ``state.terminated.finishedAt``, else the deletion's
    ``deletionTimestamp`` (the latest it may run: the grace a deletion gives ends
    there); None when the pod says neither."""
    if not pod:
        return None
    status = _notebook_status(pod)
    terminated = ((status or {}).get("state") or {}).get("terminated") or {}
    finished = _epoch(terminated.get("finishedAt"))
    if finished is not None:
        return min(finished, now)
    deleted = _epoch((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deleted is not None:
        return min(deleted, now)
    return None
