"""The hub's count of refused spawns, served with JupyterHub's own metrics.

JupyterHub serves prometheus_client's default registry at ``/hub/metrics`` (to a
token with ``read:metrics``), so a counter registered there from the hub process
is scraped with the hub's metrics. The GPU service cannot count refusals: they
happen in the hub's spawner, and the service never sees the spawns it refused.

``jupyterhub_gpu_spawns_refused_total`` {group, reason}: spawns the spawner refused
(an HTTP error the user reads, nothing started), by the group they were to be
charged to (empty when the refusal came before a group was chosen: options no
group allows, a hub that cannot spawn, an unreachable API server) and why, one of
``REASONS``. Both labels are bounded: groups are the policy's, never what a user
sent.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from ..core.admission import REFUSED_GROUP_FULL, REFUSED_TOO_LARGE, REFUSED_USER_CAP
from .admission import REFUSED_BUDGET, REFUSED_USAGE_DATABASE
from .checks import (
    REFUSED_DATASET_CLAIM,
    REFUSED_KUBERNETES,
    REFUSED_OPTIONS,
    SpawnRefused,
)
from .server_exit import EXITED_STATUS

REFUSED_QUEUE_TIMEOUT = "queue_timeout"
REFUSED_SERVER_EXITED = "server_exited"
REFUSED_CONFIGURATION = "configuration"
REFUSED_OTHER = "other"

#: every reason a refusal is counted under, and what it means
REASONS: dict[str, str] = {
    REFUSED_GROUP_FULL: "the group (or a parent) is at its limit, and its spawns do not wait",
    REFUSED_USER_CAP: "the user is at their own cap in the group",
    REFUSED_TOO_LARGE: "the server alone needs more than a group's limit",
    REFUSED_BUDGET: "a GPU-hour budget is used up",
    REFUSED_USAGE_DATABASE: "budgets cannot be checked: the usage database is unavailable",
    REFUSED_OPTIONS: "options no group of the user allows, or malformed",
    REFUSED_DATASET_CLAIM: "a dataset's PersistentVolumeClaim is missing",
    REFUSED_KUBERNETES: "the Kubernetes API server refused the pod or could not be reached",
    REFUSED_QUEUE_TIMEOUT: "the server waited past queue_timeout in its scheduler's queue",
    REFUSED_SERVER_EXITED: "the server's process exited before it served",
    REFUSED_CONFIGURATION: "the hub's set-up allows no spawn (policy, profile_list, mounts)",
    REFUSED_OTHER: "any other refusal",
}

#: the reason a refusal's HTTP status says, for refusals raised without one
_BY_STATUS = {
    400: REFUSED_OPTIONS,
    EXITED_STATUS: REFUSED_SERVER_EXITED,
    429: REFUSED_QUEUE_TIMEOUT,
    500: REFUSED_CONFIGURATION,
    503: REFUSED_KUBERNETES,
}


def refusal_reason(refusal: SpawnRefused) -> str:
    """The reason ``refusal`` is counted under (always one of ``REASONS``)."""
    kind = refusal.kind or _BY_STATUS.get(refusal.status_code, REFUSED_OTHER)
    return kind if kind in REASONS else REFUSED_OTHER


def refusals_counter(registry: CollectorRegistry = REGISTRY) -> Counter:
    return Counter(
        "jupyterhub_gpu_spawns_refused",
        "GPU spawns the hub refused, by the group they were to be charged to and why",
        ["group", "reason"],
        registry=registry,
    )


#: the hub process's counter, in the registry JupyterHub serves at /hub/metrics
SPAWNS_REFUSED = refusals_counter()


def count_refusal(group: str, refusal: SpawnRefused, counter: Counter = SPAWNS_REFUSED) -> None:
    counter.labels(group=group, reason=refusal_reason(refusal)).inc()
