"""Pod shape: what a selection, in its tier, asks of Kubernetes.

``shape`` is pure: it returns a ``PodShape`` the spawner applies on top of the
chart's settings (``apply_to_pod`` for the final pod, ``merge_settings`` for
KubeSpawner's own traits), and the same code renders ``jupyterhub-gpu pod``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .admission import IN_QUOTA, Charge
from .budgets import UsageRecord
from .model import Dataset, Flavor, Policy
from .objects import BURST_BANDS, NO_PREEMPTION_SUFFIX, namespace_for, priority_values
from .schedulers import SCHEDULERS, scheduler_for
from .selection import Request, Selection

LABEL_PREFIX = "gpu.jupyterhub.org"
GROUP_LABEL = f"{LABEL_PREFIX}/group"
PROFILE_LABEL = f"{LABEL_PREFIX}/profile"
FLAVOR_LABEL = f"{LABEL_PREFIX}/flavor"
TIER_LABEL = f"{LABEL_PREFIX}/tier"
#: which hub a server belongs to (its namespace), so that two hubs sharing a cluster
#: (production and staging) never count, bill or stop each other's servers
HUB_LABEL = f"{LABEL_PREFIX}/hub"
CHARGE_ANNOTATION = f"{LABEL_PREFIX}/charge"
#: which of a server's starts made a pod: the hub's ``started`` of that start, as its
#: REST API writes it (the service stops a server only while it is still that start)
SPAWN_ANNOTATION = f"{LABEL_PREFIX}/spawn-started"
#: the label naming a pod's queue, per scheduler that has one (each scheduler's own)
QUEUE_LABELS = {name: s.queue_label for name, s in SCHEDULERS.items() if s.queue_label}
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars, alphanumeric ends) made from any text."""
    value = _LABEL_VALUE_BAD.sub("-", text)[:63].strip("-_.")
    return value


@dataclass
class PodShape:
    namespace: str | None = None
    cpu_guarantee: float = 0
    cpu_limit: float = 0  # a profile's limits are its guarantees unless it raises them
    mem_guarantee: int = 0
    mem_limit: int = 0
    image: str | None = None
    extended_resources: dict[str, str] = field(default_factory=dict)  # requests == limits
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    scheduler_name: str | None = None  # None: keep the chart's
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    resource_claims: list[dict[str, str]] = field(default_factory=list)
    #: the group's datasets, as the pod's volumes and the notebook container's mounts
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    #: where the server opens (the chosen interface); None: the chart's default URL
    default_url: str | None = None


def _device_resources(flavor: Flavor, count: int) -> dict[str, str]:
    if flavor.kind in ("fraction", "dra"):
        return {}  # KAI annotations / a resource claim, no device request
    assert flavor.resource is not None  # every device kind has one (the model's default)
    resources = {flavor.resource: str(count)}
    if flavor.kind == "hami":
        assert flavor.gpu_memory is not None
        resources["nvidia.com/gpumem"] = str(flavor.gpu_memory)
        if flavor.gpucores:
            resources["nvidia.com/gpucores"] = str(flavor.gpucores)
    return resources


def without_preemption(policy: Policy, priority_class: str) -> str:
    """The twin of one of the bundle's PriorityClasses that never preempts (a group's
    own class, or one a scheduler brings, is the site's: kept as it is)."""
    if priority_class not in priority_values(policy) or scheduler_for(policy).own_priority_classes:
        return priority_class
    return priority_class + NO_PREEMPTION_SUFFIX


def shape(
    policy: Policy,
    selection: Selection,
    tier: str,
    *,
    username: str,
    servername: str = "",
    hub: str | None = None,
    preempt: bool = True,
    burst_band: str | None = None,
) -> PodShape:
    """The policy's part of a server's pod; ``preempt``: False while servers started
    before the policy run (see ``without_preemption``); ``burst_band``: with fair
    share, an over-quota server's band by its user's standing (``fairshare.burst_band``):
    the scheduler preempts the heaviest users' bursts first."""
    group, profile, flavor = selection.group, selection.profile, selection.flavor
    scheduler = policy.scheduler
    result = PodShape(
        namespace=namespace_for(policy, group.name),
        cpu_guarantee=profile.cpu / 1000,
        cpu_limit=(profile.cpu_limit or profile.cpu) / 1000,
        mem_guarantee=profile.memory,
        mem_limit=profile.memory_limit or profile.memory,
        image=selection.image,
    )
    result.labels = {
        GROUP_LABEL: label_value(group.name),
        PROFILE_LABEL: label_value(profile.name),
        FLAVOR_LABEL: label_value(flavor.name if flavor else "cpu"),
        TIER_LABEL: tier,
    }
    if hub:
        result.labels[HUB_LABEL] = label_value(hub)
    for key, template in policy.extra_labels.items():
        result.labels[key] = label_value(
            template.format(
                username=username,
                group=group.name,
                profile=profile.name,
                flavor=flavor.name if flavor else "cpu",
                servername=servername,
            )
        )
    result.annotations[CHARGE_ANNOTATION] = json.dumps(
        {"user": username, "request": selection.request.to_json()}, sort_keys=True
    )
    if tier == IN_QUOTA:
        result.priority_class_name = group.priority_class or scheduler.in_quota_priority_class
    else:
        result.priority_class_name = scheduler.over_quota_priority_class
        banded = burst_band in BURST_BANDS and policy.fair_share is not None
        if banded and not scheduler_for(policy).own_priority_classes:
            result.priority_class_name += f"-{burst_band}"
    if not preempt:
        result.priority_class_name = without_preemption(policy, result.priority_class_name)
    # the scheduler's name, and the group's queue as the scheduler reads it
    scheduler_for(policy).shape_pod(result, group, tier)
    for dataset in policy.datasets_of(group.name):
        result.volumes.append({"name": dataset.volume_name, **copy.deepcopy(dict(dataset.source))})
        result.volume_mounts.append(
            {
                "name": dataset.volume_name,
                "mountPath": dataset.mount_path,
                "readOnly": dataset.read_only,
            }
        )
    if selection.interface is not None:
        result.default_url = selection.interface.url
    if flavor is None:
        return result

    count = selection.count
    result.extended_resources = _device_resources(flavor, count)
    result.node_selector = dict(flavor.node_selector)
    result.tolerations = [dict(t) for t in flavor.tolerations]
    result.runtime_class_name = flavor.runtime_class_name
    if flavor.kind == "fraction":
        if flavor.gpu_fraction is not None:
            result.annotations["gpu-fraction"] = str(float(flavor.gpu_fraction))
        else:
            result.annotations["gpu-memory"] = str(flavor.gpu_memory)
    if flavor.kind == "hami" and flavor.scheduler_name:
        result.scheduler_name = flavor.scheduler_name
    if flavor.kind == "dra":
        result.resource_claims = [
            {"name": "gpu", "resourceClaimTemplateName": flavor.claim_template_name(count)}
        ]
    return result


def mount_collisions(datasets: list[Dataset], volumes: Any, volume_mounts: Any) -> list[str]:
    """Where the datasets' mounts would collide with a server's other volumes (the
    chart's home, a profile's override): the same mount path, or the same volume
    name. Kubernetes refuses such a pod; this says which dataset and where."""
    taken_paths = {}
    for mount in kubespawner_items(volume_mounts):
        path = _get_field(mount, "mount_path", "mountPath")
        if path:
            taken_paths[str(path).rstrip("/") or "/"] = _get_field(mount, "name", "name")
    taken_names = {_get_field(v, "name", "name") for v in kubespawner_items(volumes)}
    problems = []
    for dataset in datasets:
        if dataset.mount_path in taken_paths:
            problems.append(
                f"the dataset {dataset.name} would be mounted at {dataset.mount_path}, where "
                f"the volume {taken_paths[dataset.mount_path]!r} already is: give the "
                "dataset another mount_path"
            )
        if dataset.volume_name in taken_names:
            problems.append(
                f"the dataset {dataset.name}'s volume name {dataset.volume_name!r} is "
                "already a volume of the server's pod: rename one of them"
            )
    return problems


def _get_field(node: Any, attribute: str, key: str) -> Any:
    """A field of a KubeSpawner setting's item: a dict in either case, or a model."""
    if isinstance(node, Mapping):
        return node.get(key, node.get(attribute))
    return getattr(node, attribute, None)


def kubespawner_items(value: Any) -> list[Any]:
    """A KubeSpawner list setting as KubeSpawner puts it in the pod.

    KubeSpawner takes most list settings (``tolerations``, ``volumes``,
    ``init_containers``, ...) as a list or as a mapping whose values are the items,
    so that values files can merge them; it uses a mapping's values sorted by key.
    """
    if isinstance(value, Mapping):
        return [value[key] for key in sorted(value)]
    return list(value or [])


def _merge_tolerations(base: Any, extra: list[dict[str, Any]]) -> list[Any]:
    """The chart's tolerations first and unchanged (in KubeSpawner's order), then the
    policy's that are not among them."""
    merged = kubespawner_items(base)
    for toleration in extra:
        if toleration not in merged:
            merged.append(toleration)
    return merged


#: the KubeSpawner settings ``merge_settings`` is given as the chart configured them
MERGED_SETTINGS = (
    "cpu_limit",
    "mem_limit",
    "extra_resource_guarantees",
    "extra_resource_limits",
    "node_selector",
    "tolerations",
)


def merge_settings(current: Mapping[str, Any], pod_shape: PodShape) -> dict[str, Any]:
    """KubeSpawner trait values: the shape on top of what the chart configured.

    Resource amounts and the priority class are the policy's alone (a profile's
    limits are its guarantees unless it sets ``cpu_limit`` / ``memory_limit``; the
    chart's ``singleuser.cpu.limit`` does not widen them); selectors, tolerations,
    labels and extra resources are merged with the chart's.
    """
    settings: dict[str, Any] = {
        "cpu_guarantee": pod_shape.cpu_guarantee,
        "cpu_limit": pod_shape.cpu_limit,
        "mem_guarantee": pod_shape.mem_guarantee,
        "mem_limit": pod_shape.mem_limit,
        "extra_resource_guarantees": {
            **dict(current.get("extra_resource_guarantees") or {}),
            **pod_shape.extended_resources,
        },
        "extra_resource_limits": {
            **dict(current.get("extra_resource_limits") or {}),
            **pod_shape.extended_resources,
        },
        "node_selector": {**dict(current.get("node_selector") or {}), **pod_shape.node_selector},
        "tolerations": _merge_tolerations(current.get("tolerations"), pod_shape.tolerations),
        "priority_class_name": pod_shape.priority_class_name or "",
    }
    if pod_shape.image:
        settings["image"] = pod_shape.image
    if pod_shape.scheduler_name:
        settings["scheduler_name"] = pod_shape.scheduler_name
    if pod_shape.namespace:
        settings["namespace"] = pod_shape.namespace
    if pod_shape.default_url:
        settings["default_url"] = pod_shape.default_url
    return settings


def apply_to_pod(pod: Any, pod_shape: PodShape) -> Any:
    """The final word on a pod: labels, annotations, runtime class, DRA claims.

    ``pod`` is changed in place and returned: KubeSpawner's pod as it built it (its
    client's models, with the admin's own dicts as leaves), or a manifest in dict
    form. Nothing else in it is touched, so what KubeSpawner would send is sent,
    fields the installed client does not know included.
    """
    meta = _child(pod, "metadata", "metadata")
    _put(meta, "labels", "labels", {**(_get(meta, "labels", "labels") or {}), **pod_shape.labels})
    _put(
        meta,
        "annotations",
        "annotations",
        {**(_get(meta, "annotations", "annotations") or {}), **pod_shape.annotations},
    )
    spec = _get(pod, "spec", "spec")
    if pod_shape.runtime_class_name:
        _put(spec, "runtime_class_name", "runtimeClassName", pod_shape.runtime_class_name)
    if pod_shape.volumes:
        volumes = _get(spec, "volumes", "volumes") or []
        _put(spec, "volumes", "volumes", [*volumes, *copy.deepcopy(pod_shape.volumes)])
        container = _get(spec, "containers", "containers")[0]
        mounts = _get(container, "volume_mounts", "volumeMounts") or []
        _put(
            container,
            "volume_mounts",
            "volumeMounts",
            [*mounts, *copy.deepcopy(pod_shape.volume_mounts)],
        )
    claims = pod_shape.resource_claims
    if claims:
        _put(spec, "resource_claims", "resourceClaims", [dict(c) for c in claims])
        container = _get(spec, "containers", "containers")[0]
        resources = _child(container, "resources", "resources")
        _put(resources, "claims", "claims", [{"name": c["name"]} for c in claims])
    return pod


# A pod from KubeSpawner mixes its client's models (snake_case attributes) and plain
# dicts (camelCase keys, the admin's own): these read and write either.
def _get(node: Any, attribute: str, key: str) -> Any:
    return node.get(key) if isinstance(node, Mapping) else getattr(node, attribute)


def _put(node: Any, attribute: str, key: str, value: Any) -> None:
    if isinstance(node, dict):
        node[key] = value
    else:
        setattr(node, attribute, value)


def _child(node: Any, attribute: str, key: str) -> Any:
    """``node``'s ``key`` part, made an empty dict where it is missing."""
    child = _get(node, attribute, key)
    if child is None:
        child = {}
        _put(node, attribute, key, child)
    return child


def of_another_hub(pod: Mapping[str, Any], hub: str | None) -> bool:
    """Whether a server pod is labelled as another hub's than ``hub`` (a pod from
    before hubs were labelled belongs to whoever lists it in its own namespaces)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return hub is not None and labels.get(HUB_LABEL, label_value(hub)) != label_value(hub)


def pod_key(pod: Mapping[str, Any]) -> str:
    """``<namespace>/<name>``: how the ledger and the usage records name a server's pod."""
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


def holds_nothing(pod: Mapping[str, Any]) -> bool:
    """A pod that is done (succeeded, failed) holds nothing.

    A terminating pod still holds what it requested until it is gone: its node keeps
    its devices for it (the scheduler counts it), and a pod held by a finalizer or on
    a node that stopped answering may stay for hours. Charging it until then keeps a
    group from starting servers on GPUs that are not free yet.
    """
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def terminating(pod: Mapping[str, Any]) -> bool:
    """The pod is being deleted (``deletionTimestamp``) but still exists."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def charge_from_pod(pod: Mapping[str, Any]) -> Charge | None:
    """The charge a live server pod carries, or None for a pod that holds nothing.

    ``pod`` is the API's JSON form (camelCase keys). Finished pods hold nothing;
    terminating ones hold their charge until they are gone. Raises ``ValueError``
    for a pod labelled as ours whose charge annotation is missing or unreadable, so
    the caller can say which pod it is.
    """
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if GROUP_LABEL not in labels or holds_nothing(pod):
        return None
    key = pod_key(pod)
    try:
        charge = json.loads((metadata.get("annotations") or {})[CHARGE_ANNOTATION])
        return Charge(
            key=key,
            user=charge["user"],
            group=labels[GROUP_LABEL],
            request=Request.from_json(charge["request"]),
            tier=labels.get(TIER_LABEL, IN_QUOTA),
        )
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"pod {key} has no readable {CHARGE_ANNOTATION} annotation") from e


def usage_record_from_pod(pod: Mapping[str, Any]) -> UsageRecord | None:
    """The GPU usage a server pod records from its start, or None: not ours, holds no
    GPUs, not started yet (no ``status.startTime``), or already finished.

    Its ``last_seen`` is its start; whoever records it sets the sighting.
    Raises ``ValueError`` like ``charge_from_pod`` for an unreadable charge.
    """
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    status = pod.get("status") or {}
    if GROUP_LABEL not in labels or status.get("phase") in ("Succeeded", "Failed"):
        return None
    started_at = status.get("startTime")
    if not started_at or not metadata.get("uid"):
        return None
    charge = charge_from_pod(pod)
    if charge is None or not charge.request.gpus:
        return None
    started = (
        started_at.timestamp()
        if isinstance(started_at, datetime)
        else datetime.fromisoformat(str(started_at).replace("Z", "+00:00")).timestamp()
    )
    return UsageRecord(
        uid=metadata["uid"],
        key=charge.key,
        user=charge.user,
        group=charge.group,
        profile=labels.get(PROFILE_LABEL, ""),
        flavor=labels.get(FLAVOR_LABEL) or None,
        gpus=float(charge.request.gpus),
        started=started,
        last_seen=started,
    )
