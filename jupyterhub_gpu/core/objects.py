"""What every Kubernetes object the policy implies shares, for ``manifests`` and for
each scheduler's own objects (``schedulers``).

Pure: the owner and hub labels every object carries, which groups get objects and in
which namespace, the whole device units a group's amounts allow, and telling objects
apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from .model import Amounts, Flavor, Group, Policy, dns_label
from .quantities import format_bytes, format_cpu

OWNER_LABEL = "app.kubernetes.io/managed-by"
OWNER = "jupyterhub-gpu"
HUB_LABEL = "gpu.jupyterhub.org/hub-namespace"
#: in-quota servers are never preempted by bursting ones; over-quota servers yield
IN_QUOTA_PRIORITY = 1000
OVER_QUOTA_PRIORITY = 100
#: with fair share, over-quota servers of users who used less than their share get a
#: class a little above (``<over-quota class>-<band>``): the scheduler takes the
#: heaviest users' bursts first; "heavy" is the over-quota class itself
BURST_BANDS = {"light": OVER_QUOTA_PRIORITY + 20, "fair": OVER_QUOTA_PRIORITY + 10}
#: the name suffix of each of our PriorityClasses' twin that never preempts (same value,
#: ``preemptionPolicy: Never``): what new servers get while servers started before the
#: policy run, whose pods have priority 0 and would be the scheduler's first victims
NO_PREEMPTION_SUFFIX = "-no-preemption"
#: a scheduler's "unlimited" where it has none (Kueue's nominal quota, Volcano's
#: deserved share): an uncapped resource gets this many units
UNBOUNDED = 1_000_000


def metadata(
    name: str, hub_namespace: str, namespace: str | None = None, **labels: str
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {OWNER_LABEL: OWNER, HUB_LABEL: hub_namespace, **labels}
    return meta


def priority_values(policy: Policy) -> dict[str, int]:
    """The value of each PriorityClass the bundle makes: in quota, over quota (with fair
    share, one per burst band) and each one's twin that never preempts (whether the
    scheduler brings its own classes is ``manifests``' concern)."""
    over = policy.scheduler.over_quota_priority_class
    values = {
        policy.scheduler.in_quota_priority_class: IN_QUOTA_PRIORITY,
        over: OVER_QUOTA_PRIORITY,
    }
    if policy.fair_share is not None:
        values |= {f"{over}-{band}": value for band, value in BURST_BANDS.items()}
    return values | {name + NO_PREEMPTION_SUFFIX: value for name, value in values.items()}


def share_weights(policy: Policy) -> dict[str, int]:
    """Each group's ``share`` as a whole-number weight, in the same ratios (shares 0.5
    and 1.5 are weights 1 and 3): what Volcano's and KAI's queues and Kueue's fair
    sharing weigh siblings by. Without shares set every weight is 1."""
    groups = all_groups(policy)
    shares = {g.name: Fraction(str(g.share)).limit_denominator(1000) for g in groups}
    scale = math.lcm(*(s.denominator for s in shares.values())) if shares else 1
    weights = {name: int(share * scale) for name, share in shares.items()}
    divisor = math.gcd(*weights.values()) if weights else 1
    return {name: max(1, w // divisor) for name, w in weights.items()}


def namespace_for(policy: Policy, group: str) -> str | None:
    """The namespace a group's servers run in; None: the hub's (no namespace per group)."""
    if not policy.namespace_per_group:
        return None
    return dns_label(f"{policy.namespace_prefix}{group}")


def all_groups(policy: Policy) -> list[Group]:
    """Every group servers can be charged to: the configured groups, and ``everyone``
    when it offers a profile (a group of the policy gets its objects even without
    profiles: it may be a parent, and its namespace and queue show where it stands)."""
    everyone = [policy.everyone] if policy.everyone.profiles else []
    return [*policy.groups.values(), *everyone]


def queue_name(group: Group) -> str:
    """The queue object a group's pods are labelled with (see shaping.shape)."""
    return dns_label(group.queue)


def number(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)


def reachable(policy: Policy, group: Group) -> dict[str, set[int]]:
    """Flavor name -> the device counts the group's profiles can ask for."""
    reach: dict[str, set[int]] = {}
    for name in group.profiles:
        profile = policy.profiles[name]
        if profile.gpu is None:
            continue
        flavors = {profile.gpu.flavor}
        counts = {profile.gpu.count}
        if "flavor" in profile.options:
            flavors |= {v for _, v in profile.options["flavor"].choices}
        if "gpus" in profile.options:
            counts |= {v for _, v in profile.options["gpus"].choices}
        for flavor in flavors:
            reach.setdefault(flavor, set()).update(counts)
    return reach


def reachable_within(policy: Policy, group: Group) -> dict[str, set[int]]:
    """``reachable`` of the group and every group below it: a parent's quota is its
    children's too (a parent without profiles of its own still lends them its GPUs)."""
    subtrees = policy.offer_cache.get("reachable_within")
    if subtrees is None:
        # once per policy: each group's reach added to itself and each of its parents
        subtrees = {}
        for member in policy.groups.values():
            for flavor, counts in reachable(policy, member).items():
                for owner in policy.charged_groups(member.name):
                    subtrees.setdefault(owner, {}).setdefault(flavor, set()).update(counts)
        policy.offer_cache["reachable_within"] = subtrees
    if group.name in policy.groups:
        return subtrees.get(group.name, {})
    return reachable(policy, group)  # everyone: no children


def _units(flavor: Flavor, amounts: Amounts) -> int | None:
    """Whole units of the flavor's resource that ``amounts`` allows; None: uncapped."""
    caps = []
    if amounts.gpus is not None:
        caps.append(math.floor(Fraction(amounts.gpus) / flavor.unit_equivalents))
    if flavor.name in amounts.flavors:
        caps.append(amounts.flavors[flavor.name])
    return min(caps) if caps else None


def device_caps(policy: Policy, group: Group, amounts: Amounts) -> dict[str, int | None]:
    """Resource name -> whole units ``amounts`` allows the group (None: uncapped).

    Every device resource of the policy is listed: one the profiles of the group and
    its descendants never reach gets 0. Where several flavors share a resource the
    loosest cap counts (this is a backstop; the hub's admission charges each flavor
    exactly).
    """
    reach = reachable_within(policy, group)
    caps: dict[str, int | None] = {}
    for flavor in policy.flavors.values():
        units = _units(flavor, amounts) if flavor.name in reach else 0
        for resource in counted_in(policy, flavor):
            if resource not in caps:
                caps[resource] = units
            elif caps[resource] is not None:
                caps[resource] = None if units is None else max(caps[resource] or 0, units)
    return caps


def device_resource(flavor: Flavor) -> str | None:
    """The quota resource a unit of this flavor is counted in, or None (KAI fractions)."""
    if flavor.kind == "fraction":
        return None
    if flavor.kind == "dra":
        return device_class_resource(flavor.device_class or "")
    return flavor.resource


def counted_in(policy: Policy, flavor: Flavor) -> list[str]:
    """Every quota resource a unit of this flavor counts in: its own, and where a
    DeviceClass serves its extended resource (a bridged ``gpu`` flavor of the policy
    names the class) also that class's devices, whether this flavor names the class
    or not: the class serves every pod asking for the resource on a node without it,
    through a ResourceClaim kube-scheduler makes for the pod, which a ResourceQuota
    counts as any claim of the class; and Kueue, once its Configuration maps the
    class, counts every request of the resource under the class's mapped name."""
    own = device_resource(flavor)
    found = [own] if own else []
    if own is not None and flavor.kind != "dra":
        found += [device_class_resource(c) for c in serving_classes(policy, own)]
    return found


def serving_classes(policy: Policy, resource: str) -> list[str]:
    """The DeviceClasses the policy's bridged flavors say serve ``resource``."""
    return sorted(
        {
            f.device_class
            for f in policy.flavors.values()
            if f.bridged and f.resource == resource and f.device_class
        }
    )


def device_class_resource(device_class: str) -> str:
    """The quota resource of a DeviceClass's devices: what a ResourceQuota counts claims
    in, and the name Kueue's ``deviceClassMappings`` give it here."""
    return f"{device_class}.deviceclass.resource.k8s.io/devices"


def resource_list(policy: Policy, group: Group, amounts: Amounts) -> dict[str, str]:
    """``amounts`` as a Kubernetes resource list: CPU, memory and the devices counted
    by resource name (DRA devices are not)."""
    resources: dict[str, str] = {}
    if amounts.cpu is not None:
        resources["cpu"] = format_cpu(amounts.cpu)
    if amounts.memory is not None:
        resources["memory"] = format_bytes(amounts.memory)
    for resource, units in sorted(device_caps(policy, group, amounts).items()):
        if units is not None and not resource.endswith("resource.k8s.io/devices"):
            resources[resource] = str(units)
    return resources


def unique(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first object of each identity (groups sharing a queue share its object)."""
    seen: set[tuple[str, str, str | None, str]] = set()
    result = []
    for obj in objects:
        key = identity(obj)
        if key not in seen:
            seen.add(key)
            result.append(obj)
    return result


def identity(obj: Mapping[str, Any]) -> tuple[str, str, str | None, str]:
    """(apiVersion, kind, namespace, name): what tells two objects apart."""
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
