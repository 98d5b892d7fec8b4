"""Servers started before the policy: what they hold, and which group is charged.

A hub switched to ``GPUKubeSpawner`` keeps the servers stock KubeSpawner started:
their pods carry none of the policy's labels, yet they hold GPUs, CPU and memory.
``adopt`` reads what such a pod requests and charges it by one documented rule,
so quotas count it from the hub's first minute:

1. the flavor is the one whose device resource the pod requests (where flavors
   share a resource, the one whose node selector the pod's matches, else the
   first by name); a GPU resource no flavor names leaves the pod uncharged;
2. the group is the only one of the user's groups that offers that flavor (for a
   pod without GPUs: the only one that offers a profile without GPUs);
3. otherwise the policy's ``adopted_servers_group``; otherwise no group: the pod
   is reported, and counts only where the scheduler counts it (the cluster's free
   capacity).

Pure: the caller lists the pods and knows the users' groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .admission import IN_QUOTA, Charge
from .capacity import pod_requests
from .model import Flavor, Policy
from .selection import SHARED_KINDS, Request, offers
from .shaping import GROUP_LABEL, holds_nothing, pod_key

#: KubeSpawner's label on every server pod (its value is ``KubeSpawner.component_label``)
#: and its annotation with the user's name
COMPONENT_LABEL = "component"
DEFAULT_COMPONENT = "singleuser-server"
USERNAME_ANNOTATION = "hub.jupyter.org/username"


def servers_selector(component: str = DEFAULT_COMPONENT, *, unlabelled: bool = False) -> str:
    """The label selector of a hub's server pods, as KubeSpawner's own watch selects
    them; ``unlabelled``: only those with none of the policy's labels."""
    selector = f"{COMPONENT_LABEL}={component}"
    return f"{selector},!{GROUP_LABEL}" if unlabelled else selector


#: extended resources that are GPUs whatever the policy's flavors say
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/gpu", "gpu.intel.com/")


@dataclass(frozen=True)
class Adoption:
    """A server pod from before the policy, and the group it is charged to."""

    key: str  # namespace/name
    user: str
    request: Request
    flavor: str | None
    group: str | None  # None: charged to no group (``why`` says why)
    why: str

    @property
    def charge(self) -> Charge | None:
        if self.group is None:
            return None
        return Charge(
            key=self.key, user=self.user, group=self.group, request=self.request, tier=IN_QUOTA
        )


def username_of(pod: Mapping[str, Any]) -> str:
    """The hub user a server pod belongs to, as KubeSpawner records it."""
    metadata = pod.get("metadata") or {}
    return (metadata.get("annotations") or {}).get(USERNAME_ANNOTATION) or (
        metadata.get("labels") or {}
    ).get("hub.jupyter.org/username", "")


def is_gpu_resource(policy: Policy, name: str) -> bool:
    named = {f.resource for f in policy.flavors.values() if f.resource}
    return name in named or name.startswith(GPU_RESOURCE_PREFIXES)


def _flavor_for(policy: Policy, pod: Mapping[str, Any], resource: str) -> Flavor | None:
    candidates = sorted(
        (f for f in policy.flavors.values() if f.resource == resource and f.kind != "fraction"),
        key=lambda f: f.name,
    )
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    matching = [f for f in candidates if f.node_selector.items() <= selector.items()]
    return (matching or candidates or [None])[0]


def _groups_offering(
    policy: Policy, user_groups: Iterable[str], flavor: Flavor | None
) -> list[str]:
    found: list[str] = []
    for offer in offers(policy, user_groups):
        gpu = offer.profile.gpu
        if flavor is None:
            fits = gpu is None
        else:
            choices = offer.options.get("flavor")
            names = {v for _, v in choices.choices} if choices else set()
            fits = gpu is not None and flavor.name in {gpu.flavor, *names}
        if fits and offer.group.name not in found:
            found.append(offer.group.name)
    return found


def adopt(
    policy: Policy,
    pod: Mapping[str, Any],
    user_groups: Iterable[str],
    component: str = DEFAULT_COMPONENT,
) -> Adoption | None:
    """How the policy charges ``pod`` (the API's JSON form), or None when there is
    nothing to adopt: a pod of the policy's own, not a server, or done (a terminating
    pod still holds its GPUs until it is gone)."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if GROUP_LABEL in labels or labels.get(COMPONENT_LABEL) != component or holds_nothing(pod):
        return None
    key = pod_key(pod)
    user = username_of(pod)
    requested = pod_requests(pod)
    cpu = int(requested.pop("cpu", 0) * 1000)
    memory = int(requested.pop("memory", 0))

    def charged(request: Request, flavor: Flavor | None, group: str | None, why: str):
        return Adoption(key, user, request, flavor.name if flavor else None, group, why)

    gpus = {name: int(n) for name, n in requested.items() if n and is_gpu_resource(policy, name)}
    flavor = None
    request = Request(cpu=cpu, memory=memory)
    if len(gpus) > 1:
        return charged(
            request, None, None, f"it requests several GPU resources ({', '.join(sorted(gpus))})"
        )
    if gpus:
        resource, count = next(iter(gpus.items()))
        flavor = _flavor_for(policy, pod, resource)
        if flavor is None:
            return charged(
                request, None, None, f"it requests {resource}, which no flavor of the policy names"
            )
        units = 1 if flavor.kind in SHARED_KINDS else count
        request = Request(
            gpus=flavor.unit_equivalents * units,
            cpu=cpu,
            memory=memory,
            devices=((flavor.name, units),),
        )
    what = f"flavor {flavor.name}" if flavor else "a profile without GPUs"
    groups = _groups_offering(policy, user_groups, flavor)
    if len(groups) == 1:
        return charged(
            request, flavor, groups[0], f"the only one of {user}'s groups that offers {what}"
        )
    reason = (
        f"{len(groups)} of {user}'s groups offer {what} ({', '.join(groups)})"
        if groups
        else f"none of {user}'s groups offers {what}"
    )
    fallback = policy.adopted_servers_group
    if fallback is not None:
        return charged(request, flavor, fallback, f"{reason}: GPUPolicy.adopted_servers_group")
    return charged(request, flavor, None, reason)
