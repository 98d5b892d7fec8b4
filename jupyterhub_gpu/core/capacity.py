"""Cluster capacity per flavor: node allocatable minus what scheduled pods request.

``flavor_capacity(policy, nodes, pods)`` takes nodes and pods in the API's JSON
form (camelCase keys, as ``list_node(_preload_content=False)`` or a watch gives
them) and returns one ``FlavorCapacity`` per flavor of the policy::

    capacity = flavor_capacity(policy, nodes, pods)
    capacity["h200"].free        # 5 (devices), or None when it cannot be known
    capacity["h200"].free_gpus   # the same in GPU-equivalents

A node serves a flavor when it advertises the flavor's resource, matches the
flavor's ``node_selector``, is schedulable (not cordoned, not NotReady) and
every ``NoSchedule`` / ``NoExecute`` taint on it is tolerated by the flavor's
tolerations. A pod counts against a node when it is bound to it
(``spec.nodeName``) and not finished (phase ``Succeeded`` / ``Failed``); a
terminating pod still holds its devices until it is gone, so it counts.

What "capacity" means per kind (honest about what node allocatable can tell):

- ``gpu``, ``mig``, ``timeslice``, ``mps``: units of the flavor's own extended
  resource (whole devices, MIG slices of that profile, shared replicas).
- ``hami``: units of ``nvidia.com/gpu`` as HAMi's device plugin advertises them
  (virtual GPUs, ``deviceSplitCount`` per device); device memory and cores,
  which may run out first, are not visible in allocatable and not counted.
- ``fraction`` (KAI): whole ``nvidia.com/gpu`` devices on matching nodes that
  no pod requests. KAI places fractional pods through reservation pods that
  request a whole device, so a device shared by fractions counts as allocated;
  ``free`` is the number of devices a new fraction could open, not the room
  left on devices already shared.
- ``dra``: devices published in ResourceSlices that the flavor's DeviceClass
  and selectors accept, on nodes a pod of the flavor could land on, minus those
  ResourceClaims hold (see ``core.dra``, which says what subset of CEL is
  evaluated). Without the DRA objects (``dra=None``), or for a selector outside
  that subset, ``allocatable``, ``allocated`` and ``free`` are ``None`` (unknown)
  and ``note`` says why.

Through the extended-resource bridge, a DRA driver serves a ``gpu`` or ``mig``
flavor's resource on nodes that do not advertise it: the devices of the
DeviceClasses that map the resource (``core.dra.bridged_count``) on nodes the
flavor may land on count beside the device plugins' units, as kube-scheduler
would use them, whatever the flavor says. A flavor that names its ``device_class``
(a bridged flavor) is unknown while the DRA objects are, and says so when no
DeviceClass maps its resource.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .dra import DraCount, DraInventory, bridged_count, dra_count
from .model import Flavor, Policy
from .quantities import QuantityError, parse_quantity

_FINISHED = ("Succeeded", "Failed")
_UNITS = {
    "gpu": "GPUs",
    "mig": "MIG slices",
    "timeslice": "shared GPUs",
    "mps": "shared GPUs",
    "hami": "vGPUs",
    "fraction": "GPUs",
    "dra": "devices",
}


@dataclass(frozen=True)
class FlavorCapacity:
    """One flavor's capacity in its own units (see ``unit``); ``None``: unknown."""

    flavor: str
    resource: str | None  # the extended resource counted, None for DRA
    unit: str  # what one unit is, for people: "GPUs", "MIG slices", ...
    unit_equivalents: Fraction  # GPU-equivalents of one unit (fraction flavors: 1, a device)
    allocatable: int | None
    allocated: int | None
    nodes: int  # nodes that serve this flavor
    note: str = ""

    @property
    def one_unit(self) -> str:
        """The unit of one: "GPU", "MIG slice", "device"."""
        return self.unit.removesuffix("s")

    @property
    def free(self) -> int | None:
        if self.allocatable is None or self.allocated is None:
            return None
        return max(self.allocatable - self.allocated, 0)

    @property
    def free_gpus(self) -> Fraction | None:
        """Free capacity in GPU-equivalents (for fractions: free whole devices)."""
        free = self.free
        if free is None:
            return None
        return free * self.unit_equivalents


def _whole(value: Any) -> int:
    try:
        quantity = parse_quantity(value)
    except QuantityError:
        return 0
    return quantity.numerator // quantity.denominator


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """A pod's effective requests, as the scheduler counts them.

    The larger of the sum over containers and the largest init container, per
    resource, plus ``spec.overhead``; a container that sets only a limit
    requests its limit (Kubernetes defaults requests to limits).
    """
    spec = pod.get("spec") or {}

    def container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        result = {}
        for name, value in merged.items():
            try:
                result[name] = parse_quantity(value)
            except QuantityError:
                continue
        return result

    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        for name, amount in container_requests(container).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in container_requests(container).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    for name, value in (spec.get("overhead") or {}).items():
        try:
            total[name] = total.get(name, Fraction(0)) + parse_quantity(value)
        except QuantityError:
            continue
    return total


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator", "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_is_usable(node: Mapping[str, Any]) -> bool:
    """Schedulable: not cordoned, and Ready unless it reports no conditions."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return True


def node_serves(flavor: Flavor, node: Mapping[str, Any]) -> bool:
    """Whether a pod of this flavor could be placed on this node at all."""
    resource = flavor.node_resource
    if resource is None:
        return False
    if _whole(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)) <= 0:
        return False
    return node_admits(flavor, node)


def node_admits(flavor: Flavor, node: Mapping[str, Any]) -> bool:
    """Whether a pod of this flavor may land on this node, whatever it advertises:
    usable, selected by the flavor's ``node_selector``, its taints tolerated."""
    if not node_is_usable(node):
        return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in flavor.node_selector.items()):
        return False
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            flavor.tolerations, taint
        ):
            return False
    return True


def allocated_per_node(
    pods: Iterable[Mapping[str, Any]], resources: set[str]
) -> dict[str, dict[str, Fraction]]:
    """node name -> resource -> amount requested by bound, unfinished pods."""
    per_node: dict[str, dict[str, Fraction]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in _FINISHED:
            continue
        requests = pod_requests(pod)
        for name in resources.intersection(requests):
            usage = per_node.setdefault(node, {})
            usage[name] = usage.get(name, Fraction(0)) + requests[name]
    return per_node


#: kinds whose one unit is one device, which a DRA driver can serve through the bridge
_BRIDGEABLE = ("gpu", "mig")


def _advertises(node: Mapping[str, Any], resource: str) -> bool:
    return _whole(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)) > 0


def _bridged(
    flavor: Flavor,
    resource: str,
    by_name: Mapping[str, Mapping[str, Any]],
    dra: DraInventory | None,
) -> DraCount | None:
    """The DRA devices a pod of ``flavor`` could get through the extended-resource
    bridge (None: none do); for a flavor that names its ``device_class``, a count
    with ``allocatable`` None and a note when that cannot be known."""
    declared = flavor.device_class
    if dra is None or dra.problem is not None:
        if declared is None:
            return None  # served by device plugins, as far as can be told
        why = dra.problem if dra is not None else "not read here"
        return DraCount(None, None, 0, f"DRA devices unknown: {why}")

    def node_ok(node: str) -> bool:
        found = by_name.get(node)
        return found is not None and not _advertises(found, resource) and node_admits(flavor, found)

    count = bridged_count(resource, dra, node_ok)
    if count is None and declared is not None:
        return DraCount(
            0,
            0,
            0,
            f"no DeviceClass maps {resource} (extendedResourceName), so no DRA device "
            f"serves it: is {declared}'s extendedResourceName set?",
        )
    return count


def counted_resources(policy: Policy) -> set[str]:
    """Every node resource the policy's flavors are counted in."""
    return {r for f in policy.flavors.values() if (r := f.node_resource)}


def flavor_capacity(
    policy: Policy,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    allocated: Mapping[str, Mapping[str, Fraction]] | None = None,
    dra: DraInventory | None = None,
) -> dict[str, FlavorCapacity]:
    """Capacity of every flavor of ``policy``, keyed by flavor name (see the module doc).

    ``allocated`` (node -> resource -> amount, as ``allocated_per_node`` gives)
    replaces ``pods`` for a caller that keeps it up to date event by event.
    ``dra``: the cluster's ResourceSlices, DeviceClasses and ResourceClaims, for
    the dra flavors (None: their capacity is unknown).
    """
    nodes = list(nodes)
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    if allocated is None:
        allocated = allocated_per_node(pods, counted_resources(policy))
    result = {}
    for name, flavor in policy.flavors.items():
        resource = flavor.node_resource
        unit = _UNITS[flavor.kind]
        if resource is None:
            if dra is None:
                count = None
                note = "DRA devices are published in ResourceSlices, not read here"
            else:
                count = dra_count(
                    flavor.device_class,
                    flavor.selectors,
                    dra,
                    lambda node, f=flavor: node in by_name and node_admits(f, by_name[node]),
                )
                note = count.note
            result[name] = FlavorCapacity(
                flavor=name,
                resource=None,
                unit=unit,
                unit_equivalents=flavor.unit_equivalents,
                allocatable=count.allocatable if count else None,
                allocated=count.allocated if count else None,
                nodes=count.nodes if count else 0,
                note=note,
            )
            continue
        total = used = serving = 0
        for node in nodes:
            if not node_serves(flavor, node):
                continue
            serving += 1
            node_total = _whole(node["status"]["allocatable"][resource])
            node_name = (node.get("metadata") or {}).get("name", "")
            in_use = allocated.get(node_name, {}).get(resource, Fraction(0))
            total += node_total
            used += min(-(-in_use.numerator // in_use.denominator), node_total)
        note = ""
        if flavor.kind in _BRIDGEABLE:
            bridged = _bridged(flavor, resource, by_name, dra)
            if bridged is not None and bridged.allocatable is None:
                result[name] = FlavorCapacity(
                    flavor=name,
                    resource=resource,
                    unit=unit,
                    unit_equivalents=flavor.unit_equivalents,
                    allocatable=None,
                    allocated=None,
                    nodes=serving,
                    note=bridged.note,
                )
                continue
            if bridged is not None:
                total += bridged.allocatable or 0
                used += bridged.allocated or 0
                serving += bridged.nodes
                note = (
                    f"{bridged.allocatable} of them {bridged.note}"
                    if bridged.allocatable
                    else bridged.note
                )
        if flavor.kind == "fraction":
            note = "whole devices no pod holds; devices already shared by fractions count as used"
        elif flavor.kind == "hami":
            note = "virtual GPUs; device memory and cores are not counted"
        result[name] = FlavorCapacity(
            flavor=name,
            resource=resource,
            unit=unit,
            unit_equivalents=Fraction(1) if flavor.kind == "fraction" else flavor.unit_equivalents,
            allocatable=total,
            allocated=used,
            nodes=serving,
            note=note,
        )
    return result
