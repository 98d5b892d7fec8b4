"""The policy model: what the admin wrote under ``hub.config.GPUPolicy``, checked.

``parse_policy`` turns the raw mappings (as YAML gives them) into frozen
dataclasses, or raises ``PolicyError`` listing *every* problem, each with its
full key path and what to write instead::

    hub.config.GPUPolicy.groups.students.quota.gpus: expected a number, got 'ten'

Unknown keys, dangling references, cycles and impossible numbers are errors,
never silently ignored. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from .quantities import (
    QuantityError,
    format_bytes,
    format_cpu,
    format_gpus,
    parse_bytes,
    parse_duration,
    parse_millicores,
    parse_number,
)

PREFIX = "hub.config.GPUPolicy"
SCHEDULERS = ("default", "kai", "volcano", "kueue")
KINDS = ("gpu", "mig", "timeslice", "mps", "fraction", "hami", "dra")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# what a group's name must be to serve as a label value, a queue and a namespace suffix
_NAME = re.compile(r"^[a-z0-9A-Z]([a-z0-9A-Z_.-]{0,61}[a-z0-9A-Z])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
_DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_MIG_PROFILE = re.compile(r"^([1-7])g\.\d+gb(\+me)?$")
#: namespaces Kubernetes itself runs in or hands every user: never a group's (a quota,
#: an isolating NetworkPolicy or our ownership labels there would take over the
#: cluster's own services); every ``kube-`` name is reserved for Kubernetes too
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
#: what ``egress.deny_private`` denies: the private ranges (RFC 1918), the shared
#: address space some clouds give pods and services, link-local (where the cloud's
#: metadata service hands out the node's credentials), and IPv6's unique-local and
#: link-local ranges
PRIVATE_RANGES = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "fc00::/7",
    "fe80::/10",
)
#: Keys a profile's kubespawner_override may not set: they would bypass accounting.
ACCOUNTED_OVERRIDES = frozenset(
    {
        "cpu_guarantee",
        "cpu_limit",
        "mem_guarantee",
        "mem_limit",
        "extra_resource_guarantees",
        "extra_resource_limits",
        "node_selector",
        "tolerations",
        "scheduler_name",
        "priority_class_name",
        "extra_pod_config",
        "extra_labels",
        "namespace",
        "profile_list",
    }
)


class PolicyError(ValueError):
    """The policy is wrong; ``errors`` lists every problem with its key path."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def unknown_settings(path: str, given: Iterable[Any], names: Iterable[str]) -> list[str]:
    """An error for each setting in ``given`` that is not one of ``names``, with the
    likeliest meant one (``hub.config.GPUPolicy.when_ful: unknown setting; did you mean
    when_full?``): traitlets only warns about them, and a misspelt setting silently
    left at its default is a policy nobody wrote."""
    known = sorted(names)
    errors = []
    for key in given:
        close = difflib.get_close_matches(str(key), known, n=1)
        if str(key) not in known:
            hint = f"did you mean {close[0]}? " if close else ""
            errors.append(f"{path}.{key}: unknown setting; {hint}(settings: {', '.join(known)})")
    return errors


# ---- the model ----------------------------------------------------------------


@dataclass(frozen=True)
class Flavor:
    name: str
    kind: str
    display_name: str
    resource: str | None = None  # the extended resource a pod requests per unit
    mig_profile: str | None = None
    mig_strategy: str | None = None
    product: str | None = None
    replicas: int = 1
    gpu_fraction: Fraction | None = None
    gpu_memory: int | None = None  # MiB
    device_memory: int | None = None  # MiB of one whole device, for GPU-equivalents
    gpucores: int | None = None
    #: dra: the DeviceClass a claim asks for; gpu: the DeviceClass that serves
    #: ``resource`` through DRA (its ``extendedResourceName``), None: a device plugin
    device_class: str | None = None
    selectors: tuple[str, ...] = ()
    sharing: str | None = None
    #: dra: GPU-equivalents per device as the policy sets them (None: 1 at admission;
    #: GPU time counts what each device allocated is, see ``core.dra``)
    dra_equivalents: Fraction | None = None
    scheduler_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    runtime_class_name: str | None = None

    @property
    def node_resource(self) -> str | None:
        """The node's extended resource this flavor's units come out of, or None.

        Device kinds: ``resource``, what a pod requests per unit. KAI fractions
        share whole devices, so they come out of ``nvidia.com/gpu`` though a pod
        requests none. DRA devices are claimed, not node resources: None.
        """
        if self.kind == "dra":
            return None
        if self.kind == "fraction":
            return "nvidia.com/gpu"
        return self.resource

    @property
    def unit_equivalents(self) -> Fraction:
        """GPU-equivalents one unit of this flavor is charged."""
        if self.kind == "gpu":
            return Fraction(1)
        if self.kind == "mig":
            assert self.mig_profile
            return Fraction(int(self.mig_profile[0]), 7)
        if self.kind in ("timeslice", "mps"):
            return Fraction(1, self.replicas)
        if self.kind == "fraction" and self.gpu_fraction is not None:
            return self.gpu_fraction
        if self.kind in ("fraction", "hami"):
            # memory / device memory; unknown device memory charges a whole GPU
            # (fail closed: never under-count)
            if self.gpu_memory and self.device_memory:
                return min(Fraction(self.gpu_memory, self.device_memory), Fraction(1))
            return Fraction(1)
        return self.dra_equivalents or Fraction(1)

    @property
    def bridged(self) -> bool:
        """A ``gpu`` flavor whose resource a DRA driver serves: pods ask for the
        extended resource, kube-scheduler allocates devices of ``device_class``."""
        return self.kind == "gpu" and self.device_class is not None

    def claim_template_name(self, count: int) -> str:
        """The ResourceClaimTemplate a DRA pod of ``count`` devices references."""
        return f"jupyterhub-gpu-{self.name}-x{count}"


@dataclass(frozen=True)
class GpuRequest:
    flavor: str
    count: int = 1


@dataclass(frozen=True)
class Option:
    """A choice the user makes: ``gpus`` (counts), ``flavor`` or ``image``."""

    name: str
    display_name: str
    choices: tuple[tuple[str, Any], ...]  # (key shown in the form, value)
    #: images a user may type instead of choosing (``unlisted_choice``); None: not allowed
    unlisted_regex: str | None = None
    unlisted_display_name: str = "Other image..."


@dataclass(frozen=True)
class Interface:
    """What a server can open: JupyterLab, VS Code, any jupyter-server-proxy app; the
    server opens at ``url`` (its ``default_url``, under the server's own prefix)."""

    name: str
    display_name: str
    url: str


#: what a server opens when the policy names no interfaces
JUPYTERLAB = Interface("lab", "JupyterLab", "/lab")


@dataclass(frozen=True)
class Dataset:
    """Shared data a group's servers mount: an NFS export (inline, so it mounts in any
    namespace), an existing PersistentVolumeClaim (``claim``, in the server's
    namespace) or a CSI volume."""

    name: str
    display_name: str
    description: str
    mount_path: str
    read_only: bool
    #: the pod volume's source, as Kubernetes writes it: ``{"nfs": {...}}``,
    #: ``{"persistentVolumeClaim": {...}}`` or ``{"csi": {...}}``
    source: Mapping[str, Any]

    @property
    def claim(self) -> str | None:
        """The PersistentVolumeClaim it needs in the server's namespace, if any."""
        claim = self.source.get("persistentVolumeClaim")
        return claim["claimName"] if claim else None

    @property
    def kind(self) -> str:
        """``nfs``, ``claim`` or ``csi``."""
        (source,) = self.source
        return "claim" if source == "persistentVolumeClaim" else source

    @property
    def volume_name(self) -> str:
        return "dataset-" + dns_label(self.name)


@dataclass(frozen=True)
class Profile:
    name: str
    display_name: str
    description: str
    cpu: int  # millicores guaranteed
    memory: int  # bytes guaranteed
    cpu_limit: int | None
    memory_limit: int | None
    image: str | None
    gpu: GpuRequest | None
    options: Mapping[str, Option]
    default: bool
    kubespawner_override: Mapping[str, Any]
    #: the interfaces it can open (None: any its group offers)
    interfaces: tuple[str, ...] | None = None


class Totals(Protocol):
    """What servers hold or ask for: a request, or a group's or user's usage."""

    gpus: Fraction
    cpu: int
    memory: int
    servers: int

    @property
    def flavors(self) -> Mapping[str, int]: ...


@dataclass(frozen=True)
class Passed:
    """A cap that ``in_use + need`` passes: which one, and the three numbers in words."""

    unit: str  # "GPUs", "CPUs", "memory", "servers" or a flavor's name
    in_use: str
    need: str
    cap: str


@dataclass(frozen=True)
class _Nothing:
    """Totals of nothing held: ``first_passed`` without ``in_use``."""

    gpus: Fraction = Fraction(0)
    cpu: int = 0
    memory: int = 0
    servers: int = 0
    flavors: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Amounts:
    """A set of caps (quota, limit, per-user); ``None`` means not capped."""

    gpus: Fraction | None = None
    cpu: int | None = None  # millicores
    memory: int | None = None  # bytes
    servers: int | None = None
    flavors: Mapping[str, int] = field(default_factory=dict)

    def first_passed(self, need: Totals, in_use: Totals | None = None) -> Passed | None:
        """The first cap that ``in_use + need`` would pass, or None if all hold.

        The one cap check: selection (could a profile ever be admitted: ``in_use``
        None), admission (would this server pass a group's quota, limit or a user's
        caps) and the runtime rules (does a group's usage pass its limit now: the
        usage as ``need``) all ask it. Only what ``need`` uses is checked, so a server
        without GPUs is never refused because a group is over its GPU cap.
        """
        used = in_use if in_use is not None else _Nothing()
        checks = (
            ("GPUs", used.gpus, need.gpus, self.gpus, format_gpus),
            ("CPUs", used.cpu, need.cpu, self.cpu, format_cpu),
            ("memory", used.memory, need.memory, self.memory, format_bytes),
            ("servers", used.servers, need.servers, self.servers, str),
        )
        for unit, held, wanted, cap, fmt in checks:
            if cap is not None and wanted and held + wanted > cap:
                return Passed(unit, fmt(held), fmt(wanted), fmt(cap))
        for flavor, wanted in need.flavors.items():
            cap = self.flavors.get(flavor)
            held = used.flavors.get(flavor, 0)
            if cap is not None and wanted and held + wanted > cap:
                return Passed(flavor, str(held), str(wanted), str(cap))
        return None

    def is_empty(self) -> bool:
        return (
            self.gpus is None
            and self.cpu is None
            and self.memory is None
            and self.servers is None
            and not self.flavors
        )


WHEN_EXHAUSTED = ("warn", "stop")
#: what a spawn does when a cap is reached (``GPUPolicy.when_full``, a group's)
WHEN_FULL = ("refuse", "wait")


@dataclass(frozen=True)
class Budget:
    """GPU time in a rolling window: ``gpu_hours`` GPU-equivalent-hours per ``period``."""

    gpu_hours: Fraction
    period: int  # seconds
    when_exhausted: str = "warn"  # "warn": tell running servers' users; "stop": stop them
    grace: int = 15 * 60  # seconds between the notice and the stop ("stop" only)


@dataclass(frozen=True)
class Idle:
    """A server holding GPUs idle for ``after`` seconds is warned, then stopped."""

    after: int  # seconds
    gpu_utilization_below: float = 5.0  # percent: at or above this, the GPU is busy


@dataclass(frozen=True)
class Group:
    name: str
    display_name: str
    profiles: tuple[str, ...]
    quota: Amounts
    limit: Amounts
    per_user: Amounts
    max_runtime: int | None
    queue: str
    parent: str | None
    priority_class: str | None
    unlimited: bool
    admin: bool
    budget: Budget | None = None
    #: each member's own budget within the group (``per_user.budget``)
    user_budget: Budget | None = None
    idle: Idle | None = None
    #: the directory groups (names, DNs, IDs or paths) whose members are this group's
    #: members; empty: the directory group of the same name (see core.directory)
    directory_groups: tuple[str, ...] = ()
    #: fair-share weight among its siblings (the groups of the same parent, or the
    #: top-level groups); its members have equal shares of it
    share: float = 1.0
    #: the interfaces its servers can open (None: the policy's first)
    interfaces: tuple[str, ...] | None = None
    #: the datasets its servers mount (with its parents')
    datasets: tuple[str, ...] = ()
    #: what its members' spawns do when a cap (its own or a parent's) is reached:
    #: "refuse" or "wait"; None: its parent's setting, else ``GPUPolicy.when_full``
    when_full: str | None = None


@dataclass(frozen=True)
class FairShare:
    """``GPUPolicy.fair_share``: whoever waits for the same capacity is ordered by GPU
    time used recently (decayed with ``half_life``) against their share; a server
    waiting longer than ``max_wait`` goes first whatever its standing."""

    half_life: int  # seconds
    max_wait: int = 3600  # seconds


@dataclass(frozen=True)
class Egress:
    """``GPUPolicy.egress``: what servers in group namespaces may connect to. DNS, the
    hub and the proxy, and the servers' own namespace are always allowed."""

    #: deny ``PRIVATE_RANGES`` (except what is allowed below)
    deny_private: bool = True
    #: allow every other address (the public internet); False: only what is listed
    allow_public: bool = True
    #: networks allowed even inside denied ranges (normalised, e.g. ``10.20.0.0/16``)
    allow_cidrs: tuple[str, ...] = ()
    #: more networks to deny, e.g. a site's own public range
    deny_cidrs: tuple[str, ...] = ()
    #: allow the NFS servers of a group's datasets that are given as addresses
    allow_dataset_servers: bool = True

    @property
    def open_networks(self) -> tuple[str, ...]:
        """The networks allowed before anything is denied: every address, or with
        ``allow_public: false`` the private ranges unless they are denied too."""
        if self.allow_public:
            return ("0.0.0.0/0", "::/0")
        return () if self.deny_private else PRIVATE_RANGES

    @property
    def denied_networks(self) -> tuple[str, ...]:
        """What is cut out of ``open_networks``."""
        return (*(PRIVATE_RANGES if self.deny_private else ()), *self.deny_cidrs)

    def allowed_networks(self, datasets: Iterable[Dataset]) -> tuple[str, ...]:
        """Networks allowed whatever is denied: ``allow_cidrs`` and the NFS servers of
        ``datasets`` written as addresses (a host name has no address here; the mount
        itself is made by the node, which no pod's egress rule governs)."""
        servers = []
        if self.allow_dataset_servers:
            for dataset in datasets:
                server = (dataset.source.get("nfs") or {}).get("server", "")
                try:
                    address = ipaddress.ip_address(server)
                except ValueError:
                    continue
                servers.append(str(ipaddress.ip_network(address)))
        return tuple(dict.fromkeys([*self.allow_cidrs, *servers]))


@dataclass(frozen=True)
class Scheduler:
    name: str = "default"
    in_quota_priority_class: str = "jupyterhub-gpu-in-quota"
    over_quota_priority_class: str = "jupyterhub-gpu-over-quota"


@dataclass(frozen=True)
class Policy:
    scheduler: Scheduler
    flavors: Mapping[str, Flavor]
    profiles: Mapping[str, Profile]
    everyone: Group
    groups: Mapping[str, Group]
    when_full: str = "refuse"
    namespace_per_group: bool = False
    namespace_prefix: str = "jupyterhub-gpu-"
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    #: the group charged for a server started before the policy when the user's groups
    #: do not single one out (None: such a server is not charged to any group)
    adopted_servers_group: str | None = None
    #: new servers may preempt servers started before the policy (False: while any
    #: runs, new servers get PriorityClasses that never preempt)
    adopted_servers_preemptible: bool = False
    #: fair share by recent GPU time (None: waiting lines are first come, first served)
    fair_share: FairShare | None = None
    #: what servers can open; empty: not set, servers open at the chart's default URL
    interfaces: Mapping[str, Interface] = field(default_factory=dict)
    #: shared data, mounted into the servers of the groups that list it
    datasets: Mapping[str, Dataset] = field(default_factory=dict)
    #: existing namespaces without our ownership labels the reconciler may take over
    adopt_namespaces: tuple[str, ...] = ()
    #: what servers in group namespaces may connect to (None: not restricted)
    egress: Egress | None = None
    #: what selection.offers computes per (group, profile): a pure function of the
    #: policy, kept with it (not an init field: dataclasses.replace starts afresh)
    offer_cache: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @functools.cached_property
    def group_order(self) -> dict[str, int]:
        """Each group's position in the policy: a user's few groups are put in policy
        order without a pass over every group (5,000 at a large site)."""
        return {name: i for i, name in enumerate(self.groups)}

    def group(self, name: str) -> Group:
        """The group by name, ``everyone`` included; KeyError if the policy has none."""
        return self.everyone if name == "everyone" else self.groups[name]

    def find_group(self, name: str | None) -> Group | None:
        """The group by name, ``everyone`` included, or None: no such group (a server
        may still be charged to a group the policy has since dropped)."""
        if name == "everyone":
            return self.everyone
        return self.groups.get(name) if name is not None else None

    @property
    def all_groups(self) -> list[Group]:
        """Every group, then ``everyone``."""
        return [*self.groups.values(), self.everyone]

    def ancestors(self, name: str) -> list[Group]:
        """The group and its parents, nearest first."""
        chain = []
        current: str | None = name
        while current is not None:
            group = self.group(current)
            chain.append(group)
            current = group.parent
        return chain

    def when_full_of(self, name: str) -> str:
        """What a spawn charged to group ``name`` does when a cap is reached, its own
        or a parent's: the nearest ``when_full`` the group and its parents set, else
        the policy's (a course refuses at once while research waits in line)."""
        for group in self.ancestors(name):
            if group.when_full is not None:
                return group.when_full
        return self.when_full

    def datasets_of(self, name: str) -> list[Dataset]:
        """What the servers charged to group ``name`` mount: its parents' datasets, then
        its own (a department's data is its labs' too); none for a dropped group."""
        if self.find_group(name) is None:
            return []
        names = [d for g in reversed(self.ancestors(name)) for d in g.datasets]
        return [self.datasets[d] for d in dict.fromkeys(names)]

    def interfaces_of(self, group: Group, profile: Profile) -> tuple[Interface, ...]:
        """What a server of ``profile`` charged to ``group`` can open, in the policy's
        order: the profile's and the group's lists (each, where set); the policy's
        first interface where neither is set; nothing when the policy names none."""
        if not self.interfaces:
            return ()
        allowed = [n for n in self.interfaces if _offers(group.interfaces, n)]
        allowed = [n for n in allowed if _offers(profile.interfaces, n)]
        if group.interfaces is None and profile.interfaces is None:
            allowed = allowed[:1]
        return tuple(self.interfaces[n] for n in allowed)

    def charged_groups(self, name: str) -> list[str]:
        """The names of the groups a server charged to ``name`` counts for: the group
        and its parents; just ``name`` for a group the policy has since dropped (its
        servers and usage stay its own)."""
        if self.find_group(name) is None:
            return [name]
        return [g.name for g in self.ancestors(name)]


def _offers(listed: tuple[str, ...] | None, name: str) -> bool:
    return listed is None or name in listed


# ---- parsing --------------------------------------------------------------------


class _Errors:
    """Collects every problem instead of stopping at the first."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(
            f"{self.prefix}.{path}: {message}" if path else f"{self.prefix}: {message}"
        )

    def mapping(self, path: str, value: Any) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(path, f"expected a mapping, got {value!r}")
            return {}
        return value

    def keys(self, path: str, value: Mapping[str, Any], allowed: set[str] | frozenset[str]) -> None:
        for key in value:
            if key not in allowed:
                hint = ", ".join(sorted(allowed))
                self.add(f"{path}.{key}", f"unknown key (allowed here: {hint})")

    def convert(self, path: str, value: Any, parse) -> Any:
        try:
            return parse(value)
        except QuantityError as e:
            self.add(path, str(e))
            return None

    def string(self, path: str, value: Any, *, required: bool = False) -> str | None:
        if value is None:
            if required:
                self.add(path, "required")
            return None
        if not isinstance(value, str) or not value:
            self.add(path, f"expected a non-empty string, got {value!r}")
            return None
        return value

    def whole(self, path: str, value: Any, *, minimum: int = 0) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.add(path, f"expected a whole number >= {minimum}, got {value!r}")
            return None
        return value

    def string_map(self, path: str, value: Any) -> dict[str, str]:
        result = {}
        for k, v in self.mapping(path, value).items():
            if not isinstance(v, str | int | float) or isinstance(v, bool):
                self.add(f"{path}.{k}", f"expected a string, got {v!r}")
            else:
                result[str(k)] = str(v)
        return result


_FLAVOR_COMMON = {"kind", "display_name", "node_selector", "tolerations", "runtime_class_name"}
_FLAVOR_KEYS = {
    "gpu": {"resource", "device_class"},
    "mig": {"profile", "strategy", "product"},
    "timeslice": {"replicas", "resource"},
    "mps": {"replicas", "resource"},
    "fraction": {"gpu_fraction", "gpu_memory", "device_memory"},
    "hami": {"gpu_memory", "gpucores", "device_memory", "scheduler_name"},
    "dra": {"device_class", "selectors", "sharing", "gpu_equivalents"},
}


def _parse_flavor(e: _Errors, name: str, raw: Any, scheduler: str) -> Flavor | None:
    path = f"flavors.{name}"
    spec = e.mapping(path, raw)
    kind = spec.get("kind")
    if kind not in KINDS:
        e.add(f"{path}.kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
        return None
    e.keys(path, spec, _FLAVOR_COMMON | _FLAVOR_KEYS[kind])
    tolerations = spec.get("tolerations", [GPU_TOLERATION])
    if not isinstance(tolerations, list) or not all(isinstance(t, Mapping) for t in tolerations):
        e.add(f"{path}.tolerations", f"expected a list of tolerations, got {tolerations!r}")
        tolerations = []
    common: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "display_name": e.string(f"{path}.display_name", spec.get("display_name")) or name,
        "node_selector": e.string_map(f"{path}.node_selector", spec.get("node_selector")),
        "tolerations": tuple(dict(t) for t in tolerations),
        "runtime_class_name": e.string(
            f"{path}.runtime_class_name", spec.get("runtime_class_name")
        ),
    }
    if kind == "gpu":
        resource = e.string(f"{path}.resource", spec.get("resource")) or "nvidia.com/gpu"
        # the DeviceClass whose extendedResourceName is this resource: a DRA driver
        # serves it (Kubernetes' extended-resource bridge); absent, a device plugin
        bridge = e.string(f"{path}.device_class", spec.get("device_class"))
        return Flavor(resource=resource, device_class=bridge, **common)
    if kind == "mig":
        profile = e.string(f"{path}.profile", spec.get("profile"), required=True)
        if profile and not _MIG_PROFILE.match(profile):
            e.add(
                f"{path}.profile",
                f"expected a MIG profile such as 1g.5gb or 3g.40gb, got {profile!r}",
            )
            profile = None
        strategy = spec.get("strategy", "mixed")
        if strategy not in ("mixed", "single"):
            e.add(f"{path}.strategy", f"expected mixed or single, got {strategy!r}")
        product = e.string(f"{path}.product", spec.get("product"))
        if strategy == "single" and not product:
            e.add(
                f"{path}.product",
                "required with strategy: single (the GPU model, e.g. NVIDIA-A100-SXM4-40GB), "
                "to select nodes labelled <product>-MIG-<profile>",
            )
        if profile is None:
            return None
        resource = (
            f"nvidia.com/mig-{profile.replace('+', '.')}"
            if strategy == "mixed"
            else "nvidia.com/gpu"
        )
        node_selector = dict(common.pop("node_selector"))
        if strategy == "single" and product:
            node_selector.setdefault("nvidia.com/gpu.product", f"{product}-MIG-{profile}")
        return Flavor(
            resource=resource,
            mig_profile=profile,
            mig_strategy=strategy,
            product=product,
            node_selector=node_selector,
            **common,
        )
    if kind in ("timeslice", "mps"):
        replicas = e.whole(f"{path}.replicas", spec.get("replicas"), minimum=1)
        resource = e.string(f"{path}.resource", spec.get("resource")) or "nvidia.com/gpu.shared"
        node_selector = dict(common.pop("node_selector"))
        if resource == "nvidia.com/gpu":
            # not renamed: only the sharing-strategy label tells shared from whole GPUs
            strategy = "time-slicing" if kind == "timeslice" else "mps"
            node_selector.setdefault("nvidia.com/gpu.sharing-strategy", strategy)
        if replicas is None:
            return None
        return Flavor(resource=resource, replicas=replicas, node_selector=node_selector, **common)
    if kind == "fraction":
        if scheduler != "kai":
            e.add(
                f"{path}.kind",
                f"fraction flavors need the KAI scheduler (its gpu-fraction / gpu-memory "
                f"annotations); set scheduler.name: kai (it is {scheduler!r})",
            )
        has_fraction, has_memory = "gpu_fraction" in spec, "gpu_memory" in spec
        if has_fraction == has_memory:
            e.add(path, "set exactly one of gpu_fraction (e.g. 0.5) or gpu_memory (MiB)")
            return None
        fraction = memory = None
        if has_fraction:
            fraction = e.convert(f"{path}.gpu_fraction", spec["gpu_fraction"], parse_number)
            if fraction is not None and not 0 < fraction < 1:
                e.add(
                    f"{path}.gpu_fraction",
                    f"expected a number between 0 and 1, got {spec['gpu_fraction']!r}",
                )
                fraction = None
        else:
            memory = e.whole(f"{path}.gpu_memory", spec["gpu_memory"], minimum=1)
        device_memory = _device_memory(e, path, spec)
        return Flavor(
            gpu_fraction=fraction, gpu_memory=memory, device_memory=device_memory, **common
        )
    if kind == "hami":
        memory = e.whole(f"{path}.gpu_memory", spec.get("gpu_memory"), minimum=1)
        cores = None
        if "gpucores" in spec:
            cores = e.whole(f"{path}.gpucores", spec["gpucores"], minimum=1)
            if cores is not None and cores > 100:
                e.add(f"{path}.gpucores", f"expected a percentage 1-100, got {cores}")
        device_memory = _device_memory(e, path, spec)
        return Flavor(
            resource="nvidia.com/gpu",
            gpu_memory=memory,
            gpucores=cores,
            device_memory=device_memory,
            scheduler_name=e.string(f"{path}.scheduler_name", spec.get("scheduler_name"))
            or "hami-scheduler",
            **common,
        )
    # dra
    device_class = e.string(f"{path}.device_class", spec.get("device_class")) or "gpu.nvidia.com"
    selectors = spec.get("selectors", [])
    if not isinstance(selectors, list) or not all(isinstance(s, str) for s in selectors):
        e.add(f"{path}.selectors", f"expected a list of CEL expressions, got {selectors!r}")
        selectors = []
    sharing = spec.get("sharing")
    if sharing not in (None, "TimeSlicing", "MPS"):
        e.add(f"{path}.sharing", f"expected TimeSlicing or MPS, got {sharing!r}")
    equivalents = None
    if "gpu_equivalents" in spec:
        equivalents = e.convert(f"{path}.gpu_equivalents", spec["gpu_equivalents"], parse_number)
        if equivalents is not None and equivalents <= 0:
            e.add(f"{path}.gpu_equivalents", "expected a number > 0")
    return Flavor(
        device_class=device_class,
        selectors=tuple(selectors),
        sharing=sharing,
        dra_equivalents=equivalents or None,
        **common,
    )


def _device_memory(e: _Errors, path: str, spec: Mapping[str, Any]) -> int | None:
    """MiB of one whole device, to count memory-sized shares in GPU-equivalents."""
    if "device_memory" not in spec:
        return None
    return e.whole(f"{path}.device_memory", spec["device_memory"], minimum=1)


_PROFILE_KEYS = {
    "display_name",
    "description",
    "cpu",
    "memory",
    "cpu_limit",
    "memory_limit",
    "image",
    "gpu",
    "options",
    "default",
    "kubespawner_override",
    "interfaces",
}


def _parse_options(
    e: _Errors, path: str, raw: Any, flavors: Mapping[str, Any]
) -> dict[str, Option]:
    options: dict[str, Option] = {}
    for name, spec in e.mapping(path, raw).items():
        opath = f"{path}.{name}"
        if name not in ("gpus", "flavor", "image"):
            e.add(opath, "unknown option (allowed: gpus, flavor, image)")
            continue
        spec = e.mapping(opath, spec)
        e.keys(opath, spec, {"choices", "display_name", "unlisted_choice"})
        display = (
            e.string(f"{opath}.display_name", spec.get("display_name"))
            or {
                "gpus": "GPUs",
                "flavor": "GPU type",
                "image": "Image",
            }[name]
        )
        raw_choices = spec.get("choices")
        choices: list[tuple[str, Any]] = []
        if name == "image" and isinstance(raw_choices, Mapping):
            for key, image in raw_choices.items():
                if e.string(f"{opath}.choices.{key}", image):
                    choices.append((str(key), image))
        elif isinstance(raw_choices, list) and raw_choices:
            for i, choice in enumerate(raw_choices):
                cpath = f"{opath}.choices[{i}]"
                if name == "gpus":
                    if e.whole(cpath, choice, minimum=1) is not None:
                        choices.append((str(choice), choice))
                elif name == "flavor":
                    if choice not in flavors:
                        e.add(cpath, f"no flavor named {choice!r} (flavors: {', '.join(flavors)})")
                    else:
                        choices.append((str(choice), choice))
                elif e.string(cpath, choice):
                    choices.append((str(choice), choice))
        else:
            e.add(f"{opath}.choices", f"expected a non-empty list, got {raw_choices!r}")
        unlisted = _parse_unlisted(e, f"{opath}.unlisted_choice", name, spec.get("unlisted_choice"))
        options[name] = Option(name, display, tuple(choices), *unlisted)
    return options


def _parse_unlisted(e: _Errors, path: str, option: str, raw: Any) -> tuple[str | None, str]:
    """``unlisted_choice: {validation_regex, display_name}``: images only, and never unchecked."""
    if raw is None:
        return None, "Other image..."
    if option != "image":
        e.add(
            path,
            "only the image option takes unlisted choices (GPU counts and flavors are charged)",
        )
        return None, ""
    spec = e.mapping(path, raw)
    e.keys(path, spec, {"validation_regex", "display_name"})
    regex = e.string(f"{path}.validation_regex", spec.get("validation_regex"), required=True)
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as err:
            e.add(f"{path}.validation_regex", f"not a regular expression: {err}")
            regex = None
    display = e.string(f"{path}.display_name", spec.get("display_name")) or "Other image..."
    return regex, display


def _parse_profile(
    e: _Errors,
    name: str,
    raw: Any,
    flavors: Mapping[str, Flavor],
    interfaces: Mapping[str, Interface] | None = None,
) -> Profile | None:
    path = f"profiles.{name}"
    spec = e.mapping(path, raw)
    e.keys(path, spec, _PROFILE_KEYS)
    if "--" in name:
        e.add(path, "a profile name may not contain '--' (it separates group and profile in slugs)")
    cpu = e.convert(f"{path}.cpu", spec.get("cpu", "1"), parse_millicores)
    memory = e.convert(f"{path}.memory", spec.get("memory", "1Gi"), parse_bytes)
    cpu_limit = memory_limit = None
    if "cpu_limit" in spec:
        cpu_limit = e.convert(f"{path}.cpu_limit", spec["cpu_limit"], parse_millicores)
        if cpu_limit is not None and cpu is not None and cpu_limit < cpu:
            e.add(f"{path}.cpu_limit", f"must be >= cpu ({spec.get('cpu')})")
    if "memory_limit" in spec:
        memory_limit = e.convert(f"{path}.memory_limit", spec["memory_limit"], parse_bytes)
        if memory_limit is not None and memory is not None and memory_limit < memory:
            e.add(f"{path}.memory_limit", f"must be >= memory ({spec.get('memory')})")
    gpu = None
    if spec.get("gpu") is not None:
        gspec = e.mapping(f"{path}.gpu", spec["gpu"])
        e.keys(f"{path}.gpu", gspec, {"flavor", "count"})
        flavor = gspec.get("flavor")
        count = e.whole(f"{path}.gpu.count", gspec.get("count", 1), minimum=1)
        if flavor not in flavors:
            e.add(
                f"{path}.gpu.flavor",
                f"no flavor named {flavor!r} (flavors: {', '.join(flavors) or 'none defined'})",
            )
        elif count is not None:
            if flavors[flavor].kind == "fraction" and count != 1:
                e.add(f"{path}.gpu.count", "a fraction flavor is one slice per server: use 1")
            gpu = GpuRequest(flavor, count)
    options = _parse_options(e, f"{path}.options", spec.get("options"), flavors)
    if options and gpu is None and ("gpus" in options or "flavor" in options):
        e.add(f"{path}.options", "gpus and flavor options need the profile to have a gpu")
    if gpu and "gpus" in options and gpu.count not in [v for _, v in options["gpus"].choices]:
        e.add(f"{path}.options.gpus.choices", f"must include the profile's gpu.count ({gpu.count})")
    if gpu and "flavor" in options and gpu.flavor not in [v for _, v in options["flavor"].choices]:
        e.add(
            f"{path}.options.flavor.choices",
            f"must include the profile's gpu.flavor ({gpu.flavor})",
        )
    override = e.mapping(f"{path}.kubespawner_override", spec.get("kubespawner_override"))
    for key in override:
        if key in ACCOUNTED_OVERRIDES:
            e.add(
                f"{path}.kubespawner_override.{key}",
                "is set by the policy (cpu, memory, gpu, flavors and the scheduler); "
                "use the profile's own keys instead",
            )
    default = spec.get("default", False)
    if not isinstance(default, bool):
        e.add(f"{path}.default", f"expected true or false, got {default!r}")
    if cpu is None or memory is None:
        return None
    return Profile(
        name=name,
        display_name=e.string(f"{path}.display_name", spec.get("display_name")) or name,
        description=e.string(f"{path}.description", spec.get("description")) or "",
        cpu=cpu,
        memory=memory,
        cpu_limit=cpu_limit,
        memory_limit=memory_limit,
        image=e.string(f"{path}.image", spec.get("image")),
        gpu=gpu,
        options=options,
        default=bool(default),
        kubespawner_override=dict(override),
        interfaces=_parse_names(
            e, f"{path}.interfaces", spec.get("interfaces"), interfaces or {}, "interface"
        ),
    )


def _parse_amounts(e: _Errors, path: str, raw: Any, flavors: Mapping[str, Flavor]) -> Amounts:
    spec = e.mapping(path, raw)
    e.keys(path, spec, {"gpus", "cpu", "memory", "servers", "flavors"})
    gpus = cpu = memory = servers = None
    if "gpus" in spec:
        gpus = e.convert(f"{path}.gpus", spec["gpus"], parse_number)
    if "cpu" in spec:
        cpu = e.convert(f"{path}.cpu", spec["cpu"], parse_millicores)
    if "memory" in spec:
        memory = e.convert(f"{path}.memory", spec["memory"], parse_bytes)
    if "servers" in spec:
        servers = e.whole(f"{path}.servers", spec["servers"])
    per_flavor = {}
    for flavor, count in e.mapping(f"{path}.flavors", spec.get("flavors")).items():
        if flavor not in flavors:
            e.add(f"{path}.flavors.{flavor}", f"no flavor named {flavor!r}")
        elif (n := e.whole(f"{path}.flavors.{flavor}", count)) is not None:
            per_flavor[flavor] = n
    return Amounts(gpus=gpus, cpu=cpu, memory=memory, servers=servers, flavors=per_flavor)


_GROUP_KEYS = {
    "interfaces",
    "datasets",
    "display_name",
    "profiles",
    "quota",
    "limit",
    "per_user",
    "max_runtime",
    "queue",
    "parent",
    "priority_class",
    "unlimited",
    "admin",
    "budget",
    "idle",
    "directory_groups",
    "share",
    "when_full",
}


#: what ``everyone`` may not have: every user is in it, whatever the directory says
_EVERYONE_EXCLUDES = frozenset({"parent", "unlimited", "admin", "directory_groups"})
# a DN's attribute=value parts are separated by commas that are not escaped (RFC 4514)
_DN_SEPARATOR = re.compile(r"(?<!\\),")
_DN_ATTRIBUTE = re.compile(r"^\s*[A-Za-z][A-Za-z0-9-]*\s*=|^\s*\d+(\.\d+)+\s*=")


def _parse_directory_groups(e: _Errors, path: str, raw: Any) -> tuple[str, ...]:
    """Directory group names, DNs, IDs or paths; a number (a gidNumber) is read as text."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        e.add(path, f"expected a list of directory group names, DNs, IDs or paths, got {raw!r}")
        return ()
    found: list[str] = []
    for i, item in enumerate(raw):
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str) or not item.strip():
            e.add(f"{path}[{i}]", f"expected a group name, DN, ID or path, got {item!r}")
            continue
        if "=" in item and not all(_DN_ATTRIBUTE.match(p) for p in _DN_SEPARATOR.split(item)):
            e.add(
                f"{path}[{i}]",
                f"{item!r} is not a DN: every comma-separated part is attribute=value, "
                "as in cn=research,ou=groups,dc=example,dc=edu",
            )
            continue
        if item in found:
            e.add(f"{path}[{i}]", f"{item!r} is listed twice")
            continue
        found.append(item)
    return tuple(found)


def _check_limit(e: _Errors, path: str, quota: Amounts, limit: Amounts) -> Amounts:
    """Fill unset limit fields from the quota; a limit below its quota is an error."""
    merged = {}
    for key in ("gpus", "cpu", "memory", "servers"):
        q, lim = getattr(quota, key), getattr(limit, key)
        if lim is None:
            merged[key] = q
        else:
            if q is not None and lim < q:
                e.add(f"{path}.limit.{key}", f"must be >= quota.{key} (the burst ceiling)")
            merged[key] = lim
    flavors = dict(quota.flavors)
    for flavor, lim in limit.flavors.items():
        if flavor in quota.flavors and lim < quota.flavors[flavor]:
            e.add(f"{path}.limit.flavors.{flavor}", f"must be >= quota.flavors.{flavor}")
        flavors[flavor] = lim
    return Amounts(flavors=flavors, **merged)


def _parse_group(
    e: _Errors,
    path: str,
    name: str,
    raw: Any,
    profiles: Mapping[str, Profile],
    flavors,
    interfaces: Mapping[str, Interface] | None = None,
    datasets: Mapping[str, Dataset] | None = None,
) -> Group | None:
    spec = e.mapping(path, raw)
    allowed = _GROUP_KEYS - (_EVERYONE_EXCLUDES if name == "everyone" else set())
    e.keys(path, spec, allowed)
    if name != "everyone" and (not _NAME.match(name) or "--" in name):
        e.add(
            path,
            "a group name must be 1-63 letters, digits, '-', '_' or '.', start and end "
            "with a letter or digit, and not contain '--'",
        )
    names = spec.get("profiles", [])
    if not isinstance(names, list):
        e.add(f"{path}.profiles", f"expected a list of profile names, got {names!r}")
        names = []
    for i, profile in enumerate(names):
        if profile not in profiles:
            e.add(
                f"{path}.profiles[{i}]",
                f"no profile named {profile!r} (profiles: {', '.join(profiles) or 'none defined'})",
            )
    unlimited = spec.get("unlimited", False)
    admin = spec.get("admin", False)
    for key, value in (("unlimited", unlimited), ("admin", admin)):
        if not isinstance(value, bool):
            e.add(f"{path}.{key}", f"expected true or false, got {value!r}")
    quota = _parse_amounts(e, f"{path}.quota", spec.get("quota"), flavors)
    limit_raw = _parse_amounts(e, f"{path}.limit", spec.get("limit"), flavors)
    if unlimited is True and not (quota.is_empty() and limit_raw.is_empty()):
        e.add(
            f"{path}.unlimited", "an unlimited group has no quota or limit: remove one or the other"
        )
    limit = _check_limit(e, path, quota, limit_raw)
    offers_gpus = any(profiles[p].gpu for p in names if p in profiles)
    if offers_gpus and unlimited is not True and limit.gpus is None:
        gpu_profiles = [p for p in names if p in profiles and profiles[p].gpu]
        e.add(
            f"{path}.quota.gpus",
            f"required: the group offers GPU profiles ({', '.join(gpu_profiles)}); "
            "set a number of GPU-equivalents, or unlimited: true",
        )
    per_user_spec = dict(e.mapping(f"{path}.per_user", spec.get("per_user")))
    user_budget_raw = per_user_spec.pop("budget", None)
    per_user = _parse_amounts(e, f"{path}.per_user", per_user_spec, flavors)
    budget = _parse_budget(e, f"{path}.budget", spec.get("budget"))
    user_budget = _parse_budget(e, f"{path}.per_user.budget", user_budget_raw)
    if unlimited is True and budget is not None:
        e.add(f"{path}.budget", "an unlimited group has no budget: remove one or the other")
    idle = _parse_idle(e, f"{path}.idle", spec.get("idle"))
    max_runtime = None
    if spec.get("max_runtime") is not None:
        max_runtime = e.convert(f"{path}.max_runtime", spec["max_runtime"], parse_duration)
    queue = e.string(f"{path}.queue", spec.get("queue")) or name
    parent = e.string(f"{path}.parent", spec.get("parent"))
    return Group(
        name=name,
        display_name=e.string(f"{path}.display_name", spec.get("display_name"))
        or ("Everyone" if name == "everyone" else name),
        profiles=tuple(p for p in names if p in profiles),
        quota=quota,
        limit=limit,
        per_user=per_user,
        max_runtime=max_runtime,
        queue=queue,
        parent=parent,
        priority_class=e.string(f"{path}.priority_class", spec.get("priority_class")),
        unlimited=unlimited is True,
        admin=admin is True,
        budget=budget,
        user_budget=user_budget,
        idle=idle,
        directory_groups=_parse_directory_groups(
            e, f"{path}.directory_groups", spec.get("directory_groups")
        ),
        share=_parse_share(e, f"{path}.share", spec.get("share", 1)),
        interfaces=_parse_names(
            e, f"{path}.interfaces", spec.get("interfaces"), interfaces or {}, "interface"
        ),
        datasets=_parse_names(
            e, f"{path}.datasets", spec.get("datasets"), datasets or {}, "dataset"
        )
        or (),
        when_full=_parse_when_full(e, f"{path}.when_full", spec.get("when_full")),
    )


def _parse_when_full(e: _Errors, path: str, raw: Any) -> str | None:
    """``refuse`` or ``wait``; None (not set) where ``raw`` is None."""
    if raw is not None and raw not in WHEN_FULL:
        e.add(path, f"expected refuse or wait, got {raw!r}")
        return None
    return raw


def _parse_names(
    e: _Errors, path: str, raw: Any, known: Mapping[str, Any], what: str
) -> tuple[str, ...] | None:
    """A list naming some of ``known`` (a group's or profile's interfaces or datasets);
    None when it is not set."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        e.add(path, f"expected a list of {what} names, got {raw!r}")
        return None
    names = []
    for i, name in enumerate(raw):
        if name not in known:
            listed = ", ".join(known) or f"none defined: add GPUPolicy.{what}s"
            e.add(f"{path}[{i}]", f"no {what} named {name!r} ({what}s: {listed})")
        elif name in names:
            e.add(f"{path}[{i}]", f"{name!r} is listed twice")
        else:
            names.append(name)
    return tuple(names)


#: a server-relative URL path, as JupyterHub's default_url takes it
_URL_PATH = re.compile(r"^/(?!/)[^\s?#]*(\?[^\s#]*)?$")


def _parse_interfaces(e: _Errors, raw: Any) -> dict[str, Interface]:
    parsed = {}
    for name, spec in e.mapping("interfaces", raw).items():
        path = f"interfaces.{name}"
        spec = e.mapping(path, spec)
        e.keys(path, spec, {"display_name", "url"})
        url = e.string(f"{path}.url", spec.get("url"), required=True)
        if url is not None and (not _URL_PATH.match(url) or ".." in url.split("/")):
            e.add(
                f"{path}.url",
                f"expected a path on the user's server such as /lab or /vscode/, got {url!r}",
            )
            url = None
        if url is not None:
            display = e.string(f"{path}.display_name", spec.get("display_name")) or str(name)
            parsed[str(name)] = Interface(str(name), display, url)
    return parsed


_DATASET_KEYS = {"display_name", "description", "nfs", "claim", "csi", "mount_path", "read_only"}
#: where a single-user image keeps its own files: a dataset mounted at or under one
#: of these would hide the server's software (the home, /home/jovyan, is checked
#: against the chart's volumes at start-up)
_IMAGE_PATHS = (
    "/usr",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/opt/conda",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/var/lib",
    "/run",
)
#: directories a dataset may be under but not at
_IMAGE_DIRECTORIES = ("/", "/home", "/tmp", "/opt", "/var")


def _hides_image_files(mount_path: str) -> bool:
    path = mount_path.rstrip("/") or "/"
    return path in _IMAGE_DIRECTORIES or any(
        path == top or path.startswith(top + "/") for top in _IMAGE_PATHS
    )


def _parse_dataset(e: _Errors, name: str, raw: Any) -> Dataset | None:
    path = f"datasets.{name}"
    spec = e.mapping(path, raw)
    e.keys(path, spec, _DATASET_KEYS)
    given = [k for k in ("nfs", "claim", "csi") if k in spec]
    if len(given) != 1:
        e.add(
            path,
            "give exactly one of nfs: {server, path}, claim: <PersistentVolumeClaim name> or "
            f"csi: {{driver, volume_attributes}} (got {', '.join(given) or 'none'})",
        )
        return None
    read_only = spec.get("read_only", False)
    if not isinstance(read_only, bool):
        e.add(f"{path}.read_only", f"expected true or false, got {read_only!r}")
        read_only = False
    mount_path = e.string(f"{path}.mount_path", spec.get("mount_path"), required=True)
    if mount_path is not None:
        parts = mount_path.split("/")
        if not mount_path.startswith("/") or ".." in parts or "" in parts[1:-1]:
            e.add(
                f"{path}.mount_path",
                f"expected an absolute path such as /data/{name}, got {mount_path!r}",
            )
            mount_path = None
        elif _hides_image_files(mount_path):
            e.add(
                f"{path}.mount_path",
                f"{mount_path} would hide the image's own files: mount under /data or the like",
            )
            mount_path = None
    kind = given[0]
    source: dict[str, Any] | None = None
    if kind == "nfs":
        nfs = e.mapping(f"{path}.nfs", spec["nfs"])
        e.keys(f"{path}.nfs", nfs, {"server", "path"})
        server = e.string(f"{path}.nfs.server", nfs.get("server"), required=True)
        export = e.string(f"{path}.nfs.path", nfs.get("path"), required=True)
        if export is not None and not export.startswith("/"):
            e.add(f"{path}.nfs.path", f"expected the export's absolute path, got {export!r}")
        elif server and export:
            source = {"nfs": {"server": server, "path": export, "readOnly": read_only}}
    elif kind == "claim":
        claim = e.string(f"{path}.claim", spec["claim"])
        if claim is not None and not _DNS_SUBDOMAIN.match(claim):
            e.add(f"{path}.claim", f"not a PersistentVolumeClaim name: {claim!r}")
        elif claim is not None:
            source = {"persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}
    else:
        csi = e.mapping(f"{path}.csi", spec["csi"])
        e.keys(f"{path}.csi", csi, {"driver", "volume_attributes", "fs_type"})
        driver = e.string(f"{path}.csi.driver", csi.get("driver"), required=True)
        attributes = e.string_map(f"{path}.csi.volume_attributes", csi.get("volume_attributes"))
        fs_type = e.string(f"{path}.csi.fs_type", csi.get("fs_type"))
        if driver:
            volume: dict[str, Any] = {"driver": driver, "readOnly": read_only}
            if attributes:
                volume["volumeAttributes"] = attributes
            if fs_type:
                volume["fsType"] = fs_type
            source = {"csi": volume}
    if source is None or mount_path is None:
        return None
    return Dataset(
        name=str(name),
        display_name=e.string(f"{path}.display_name", spec.get("display_name")) or str(name),
        description=e.string(f"{path}.description", spec.get("description")) or "",
        mount_path=mount_path.rstrip("/") or "/",
        read_only=read_only,
        source=source,
    )


def _check_dataset_mounts(
    e: _Errors, policy_groups: Mapping[str, Group], every: Group, datasets: Mapping[str, Dataset]
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


def _parse_share(e: _Errors, path: str, raw: Any) -> float:
    """A fair-share weight: a number above 0 (a share of 0 would never go first)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        e.add(path, f"expected a number above 0 such as 1 or 2.5, got {raw!r}")
        return 1.0
    try:
        share = float(raw)
    except ValueError:
        share = float("nan")
    if not math.isfinite(share) or share <= 0:
        e.add(path, f"expected a number above 0 such as 1 or 2.5, got {raw!r}")
        return 1.0
    return share


def _parse_fair_share(e: _Errors, raw: Any) -> FairShare | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw:
        e.add(
            "fair_share",
            f"expected a mapping like {{half_life: 7d, max_wait: 30m}}, got {raw!r}",
        )
        return None
    spec = raw
    e.keys("fair_share", spec, {"half_life", "max_wait"})
    if "half_life" not in spec:
        e.add(
            "fair_share.half_life",
            "required: how fast past GPU time is forgotten (e.g. 7d: a week ago counts half)",
        )
    half_life = max_wait = None
    for key in ("half_life", "max_wait"):
        if key in spec:
            try:
                value = parse_duration(spec[key])
            except QuantityError:
                e.add(
                    f"fair_share.{key}",
                    f"expected a duration like {'7d' if key == 'half_life' else '30m'}, "
                    f"got {spec[key]!r}",
                )
                continue
            if key == "half_life":
                half_life = value
            else:
                max_wait = value
    if half_life is None:
        return None
    return FairShare(half_life=half_life, max_wait=max_wait or FairShare.max_wait)


def _parse_budget(e: _Errors, path: str, raw: Any) -> Budget | None:
    if raw is None:
        return None
    spec = e.mapping(path, raw)
    e.keys(path, spec, {"gpu_hours", "period", "when_exhausted", "grace"})
    for required in ("gpu_hours", "period"):
        if required not in spec:
            e.add(f"{path}.{required}", "required (e.g. {gpu_hours: 40, period: 7d})")
    gpu_hours = period = None
    if "gpu_hours" in spec:
        gpu_hours = e.convert(f"{path}.gpu_hours", spec["gpu_hours"], parse_number)
        if gpu_hours is not None and gpu_hours <= 0:
            e.add(f"{path}.gpu_hours", f"expected a positive number, got {spec['gpu_hours']!r}")
            gpu_hours = None
    if "period" in spec:
        period = e.convert(f"{path}.period", spec["period"], parse_duration)
    when = spec.get("when_exhausted", "warn")
    if when not in WHEN_EXHAUSTED:
        e.add(f"{path}.when_exhausted", f"expected warn or stop, got {when!r}")
        when = "warn"
    grace = Budget.grace
    if "grace" in spec:
        if when != "stop":
            e.add(
                f"{path}.grace",
                "only a budget with when_exhausted: stop has a grace period before the stop",
            )
        grace = e.convert(f"{path}.grace", spec["grace"], parse_duration) or grace
    if gpu_hours is None or period is None:
        return None
    return Budget(gpu_hours=gpu_hours, period=period, when_exhausted=when, grace=grace)


def _parse_idle(e: _Errors, path: str, raw: Any) -> Idle | None:
    if raw is None:
        return None
    spec = e.mapping(path, raw)
    e.keys(path, spec, {"after", "gpu_utilization_below"})
    if "after" not in spec:
        e.add(f"{path}.after", "required: how long a server's GPUs may idle (e.g. 2h)")
        return None
    after = e.convert(f"{path}.after", spec["after"], parse_duration)
    below = spec.get("gpu_utilization_below", Idle.gpu_utilization_below)
    if isinstance(below, bool) or not isinstance(below, int | float) or not 0 < below <= 100:
        e.add(
            f"{path}.gpu_utilization_below",
            f"expected a percentage above 0 and at most 100, got {below!r}",
        )
        return None
    return Idle(after=after, gpu_utilization_below=float(below)) if after else None


_SCHEDULER_DEFAULTS = {
    # KAI's own priority classes: interactive "build" is never preempted,
    # "build-preemptible" may be when its queue is over quota
    "kai": ("build", "build-preemptible"),
}


def _parse_scheduler(e: _Errors, raw: Any) -> Scheduler:
    if isinstance(raw, str):
        raw = {"name": raw}
    spec = e.mapping("scheduler", raw)
    e.keys("scheduler", spec, {"name", "in_quota_priority_class", "over_quota_priority_class"})
    name = spec.get("name", "default")
    if name not in SCHEDULERS:
        e.add("scheduler.name", f"expected one of {', '.join(SCHEDULERS)}, got {name!r}")
        name = "default"
    base = Scheduler()
    in_quota, over_quota = _SCHEDULER_DEFAULTS.get(
        name, (base.in_quota_priority_class, base.over_quota_priority_class)
    )
    return Scheduler(
        name=name,
        in_quota_priority_class=e.string(
            "scheduler.in_quota_priority_class", spec.get("in_quota_priority_class")
        )
        or in_quota,
        over_quota_priority_class=e.string(
            "scheduler.over_quota_priority_class", spec.get("over_quota_priority_class")
        )
        or over_quota,
    )


def parse_policy(
    *,
    scheduler: Any = None,
    flavors: Any = None,
    profiles: Any = None,
    everyone: Any = None,
    groups: Any = None,
    when_full: Any = "refuse",
    namespace_per_group: Any = False,
    namespace_prefix: Any = "jupyterhub-gpu-",
    extra_labels: Any = None,
    adopted_servers_group: Any = None,
    adopted_servers_preemptible: Any = False,
    fair_share: Any = None,
    interfaces: Any = None,
    datasets: Any = None,
    adopt_namespaces: Any = None,
    egress: Any = None,
    prefix: str = PREFIX,
) -> Policy:
    """Check every part of a policy; return the model or raise PolicyError with all problems."""
    e = _Errors(prefix)
    sched = _parse_scheduler(e, scheduler)
    parsed_interfaces = _parse_interfaces(e, interfaces)
    known_interfaces = {
        **{str(n): None for n in e.mapping("interfaces", interfaces)},
        **parsed_interfaces,
    }
    parsed_datasets = {}
    for name, raw in e.mapping("datasets", datasets).items():
        dataset = _parse_dataset(e, str(name), raw)
        if dataset:
            parsed_datasets[str(name)] = dataset
    known_datasets = {**{str(n): None for n in e.mapping("datasets", datasets)}, **parsed_datasets}
    parsed_flavors = {}
    for name, raw in e.mapping("flavors", flavors).items():
        flavor = _parse_flavor(e, str(name), raw, sched.name)
        if flavor:
            parsed_flavors[str(name)] = flavor
    # references to flavors that failed to parse are reported where they are defined
    known_flavors = {str(n): parsed_flavors.get(str(n)) for n in e.mapping("flavors", flavors)}
    parsed_profiles = {}
    for name, raw in e.mapping("profiles", profiles).items():
        profile = _parse_profile(
            e, str(name), raw, {k: v for k, v in known_flavors.items() if v}, known_interfaces
        )
        if profile:
            parsed_profiles[str(name)] = profile
    every = _parse_group(
        e,
        "everyone",
        "everyone",
        everyone,
        parsed_profiles,
        parsed_flavors,
        known_interfaces,
        known_datasets,
    )
    parsed_groups = {}
    for name, raw in e.mapping("groups", groups).items():
        if name == "everyone":
            e.add("groups.everyone", "'everyone' is the top-level everyone: key, not a group")
            continue
        group = _parse_group(
            e,
            f"groups.{name}",
            str(name),
            raw,
            parsed_profiles,
            parsed_flavors,
            known_interfaces,
            known_datasets,
        )
        if group:
            parsed_groups[str(name)] = group
    _check_parents(e, parsed_groups)
    if when_full not in WHEN_FULL:
        e.add("when_full", f"expected refuse or wait, got {when_full!r}")
    if not isinstance(namespace_per_group, bool):
        e.add("namespace_per_group", f"expected true or false, got {namespace_per_group!r}")
    elif namespace_per_group:
        _check_namespaces(e, str(namespace_prefix), [*parsed_groups, "everyone"])
    adopted = _parse_adopt_namespaces(
        e, adopt_namespaces, namespace_per_group is True, str(namespace_prefix), parsed_groups
    )
    parsed_egress = _parse_egress(e, egress, namespace_per_group is True)
    labels = e.string_map("extra_labels", extra_labels)
    for key, template in labels.items():
        try:
            template.format(username="u", group="g", profile="p", flavor="f", servername="s")
        except (KeyError, IndexError, ValueError) as err:
            e.add(
                f"extra_labels.{key}",
                f"unknown placeholder {err} (use {{username}}, {{group}}, {{profile}}, "
                "{{flavor}} or {{servername}})",
            )
    if adopted_servers_group is not None and adopted_servers_group not in (
        *parsed_groups,
        "everyone",
    ):
        known = ", ".join([*parsed_groups, "everyone"])
        e.add(
            "adopted_servers_group",
            f"expected one of the policy's groups ({known}), got {adopted_servers_group!r}",
        )
    if not isinstance(adopted_servers_preemptible, bool):
        e.add(
            "adopted_servers_preemptible",
            f"expected true or false, got {adopted_servers_preemptible!r}",
        )
    parsed_fair_share = _parse_fair_share(e, fair_share)
    if every is not None:
        _check_dataset_mounts(e, parsed_groups, every, parsed_datasets)
        _check_interfaces(e, parsed_interfaces, parsed_profiles, [*parsed_groups.values(), every])
    if e.items:
        raise PolicyError(e.items)
    assert every is not None
    return Policy(
        scheduler=sched,
        flavors=parsed_flavors,
        profiles=parsed_profiles,
        everyone=every,
        groups=parsed_groups,
        when_full=when_full,
        namespace_per_group=namespace_per_group,
        namespace_prefix=str(namespace_prefix),
        extra_labels=labels,
        adopted_servers_group=adopted_servers_group,
        adopted_servers_preemptible=adopted_servers_preemptible,
        fair_share=parsed_fair_share,
        interfaces=parsed_interfaces,
        datasets=parsed_datasets,
        adopt_namespaces=adopted,
        egress=parsed_egress,
    )


def _check_interfaces(
    e: _Errors,
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


def dns_label(text: str) -> str:
    """A valid object name (RFC 1123 label: lowercase, digits, '-') made from any text.

    Group names come from identity providers (``cpsHPCAccess``, ``jupyter_admin``);
    namespaces, queues and their labels need names Kubernetes accepts.
    """
    return _DNS_LABEL_BAD.sub("-", text.lower())[:63].strip("-")


def is_system_namespace(namespace: str) -> bool:
    """A namespace of Kubernetes itself (``kube-*``) or the one every user shares."""
    return namespace in SYSTEM_NAMESPACES or namespace.startswith("kube-")


def _check_namespaces(e: _Errors, prefix: str, groups: list[str]) -> None:
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
    e: _Errors, raw: Any, per_group: bool, prefix: str, groups: Mapping[str, Group]
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


_EGRESS_KEYS = frozenset(
    {"deny_private", "allow_public", "allow_cidrs", "deny_cidrs", "allow_dataset_servers"}
)


def _parse_egress(e: _Errors, raw: Any, per_group: bool) -> Egress | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        e.add(
            "egress",
            f"expected a mapping like {{deny_private: true, allow_cidrs: [10.20.0.0/16]}}, "
            f"got {raw!r}",
        )
        return None
    e.keys("egress", raw, _EGRESS_KEYS)
    flags = {}
    for key in ("deny_private", "allow_public", "allow_dataset_servers"):
        value = raw.get(key, True)
        if not isinstance(value, bool):
            e.add(f"egress.{key}", f"expected true or false, got {value!r}")
        flags[key] = value is not False
    allow = _cidrs(e, "egress.allow_cidrs", raw.get("allow_cidrs"))
    deny = _cidrs(e, "egress.deny_cidrs", raw.get("deny_cidrs"))
    if not per_group:
        e.add(
            "egress",
            "applies to group namespaces, and there are none without namespace_per_group: "
            "turn namespace_per_group on (servers in the hub's namespace are z2jh's "
            "singleuser.networkPolicy's to restrict)",
        )
    if deny and not flags["allow_public"]:
        e.add(
            "egress.deny_cidrs",
            "has no effect with allow_public: false, which denies every address not "
            "allowed: remove deny_cidrs, or allow_public",
        )
    if not flags["deny_private"] and flags["allow_public"] and not deny:
        e.add(
            "egress",
            "denies nothing (deny_private: false, allow_public: true and no deny_cidrs): "
            "set deny_private: true, list deny_cidrs, or remove egress",
        )
    return Egress(
        deny_private=flags["deny_private"],
        allow_public=flags["allow_public"],
        allow_cidrs=allow,
        deny_cidrs=deny,
        allow_dataset_servers=flags["allow_dataset_servers"],
    )


def _cidrs(e: _Errors, path: str, raw: Any) -> tuple[str, ...]:
    """Networks in CIDR notation (a bare address is that one address), normalised."""
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, list | tuple):
        e.add(path, f"expected a list of networks like [10.20.0.0/16], got {raw!r}")
        return ()
    networks: list[str] = []
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            e.add(f"{path}[{i}]", f"expected a network like 10.20.0.0/16, got {item!r}")
            continue
        try:
            network = ipaddress.ip_network(item.strip(), strict=True)
        except ValueError as err:
            if "host bits set" in str(err):
                fixed = ipaddress.ip_network(item.strip(), strict=False)
                e.add(f"{path}[{i}]", f"{item!r} has host bits set: write {str(fixed)!r}")
            else:
                e.add(f"{path}[{i}]", f"expected a network like 10.20.0.0/16, got {item!r}")
            continue
        if str(network) in networks:
            e.add(f"{path}[{i}]", f"{item!r} is listed twice")
        else:
            networks.append(str(network))
    return tuple(networks)


def _check_parents(e: _Errors, groups: Mapping[str, Group]) -> None:
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
