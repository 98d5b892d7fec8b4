"""What a valid deployment would not do as its values say: ``jupyterhub-gpu check``'s
warnings, and the hub's at start-up.

A group's CPU, memory or server caps that leave its GPU quota or limit out of
reach of the servers it offers (each server is charged its CPUs and memory as
well as its GPUs, and the first cap reached refuses the next server); an idle
rule over whole GPUs with no Prometheus to read their use from; fair share
counting billed units where no flavor is weighted; a per-user server cap above
one without named servers; a usage database a hub restart loses. Each is said
with its key path and its fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from ..core.billing import Billing
from ..core.model import PREFIX, Amounts, Group, Policy
from ..core.quantities import format_bytes, format_cpu, format_duration, format_gpus
from ..core.selection import Offer, Request, offers, request_for, units_per_server
from .policy import GPUPolicy

#: where z2jh's hub runs and keeps its volume (hub.db.type sqlite-pvc, the default)
Z2JH_HUB_DIR = "/srv/jupyterhub"
#: flavor kinds whose GPU use the idle rule reads from DCGM (one pod's own device)
DCGM_KINDS = frozenset({"gpu", "mig", "dra"})
#: at most this many packings are tried per cap; past it nothing is claimed (no warning)
_SEARCH_LIMIT = 20000


def deployment_warnings(values: Mapping[str, Any], policy: Policy) -> list[str]:
    """What ``jupyterhub-gpu check`` warns about in a valid deployment, each with its
    key path and fix: ``policy_warnings``, and a usage database that a hub restart
    loses."""
    sections = ((values.get("hub") or {}).get("config")) or {}
    return (
        policy_warnings(sections, policy)
        + named_servers_warnings(values, policy)
        + usage_database_warnings(values)
    )


def named_servers_warnings(values: Mapping[str, Any], policy: Policy) -> list[str]:
    """A warning for each per-user server cap above one while JupyterHub gives each user
    one server: a second server is a named one, and named servers are off unless
    ``hub.allowNamedServers`` (z2jh's) or ``hub.config.JupyterHub.allow_named_servers``
    (applied after it) turns them on."""
    hub = values.get("hub") or {}
    jupyterhub = ((hub.get("config") or {}).get("JupyterHub")) or {}
    named = jupyterhub.get("allow_named_servers", hub.get("allowNamedServers", False))
    if named:
        return []
    warnings = []
    for group in policy.all_groups:
        servers = group.per_user.servers
        if servers is None or servers <= 1:
            continue
        where = "everyone" if group is policy.everyone else f"groups.{group.name}"
        warnings.append(
            f"{PREFIX}.{where}.per_user.servers: {servers}, but named servers are off, so "
            "JupyterHub gives each user one server and no member ever starts a second; set "
            "hub.config.JupyterHub.allow_named_servers: true, or per_user.servers: 1"
        )
    return warnings


def policy_warnings(sections: Mapping[str, Any], policy: Policy) -> list[str]:
    """What the hub's config (``hub.config``'s ``sections``) would not do as it says,
    though it is valid: a group's CPU, memory or server caps that leave its GPU quota
    or limit out of reach, an idle rule that would judge whole GPUs without their
    metrics, and fair share counting billed units that weigh nothing."""
    raw_groups = ((sections.get("GPUPolicy") or {}).get("groups")) or {}
    warnings: list[str] = []
    for group in policy.groups.values():
        raw = raw_groups.get(group.name) if isinstance(raw_groups, Mapping) else None
        warnings += unreachable_gpu_warnings(
            policy, group.name, raw if isinstance(raw, Mapping) else {}
        )
    return (
        warnings
        + idle_without_metrics_warnings(policy, sections.get("GPUService") or {})
        + unweighted_fair_share_warnings(policy)
    )


def unweighted_fair_share_warnings(policy: Policy) -> list[str]:
    """A warning when fair share counts billed units but no flavor is billed other than
    a unit per GPU-equivalent-hour: the setting then changes nothing."""
    fair = policy.fair_share
    if fair is None or fair.count != "billed_units" or Billing.of(policy).weighted:
        return []
    return [
        f"{PREFIX}.fair_share.count: billed_units, but no flavor has a billing weight other "
        "than 1, so billed units are GPU-hours and the line is ordered as with gpu_hours; "
        "give the flavors their weights (flavors.<name>.billing: {weight: 3}), or remove "
        "count"
    ]


def group_server_kinds(policy: Policy, name: str) -> list[Request]:
    """Every GPU server a member of ``name`` (or of a group under it) could start,
    as charged: each offered profile with each flavor and GPU count its options
    allow within the caps."""
    kinds: dict[Request, None] = {}
    for group in policy.all_groups:
        if name not in {g.name for g in policy.ancestors(group.name)}:
            continue
        for offer in offers(policy, [group.name]):
            profile = offer.profile
            if offer.group.name != group.name or profile.gpu is None:
                continue
            flavors = {profile.gpu.flavor, *(v for _, v in _choices(offer, "flavor"))}
            counts = {profile.gpu.count, *(v for _, v in _choices(offer, "gpus"))}
            for flavor_name in flavors:
                flavor = policy.flavors[flavor_name]
                for count in counts:
                    request = request_for(profile, flavor, units_per_server(flavor, count))
                    if _may_start(policy, group, request):
                        kinds[request] = None
    return list(kinds)


def _choices(offer: Offer, name: str) -> tuple[tuple[str, Any], ...]:
    option = offer.options.get(name)
    return option.choices if option is not None else ()


def _may_start(policy: Policy, group: Group, request: Request) -> bool:
    """The group's, its parents' and the user's caps could admit it on their own."""
    levels = [lvl for lvl in policy.ancestors(group.name) if not lvl.unlimited]
    caps = [lvl.limit for lvl in levels] + [group.per_user]
    return all(c.first_passed(request) is None for c in caps)


def most_gpus(kinds: list[Request], caps: Amounts) -> Fraction | None:
    """The most GPU-equivalents servers of ``kinds`` can hold together within
    ``caps`` (None: not worked out within the search limit, or no cap binds)."""
    kinds = sorted(kinds, key=lambda k: (-k.gpus, k.memory, k.cpu))
    best = Fraction(0)
    target = caps.gpus
    tried = 0

    def search(i: int, held: Request) -> None:
        nonlocal best, tried
        tried += 1
        if tried > _SEARCH_LIMIT:
            raise _GaveUp
        best = max(best, held.gpus)
        if i == len(kinds) or (target is not None and best >= target):
            return
        kind = kinds[i]
        # as many of this kind as fit, then fewer
        for count in range(_how_many(kind, held, caps), -1, -1):
            search(i + 1, _plus(held, kind, count))
            if target is not None and best >= target:
                return

    try:
        search(0, Request(servers=0))
    except _GaveUp:
        return None
    return best


class _GaveUp(Exception):
    pass


def _how_many(kind: Request, held: Request, caps: Amounts) -> int:
    """How many more servers of ``kind`` fit beside ``held`` (``Amounts.first_passed``'s
    rule: a cap binds only what a server needs of it)."""
    room = []
    for cap, have, need in (
        (caps.gpus, held.gpus, kind.gpus),
        (caps.cpu, held.cpu, kind.cpu),
        (caps.memory, held.memory, kind.memory),
        (caps.servers, held.servers, kind.servers),
        *((caps.flavors.get(f), held.flavors.get(f, 0), n) for f, n in kind.devices),
    ):
        if cap is not None and need:
            room.append(max(0, int((cap - have) // need)))
    if not room:
        raise _GaveUp
    return min(room)


def _plus(held: Request, kind: Request, count: int) -> Request:
    devices = dict(held.devices)
    for flavor, units in kind.devices:
        devices[flavor] = devices.get(flavor, 0) + units * count
    return Request(
        gpus=held.gpus + kind.gpus * count,
        cpu=held.cpu + kind.cpu * count,
        memory=held.memory + kind.memory * count,
        servers=held.servers + kind.servers * count,
        devices=tuple(sorted(devices.items())),
    )


def unreachable_gpu_warnings(policy: Policy, name: str, raw: Mapping[str, Any]) -> list[str]:
    """A warning for a group's GPU quota and limit that its own CPU, memory or server
    caps keep out of reach with the servers it offers (the GPU count alone is fine).

    ``raw``: the group's values as written, to say where an inherited cap comes from.
    """
    group = policy.groups[name]
    if group.unlimited:
        return []
    kinds = group_server_kinds(policy, name)
    if not kinds:
        return []
    path = f"{PREFIX}.groups.{name}"
    warnings = []
    for which, caps, promise in (
        ("quota", group.quota, "guaranteed"),
        ("limit", group.limit, "burst limit of"),
    ):
        if caps.gpus is None or (which == "limit" and caps.gpus == group.quota.gpus):
            continue
        gpu_only = Amounts(gpus=caps.gpus, flavors=caps.flavors)
        reachable = most_gpus(kinds, caps)
        if reachable is None or reachable >= caps.gpus:
            continue
        if (most_gpus(kinds, gpu_only) or Fraction(0)) <= reachable:
            continue  # the GPU counts themselves, not CPU or memory, fall short
        warnings.append(_unreachable_words(path, which, caps, promise, reachable, kinds, raw))
    return warnings


def _unreachable_words(
    path: str,
    which: str,
    caps: Amounts,
    promise: str,
    reachable: Fraction,
    kinds: list[Request],
    raw: Mapping[str, Any],
) -> str:
    """The warning for one cap: the binding setting, what fits, and the amounts that
    would reach the GPUs with the group's largest GPU server."""
    assert caps.gpus is not None
    largest = max(kinds, key=lambda k: (k.gpus, -k.memory, -k.cpu))
    needed = -(-caps.gpus // largest.gpus)  # servers of the largest kind
    fixes = []
    binding = None
    for key, have, per_server, fmt in (
        ("cpu", caps.cpu, largest.cpu, format_cpu),
        ("memory", caps.memory, largest.memory, format_bytes),
        ("servers", caps.servers, largest.servers, str),
    ):
        if have is not None and have < needed * per_server:
            binding = binding or (key, fmt(have))
            fixes.append(f"{which}.{key} to at least {fmt(needed * per_server)}")
    if binding is None:  # several kinds together: name the group's caps
        binding = ("cpu" if caps.cpu is not None else "memory", "")
        fixes.append(f"{which}.cpu and {which}.memory")
    key, have = binding
    written = raw.get(which) if isinstance(raw.get(which), Mapping) else {}
    source = "" if which == "quota" or key in written else f" (from quota.{key})"
    fits = int(reachable // largest.gpus) if largest.gpus else 0
    each_gpus = f"{format_gpus(largest.gpus)} GPU{'' if largest.gpus == 1 else 's'}"
    smaller = {"cpu": "fewer CPUs", "memory": "less memory", "servers": "more GPUs each"}[key]
    return (
        f"{path}.{which}.{key}: {have}{source} leaves room for at most "
        f"{format_gpus(reachable)} of the group's {promise} {format_gpus(caps.gpus)} GPUs "
        f"({fits} of its largest GPU servers fit: {each_gpus}, "
        f"{format_cpu(largest.cpu)} CPUs and {format_bytes(largest.memory)} each); "
        f"raise {' and '.join(fixes)}, or give its GPU profiles {smaller}"
    )


def idle_without_metrics_warnings(policy: Policy, service: Mapping[str, Any]) -> list[str]:
    """A warning for each idle rule over whole GPUs or MIG slices when the service has
    no Prometheus: those servers are then judged by notebook activity alone, which a
    training run in a terminal or one long cell does not make."""
    if not isinstance(service, Mapping) or service.get("prometheus_url"):
        return []
    warnings = []
    for group in policy.groups.values():
        if group.idle is None:
            continue
        kinds = group_server_kinds(policy, group.name)
        dcgm = sorted(
            {f for k in kinds for f, _ in k.devices if policy.flavors[f].kind in DCGM_KINDS}
        )
        if not dcgm:
            continue  # shared devices are judged by notebook activity anyway
        warnings.append(
            f"{PREFIX}.groups.{group.name}.idle: its {', '.join(dcgm)} servers' GPU use is "
            "read from DCGM through Prometheus, but hub.config.GPUService.prometheus_url "
            "is not set, so they are judged by notebook activity alone: a training run in a "
            f"terminal, which makes none, is stopped after {format_duration(group.idle.after)} "
            "and the notice; set "
            "hub.config.GPUService.prometheus_url to the Prometheus that scrapes "
            "dcgm-exporter"
        )
    return warnings


def usage_database_warnings(values: Mapping[str, Any]) -> list[str]:
    """A warning when the usage database (``GPUPolicy.accounting_url``) is a sqlite
    file a hub restart loses: in memory, in the hub's folder without z2jh's hub
    volume (``hub.db.type`` other than ``sqlite-pvc``), or elsewhere in the pod."""
    hub = values.get("hub") or {}
    policy = ((hub.get("config") or {}).get("GPUPolicy")) or {}
    url = policy.get("accounting_url") or GPUPolicy.accounting_url.default_value
    if not isinstance(url, str) or not url.startswith("sqlite"):
        return []
    key = f"{PREFIX}.accounting_url"
    written = "" if policy.get("accounting_url") else " (the default)"
    budget_words = (
        "and with it every budget's GPU-hours and the history; point it at the hub's "
        "PostgreSQL (postgresql://...) or "
    )
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if path in ("", ":memory:"):
        return [
            f"{key}: {url} keeps the usage database in memory: it is lost at every hub "
            f"restart, {budget_words}a sqlite file on the hub's volume"
        ]
    db_type = ((hub.get("db") or {}).get("type")) or "sqlite-pvc"
    where = path if path.startswith("/") else f"{Z2JH_HUB_DIR}/{path}"
    if where.startswith(Z2JH_HUB_DIR + "/"):
        if db_type == "sqlite-pvc":
            return []
        return [
            f"{key}: {url}{written} is a file in {Z2JH_HUB_DIR}, which is on the hub's "
            f"volume only with hub.db.type sqlite-pvc (here {db_type}): it is lost at "
            f"every hub restart, {budget_words}set hub.db.type: sqlite-pvc"
        ]
    mounts = [
        m.get("mountPath", "").rstrip("/") + "/"
        for m in (hub.get("extraVolumeMounts") or [])
        if isinstance(m, Mapping)
    ]
    if any(where.startswith(m) for m in mounts if m != "/"):
        return []
    return [
        f"{key}: {url}{written} is a file in the hub container, on no volume: it is lost "
        f"at every hub restart, {budget_words}a path in {Z2JH_HUB_DIR} (the hub's volume)"
    ]
