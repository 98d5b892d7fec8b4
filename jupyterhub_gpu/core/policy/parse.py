"""``parse_policy``: the whole policy read through its keys (``keys``), each section by
its parser (``sections``), then what only the whole says: parents that exist and make
no cycle, namespaces no two groups share, datasets no two of a server's share a path.

It returns the frozen model (``types``) or raises ``PolicyError`` listing *every*
problem, each with its full key path and what to write instead::

    hub.config.GPUPolicy.groups.students.quota.gpus: expected a number, got 'ten'

Unknown keys, dangling references, cycles and impossible numbers are errors, never
silently ignored. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .keys import EGRESS, FAIR_SHARE, SCHEDULER
from .schema import PREFIX, Errors, Reader
from .sections import (
    parse_dataset,
    parse_flavor,
    parse_group,
    parse_interfaces,
    parse_profile,
)
from .settings import SETTINGS
from .types import (
    Dataset,
    Egress,
    FairShare,
    Flavor,
    Group,
    Interface,
    Policy,
    PolicyError,
    Profile,
    Scheduler,
    dns_label,
    is_system_namespace,
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def parse_policy(*, prefix: str = PREFIX, **settings: Any) -> Policy:
    """Check every part of a policy; return the model or raise PolicyError with all problems.

    ``settings``: ``GPUPolicy``'s, by name (``keys.SETTINGS``), as YAML gives them; one
    not given has its default. ``prefix``: the key path the errors start with."""
    for name in settings:
        if name not in SETTINGS.names:
            raise TypeError(f"parse_policy() got an unexpected keyword argument {name!r}")
    e = Errors(prefix)
    r = Reader(e, "", settings, SETTINGS, check_unknown=False)
    sched = parse_scheduler(e, r["scheduler"])
    interfaces, datasets, flavors = r["interfaces"], r["datasets"], r["flavors"]
    parsed_interfaces = parse_interfaces(e, interfaces)
    known_interfaces = {
        **{str(n): None for n in e.mapping("interfaces", interfaces)},
        **parsed_interfaces,
    }
    parsed_datasets = {}
    for name, raw in e.mapping("datasets", datasets).items():
        dataset = parse_dataset(e, str(name), raw)
        if dataset:
            parsed_datasets[str(name)] = dataset
    known_datasets = {**{str(n): None for n in e.mapping("datasets", datasets)}, **parsed_datasets}
    parsed_flavors = {}
    for name, raw in e.mapping("flavors", flavors).items():
        flavor = parse_flavor(e, str(name), raw, sched.name)
        if flavor:
            parsed_flavors[str(name)] = flavor
    # references to flavors that failed to parse are reported where they are defined
    known_flavors = {str(n): parsed_flavors.get(str(n)) for n in e.mapping("flavors", flavors)}
    parsed_profiles = {}
    for name, raw in e.mapping("profiles", r["profiles"]).items():
        profile = parse_profile(
            e, str(name), raw, {k: v for k, v in known_flavors.items() if v}, known_interfaces
        )
        if profile:
            parsed_profiles[str(name)] = profile
    every = parse_group(
        e,
        "everyone",
        "everyone",
        r["everyone"],
        parsed_profiles,
        parsed_flavors,
        known_interfaces,
        known_datasets,
    )
    parsed_groups = {}
    for name, raw in e.mapping("groups", r["groups"]).items():
        if name == "everyone":
            e.add("groups.everyone", "'everyone' is the top-level everyone: key, not a group")
            continue
        parsed_groups[str(name)] = parse_group(
            e,
            f"groups.{name}",
            str(name),
            raw,
            parsed_profiles,
            parsed_flavors,
            known_interfaces,
            known_datasets,
        )
    _check_parents(e, parsed_groups)
    when_full = r["when_full"]
    namespace_per_group = r["namespace_per_group"]
    namespace_prefix = str(r["namespace_prefix"])
    if namespace_per_group:
        _check_namespaces(e, namespace_prefix, [*parsed_groups, "everyone"])
    adopted = _parse_adopt_namespaces(
        e, r["adopt_namespaces"], namespace_per_group, namespace_prefix, parsed_groups
    )
    parsed_egress = parse_egress(e, r["egress"], namespace_per_group)
    labels = r["extra_labels"]
    adopted_servers_group = r["adopted_servers_group"]
    if adopted_servers_group is not None and adopted_servers_group not in (
        *parsed_groups,
        "everyone",
    ):
        known = ", ".join([*parsed_groups, "everyone"])
        e.add(
            "adopted_servers_group",
            f"expected one of the policy's groups ({known}), got {adopted_servers_group!r}",
        )
    adopted_servers_preemptible = r["adopted_servers_preemptible"]
    parsed_fair_share = parse_fair_share(e, r["fair_share"])
    currency = r["currency"]
    _check_prices(e, currency, parsed_flavors)
    _check_dataset_mounts(e, parsed_groups, every, parsed_datasets)
    _check_interfaces(e, parsed_interfaces, parsed_profiles, [*parsed_groups.values(), every])
    if e.items:
        raise PolicyError(e.items)
    return Policy(
        scheduler=sched,
        flavors=parsed_flavors,
        profiles=parsed_profiles,
        everyone=every,
        groups=parsed_groups,
        when_full=when_full,
        namespace_per_group=namespace_per_group,
        namespace_prefix=namespace_prefix,
        extra_labels=labels,
        adopted_servers_group=adopted_servers_group,
        adopted_servers_preemptible=adopted_servers_preemptible,
        fair_share=parsed_fair_share,
        interfaces=parsed_interfaces,
        datasets=parsed_datasets,
        adopt_namespaces=adopted,
        egress=parsed_egress,
        currency=currency,
    )


def _check_prices(e: Errors, currency: str | None, flavors: Mapping[str, Flavor]) -> None:
    """Prices need their currency, and once one flavor has a price every flavor needs
    one: an hour without a price would cost nothing on the invoice."""
    priced = [n for n, f in flavors.items() if f.billing and f.billing[0].price is not None]
    if priced and currency is None:
        e.add(
            f"flavors.{priced[0]}.billing.price",
            "a price needs its currency: set GPUPolicy.currency (e.g. EUR)",
        )
    for name in flavors if priced else ():
        if name not in priced:
            e.add(
                f"flavors.{name}.billing",
                f"every flavor needs a price once one has ({priced[0]} has): add "
                "billing: {price: ...}",
            )


_SCHEDULER_DEFAULTS = {
    # KAI's own priority classes: interactive "build" is never preempted,
    # "build-preemptible" may be when its queue is over quota
    "kai": ("build", "build-preemptible"),
}


def parse_scheduler(e: Errors, raw: Any) -> Scheduler:
    if isinstance(raw, str):
        raw = {"name": raw}
    r = Reader(e, "scheduler", raw, SCHEDULER)
    name = r["name"]
    base = Scheduler()
    in_quota, over_quota = _SCHEDULER_DEFAULTS.get(
        name, (base.in_quota_priority_class, base.over_quota_priority_class)
    )
    return Scheduler(
        name=name,
        in_quota_priority_class=r["in_quota_priority_class"] or in_quota,
        over_quota_priority_class=r["over_quota_priority_class"] or over_quota,
    )


def parse_fair_share(e: Errors, raw: Any) -> FairShare | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw:
        e.add(
            "fair_share",
            f"expected a mapping like {{half_life: 7d, max_wait: 30m}}, got {raw!r}",
        )
        return None
    r = Reader(e, "fair_share", raw, FAIR_SHARE)
    r.require("half_life")
    half_life, max_wait = r["half_life"], r["max_wait"]
    if half_life is None:
        return None
    return FairShare(half_life=half_life, max_wait=max_wait, count=r["count"])


def parse_egress(e: Errors, raw: Any, per_group: bool) -> Egress | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        e.add(
            "egress",
            f"expected a mapping like {{deny_private: true, allow_cidrs: [198.51.100.0/24]}}, "
            f"got {raw!r}",
        )
        return None
    r = Reader(e, "egress", raw, EGRESS)
    deny_private, allow_public = r["deny_private"], r["allow_public"]
    allow_dataset_servers = r["allow_dataset_servers"]
    allow, deny = r["allow_cidrs"], r["deny_cidrs"]
    if not per_group:
        e.add(
            "egress",
            "applies to group namespaces, and there are none without namespace_per_group: "
            "turn namespace_per_group on (servers in the hub's namespace are z2jh's "
            "singleuser.networkPolicy's to restrict)",
        )
    if deny and not allow_public:
        e.add(
            "egress.deny_cidrs",
            "has no effect with allow_public: false, which denies every address not "
            "allowed: remove deny_cidrs, or allow_public",
        )
    if not deny_private and allow_public and not deny:
        e.add(
            "egress",
            "denies nothing (deny_private: false, allow_public: true and no deny_cidrs): "
            "set deny_private: true, list deny_cidrs, or remove egress",
        )
    return Egress(
        deny_private=deny_private,
        allow_public=allow_public,
        allow_cidrs=allow,
        deny_cidrs=deny,
        allow_dataset_servers=allow_dataset_servers,
    )


def _check_interfaces(
    e: Errors,
    interfaces: Mapping[str, Interface],
    profiles: Mapping[str, Profile],
    groups: list[Group],
) -> None:
    """Every profile a group offers must open something there."""
    if not interfaces:
        return
    for group in groups:
        for name in group.profiles:
            profile = profiles[name]
            if group.interfaces is None or profile.interfaces is None:
                continue
            if not set(group.interfaces) & set(profile.interfaces):
                path = "everyone" if group.name == "everyone" else f"groups.{group.name}"
                e.add(
                    f"{path}.interfaces",
                    f"profile {name} opens {', '.join(profile.interfaces)} only, which "
                    f"the group does not offer ({', '.join(group.interfaces)})",
                )


def _check_namespaces(e: Errors, prefix: str, groups: list[str]) -> None:
    """Each group gets a namespace of its own: no two may map to the same valid name,
    and none may be one of Kubernetes' own."""
    if prefix and not _DNS_LABEL.match(prefix.rstrip("-") or "x"):
        e.add("namespace_prefix", f"{prefix!r} cannot start a namespace name: use e.g. 'jh-'")
        return
    if dns_label(f"{prefix}x").startswith("kube-"):
        e.add(
            "namespace_prefix",
            f"{prefix!r} makes every group's namespace a kube-* name, which Kubernetes "
            "reserves for its own namespaces: use e.g. 'jh-'",
        )
        return
    taken: dict[str, str] = {}
    for name in groups:
        namespace = dns_label(f"{prefix}{name}")
        where = "everyone" if name == "everyone" else f"groups.{name}"
        if not namespace:
            e.add(where, "with namespace_per_group this name gives no valid namespace name")
        elif is_system_namespace(namespace):
            e.add(
                where,
                f"with namespace_per_group its namespace would be {namespace!r}, one of "
                "Kubernetes' own, where the GPU service's quota, network policy and "
                "ownership labels would take over the cluster's services: set "
                "namespace_prefix (e.g. 'jh-') or rename the group",
            )
        elif namespace in taken:
            e.add(
                where,
                f"with namespace_per_group its namespace {namespace!r} is also "
                f"{taken[namespace]}'s: rename one of the groups",
            )
        else:
            taken[namespace] = name


def hub_namespace_errors(policy: Policy, hub_namespace: str, prefix: str = PREFIX) -> list[str]:
    """A group whose namespace would be the hub's own, each as a policy error.

    Known only where the hub's namespace is (the hub's and the service's start-up,
    ``jupyterhub-gpu manifests --hub-namespace``): the hub, the proxy and servers
    from before the policy run there, and a group's quota and network policy would
    fall on them."""
    if not policy.namespace_per_group:
        return []
    errors = []
    for group in [*policy.groups.values(), policy.everyone]:
        if group is policy.everyone and not group.profiles:
            continue  # no profile, no namespace
        namespace = dns_label(f"{policy.namespace_prefix}{group.name}")
        if namespace == hub_namespace:
            where = "everyone" if group is policy.everyone else f"groups.{group.name}"
            errors.append(
                f"{prefix}.{where}: with namespace_per_group its namespace {namespace!r} "
                "is the hub's own, where the hub, the proxy and servers from before the "
                "policy run: set namespace_prefix (e.g. 'jh-') or rename the group"
            )
    return errors


def _parse_adopt_namespaces(
    e: Errors, raw: Any, per_group: bool, prefix: str, groups: Mapping[str, Group]
) -> tuple[str, ...]:
    """Existing namespaces the admin lets the reconciler take over: only the policy's
    own group namespaces, each named once."""
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, list | tuple):
        e.add("adopt_namespaces", f"expected a list of namespace names, got {raw!r}")
        return ()
    if raw and not per_group:
        e.add(
            "adopt_namespaces",
            "only group namespaces are ever adopted, and there are none without "
            "namespace_per_group: turn namespace_per_group on, or remove adopt_namespaces",
        )
        return ()
    ours = {dns_label(f"{prefix}{g}"): g for g in [*groups, "everyone"]}
    adopted: list[str] = []
    for i, name in enumerate(raw):
        where = f"adopt_namespaces[{i}]"
        if not isinstance(name, str) or not name:
            e.add(where, f"expected a namespace name, got {name!r}")
        elif name not in ours:
            listed = ", ".join(sorted(ours)) or "none"
            e.add(
                where,
                f"{name!r} is not a group namespace of this policy, and no other namespace "
                f"is ever adopted: name one of {listed}, or remove it",
            )
        elif name in adopted:
            e.add(where, f"{name!r} is listed twice")
        else:
            adopted.append(name)
    return tuple(adopted)


def _check_dataset_mounts(
    e: Errors, policy_groups: Mapping[str, Group], every: Group, datasets: Mapping[str, Dataset]
) -> None:
    """Two datasets one server mounts may not share a mount path."""
    for group in [*policy_groups.values(), every]:
        chain = []
        current: Group | None = group
        while current is not None:
            chain.append(current)
            current = policy_groups.get(current.parent) if current.parent else None
            if len(chain) > len(policy_groups) + 1:
                return  # a parent cycle, reported on its own
        seen: dict[str, str] = {}
        path = "everyone" if group is every else f"groups.{group.name}"
        for name in [d for g in reversed(chain) for d in g.datasets]:
            dataset = datasets.get(name)
            if dataset is None:
                continue
            other = seen.setdefault(dataset.mount_path, name)
            if other != name:
                e.add(
                    f"{path}.datasets",
                    f"datasets {other} and {name} are both mounted at {dataset.mount_path}",
                )


def _check_parents(e: Errors, groups: Mapping[str, Group]) -> None:
    children: dict[str, list[str]] = {}
    for name, group in groups.items():
        if group.parent is not None:
            children.setdefault(group.parent, []).append(name)
    for name, kids in children.items():
        parent = groups.get(name)
        if parent is not None and parent.user_budget is not None and not parent.profiles:
            # a server is charged to the group it was started in: a per-member budget of
            # a group that offers no profile of its own would never count anything
            e.add(
                f"groups.{name}.per_user.budget",
                f"{name} offers no profiles of its own, so no server is ever charged to it "
                f"and this per-member budget would never apply (its children "
                f"{', '.join(sorted(kids))} are charged instead): set per_user.budget on "
                "each child",
            )
    for name, group in groups.items():
        if group.parent is None:
            continue
        if group.parent not in groups:
            e.add(f"groups.{name}.parent", f"no group named {group.parent!r}")
            continue
        seen = [name]
        current = group.parent
        while current is not None and current in groups:
            if current in seen:
                e.add(f"groups.{name}.parent", f"cycle: {' -> '.join([*seen, current])}")
                break
            seen.append(current)
            current = groups[current].parent
