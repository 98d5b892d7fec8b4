"""The policy's model: the frozen dataclasses ``parse_policy`` returns, and the one cap
check (``Amounts.first_passed``) that selection, admission and the runtime rules share.

What the admin may write and how it is checked is the parser's (``keys``: each key
declared once; ``sections`` and ``parse``: the policy read through them);
``jupyterhub_gpu.core.model`` gathers both under the names the rest of the package
imports. Pure: no I/O.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from jupyterhub_gpu.core.quantities import format_bytes, format_cpu, format_gpus

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
_DNS_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
#: a DRA selector that requires a MIG partition of one profile: NVIDIA's driver gives
#: each partition a ``profile`` attribute (``3g.71gb``), and a whole GPU none
_SELECTED_MIG = re.compile(r"""\.profile\s*==\s*['"](\d+)g\.""")
#: compute slices of a GPU that MIG partitions (A100, H100, H200)
_MIG_SLICES = 7


class PolicyError(ValueError):
    """The policy is wrong; ``errors`` lists every problem with its key path."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def selected_mig_slices(selectors: Iterable[str]) -> int | None:
    """The compute slices of the MIG partition a dra flavor's selectors require (``3``
    for ``device.attributes['gpu.nvidia.com'].profile == '3g.71gb'``), or None where
    they do not require one: a selector counts only where it is a plain conjunction
    (no ``||``, no ``!`` but ``!=``), so every device it accepts has that profile.
    Two selectors that name different profiles accept no device; the larger counts."""
    found = [
        int(match.group(1))
        for selector in selectors
        if "||" not in selector and "!" not in selector.replace("!=", "")
        for match in _SELECTED_MIG.finditer(selector)
    ]
    return min(max(found), _MIG_SLICES) if found else None


@dataclass(frozen=True)
class Rate:
    """What an hour of a flavor is billed from ``since`` (epoch seconds; -inf: always)
    until the flavor's next rate: ``weight`` billed units and ``price`` (in
    ``GPUPolicy.currency``; None: not priced) per GPU-equivalent-hour."""

    since: float = -math.inf
    weight: float = 1.0
    price: float | None = None


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
    #: dra: GPU-equivalents per device as the policy sets them (None: at admission the
    #: MIG partition its selectors require, else 1; GPU time counts what each device
    #: allocated is, see ``core.dra``)
    dra_equivalents: Fraction | None = None
    scheduler_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    runtime_class_name: str | None = None
    #: what an hour of it is billed, oldest rate first (empty: 1 unit per
    #: GPU-equivalent-hour, no price)
    billing: tuple[Rate, ...] = ()

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
        if self.dra_equivalents is not None:
            return self.dra_equivalents
        # before allocation: the MIG partition its selectors require, charged as the
        # device plugin's MIG flavors are (and as its GPU time counts it); else a
        # whole GPU (fail closed)
        slices = selected_mig_slices(self.selectors)
        return Fraction(slices, _MIG_SLICES) if slices is not None else Fraction(1)

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


@dataclass(frozen=True)
class Budget:
    """GPU time in a rolling window: ``gpu_hours`` GPU-equivalent-hours per ``period``,
    or (``units`` set) that many billed units, each hour at its flavor's rate."""

    gpu_hours: Fraction | None
    period: int  # seconds
    when_exhausted: str = "warn"  # "warn": tell running servers' users; "stop": stop them
    grace: int = 15 * 60  # seconds between the notice and the stop ("stop" only)
    units: Fraction | None = None

    @property
    def in_units(self) -> bool:
        """Whether it is stated in billed units (else in GPU-hours)."""
        return self.units is not None

    @property
    def amount(self) -> float:
        """What may be used per period, in its own measure (GPU-hours or billed units)."""
        return float(self.units if self.units is not None else self.gpu_hours or 0)


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
    #: the cost centre or grant code its use is billed to (None: its parent's, else
    #: none)
    account: str | None = None


@dataclass(frozen=True)
class FairShare:
    """``GPUPolicy.fair_share``: whoever waits for the same capacity is ordered by GPU
    time used recently (decayed with ``half_life``) against their share; a server
    waiting longer than ``max_wait`` goes first whatever its standing. ``count``:
    what the usage is measured in, ``gpu_hours`` or ``billed_units`` (each hour
    weighted by its flavor's billing weight in force then)."""

    half_life: int  # seconds
    max_wait: int = 3600  # seconds
    count: str = "gpu_hours"


@dataclass(frozen=True)
class Egress:
    """``GPUPolicy.egress``: what servers in group namespaces may connect to. DNS, the
    hub and the proxy, and the servers' own namespace are always allowed."""

    #: deny ``PRIVATE_RANGES`` (except what is allowed below)
    deny_private: bool = True
    #: allow every other address (the public internet); False: only what is listed
    allow_public: bool = True
    #: networks allowed even inside denied ranges (normalised, e.g. ``198.51.100.0/24``)
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
    #: the currency flavors' prices are in (None: no flavor is priced)
    currency: str | None = None
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

    def account_of(self, name: str) -> str | None:
        """The cost centre group ``name``'s use is billed to: its own ``account`` or
        its nearest parent's; None: none is set."""
        for group in self.ancestors(name):
            if group.account is not None:
                return group.account
        return None

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


def dns_label(text: str) -> str:
    """A valid object name (RFC 1123 label: lowercase, digits, '-') made from any text.

    Group names come from identity providers (``cpsHPCAccess``, ``jupyter_admin``);
    namespaces, queues and their labels need names Kubernetes accepts.
    """
    return _DNS_LABEL_BAD.sub("-", text.lower())[:63].strip("-")


def is_system_namespace(namespace: str) -> bool:
    """A namespace of Kubernetes itself (``kube-*``) or the one every user shares."""
    return namespace in SYSTEM_NAMESPACES or namespace.startswith("kube-")
