"""Every key of the policy, declared once: its type, default, check and a line of help.

The parser reads the policy through these sections (``sections``, ``parse``), the
unknown-key errors list their names, and ``GPUPolicy``'s help and the configuration
reference are written from them (``reference``). A new key is a ``Key`` in its
section here, the field it fills in ``types`` and, in its section's parser, the line
that reads it. The settings themselves, ``GPUPolicy.<name>``, are in ``settings``.
Pure: no I/O.
"""

from __future__ import annotations

from jupyterhub_gpu.core.quantities import (
    parse_bytes,
    parse_duration,
    parse_millicores,
    parse_number,
)

from . import checks
from .schema import (
    Checked,
    Choice,
    Derived,
    Flag,
    Key,
    KeyType,
    Labels,
    Quantity,
    Section,
    Text,
    Whole,
    section,
)

SCHEDULERS = ("default", "kai", "volcano", "kueue")
#: what a spawn does when a cap is reached (``GPUPolicy.when_full``, a group's)
WHEN_FULL = ("refuse", "wait")
WHEN_EXHAUSTED = ("warn", "stop")
#: what fair share's decayed usage counts (``GPUPolicy.fair_share.count``)
FAIR_SHARE_COUNTS = ("gpu_hours", "billed_units")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

GPUS = Quantity(parse=parse_number, doc="GPU-equivalents (a number)")
CPUS = Quantity(parse=parse_millicores, doc="CPUs (quantity: `2`, `500m`)")
MEMORY = Quantity(parse=parse_bytes, doc="bytes (quantity: `16Gi`)")
DURATION = Quantity(parse=parse_duration, doc="duration (`90m`, `8h`, `7d`)")
MIB = Whole(minimum=1, doc="MiB (whole number)")
#: names of other parts of the policy, or a mapping with keys of its own: the
#: section's parser checks them (against the rest of the policy)
NAMES = KeyType(doc="list of names")
MAPPING = KeyType(doc="mapping (below)")


# ---- flavors --------------------------------------------------------------------

_DISPLAY_NAME = Key("display_name", Text(), "the name users see", Derived("its name"))
_REPLICAS = Key(
    "replicas",
    Whole(minimum=1),
    "replicas each device is shared into; one is 1/replicas GPU-equivalents",
    required=True,
)
_SHARED_RESOURCE = Key(
    "resource",
    Text(),
    "the extended resource a server requests one of",
    "nvidia.com/gpu.shared",
)
_DEVICE_MEMORY = Key(
    "device_memory", MIB, "memory of one whole device, to count a share in GPU-equivalents"
)
#: each kind's own keys, beside ``FLAVOR``'s
FLAVOR_KINDS = {
    "gpu": section(
        "flavors.<name> with kind: gpu",
        Key("resource", Text(), "the extended resource requested", "nvidia.com/gpu"),
        Key(
            "device_class",
            Text(),
            "the DeviceClass whose `extendedResourceName` is `resource`: a DRA driver "
            "serves it (the extended-resource bridge); unset, a device plugin does",
            null_unset=True,
        ),
        help="Whole GPUs: 1 GPU-equivalent each.",
    ),
    "mig": section(
        "flavors.<name> with kind: mig",
        Key(
            "profile",
            Text(doc="MIG profile (`1g.5gb`)"),
            "the MIG slice; a `Ng.*` slice is N/7 GPU-equivalents",
            required=True,
            check=checks.mig_profile,
        ),
        Key(
            "strategy",
            Choice(values=("mixed", "single")),
            "the GPU operator's MIG strategy: `mixed` requests `nvidia.com/mig-<profile>`, "
            "`single` `nvidia.com/gpu` on nodes labelled `<product>-MIG-<profile>`",
            "mixed",
        ),
        Key("product", Text(), "the GPU model, e.g. `NVIDIA-A100-SXM4-40GB` (strategy single)"),
        help="A MIG slice of a GPU.",
    ),
    "timeslice": section(
        "flavors.<name> with kind: timeslice",
        _REPLICAS,
        _SHARED_RESOURCE,
        help="A time-sliced replica of a GPU.",
    ),
    "mps": section(
        "flavors.<name> with kind: mps",
        _REPLICAS,
        _SHARED_RESOURCE,
        help="An MPS replica of a GPU.",
    ),
    "fraction": section(
        "flavors.<name> with kind: fraction",
        Key(
            "gpu_fraction",
            Quantity(parse=parse_number, doc="number between 0 and 1"),
            "the share of a GPU (this or gpu_memory)",
            check=checks.between_0_and_1,
        ),
        Key("gpu_memory", MIB, "the GPU memory of the share (this or gpu_fraction)"),
        _DEVICE_MEMORY,
        help="A KAI GPU share (needs `scheduler.name: kai`).",
    ),
    "hami": section(
        "flavors.<name> with kind: hami",
        Key("gpu_memory", MIB, "the vGPU's memory", required=True),
        Key(
            "gpucores",
            Whole(minimum=1, doc="percentage (1-100)"),
            "the share of the GPU's cores",
            check=checks.percentage,
        ),
        _DEVICE_MEMORY,
        Key("scheduler_name", Text(), "the scheduler of its servers' pods", "hami-scheduler"),
        help="A HAMi vGPU.",
    ),
    "dra": section(
        "flavors.<name> with kind: dra",
        Key("device_class", Text(), "the DeviceClass of the claimed devices", "gpu.nvidia.com"),
        Key(
            "selectors",
            Checked(check=checks.cel_expressions, doc="list of CEL expressions"),
            "which devices of the class may be claimed",
            [],
        ),
        Key(
            "sharing",
            Choice(values=("TimeSlicing", "MPS")),
            "how a claimed device is shared",
            null_unset=True,
        ),
        Key(
            "gpu_equivalents",
            Quantity(parse=parse_number, doc="number > 0"),
            "GPU-equivalents each claimed device is charged; unset, admission charges the "
            "MIG partition the selectors require (its slices/7), else 1, and GPU time the "
            "device allocated (a whole GPU 1, a MIG partition its slices/7)",
            null_unset=True,
            check=checks.above_zero,
        ),
        help="A Dynamic Resource Allocation claim of devices.",
    ),
}
KINDS = tuple(FLAVOR_KINDS)

FLAVOR = section(
    "flavors.<name>",
    Key("kind", Choice(values=KINDS), "what it is (each kind's own keys below)", required=True),
    Key(
        "tolerations",
        Checked(check=checks.tolerations, doc="list of tolerations"),
        "taints its servers' pods tolerate",
        [GPU_TOLERATION],
        default_words="the `nvidia.com/gpu` taint",
    ),
    _DISPLAY_NAME,
    Key("node_selector", Labels(), "node labels its servers' pods must run on (merged)", {}),
    Key("runtime_class_name", Text(), "the RuntimeClass its servers' pods run with"),
    Key(
        "billing",
        KeyType(doc="mapping, or list of mappings"),
        "what an hour of it is billed: `{weight, price}`, or such rates each `from` a date",
        null_unset=True,
    ),
    help="Every flavor's keys, whatever its kind.",
)
RATE = section(
    "flavors.<name>.billing",
    Key(
        "weight",
        Quantity(parse=parse_number, doc="number > 0"),
        "billed units per GPU-equivalent-hour",
        1,
        check=checks.positive,
    ),
    Key(
        "price",
        Quantity(parse=parse_number, doc="number ≥ 0"),
        "money per GPU-equivalent-hour, in `GPUPolicy.currency`",
    ),
    Key(
        "from",
        Checked(check=checks.moment, doc="date, or date and time with offset"),
        "when the rate begins (every rate of a list but the first)",
    ),
    help="A list of rates bills each hour at the rate in force then, never again at a later one.",
)

# ---- profiles ---------------------------------------------------------------------

_OPTION = KeyType(doc="option (below)")
GPU_REQUEST = section(
    "profiles.<name>.gpu",
    Key(
        "flavor",
        KeyType(doc="flavor name"),
        "the flavor of its GPUs (a name in `flavors`)",
        required=True,
    ),
    Key("count", Whole(minimum=1), "how many (a fraction flavor: 1)", 1),
)
OPTIONS = section(
    "profiles.<name>.options",
    Key("gpus", _OPTION, "the GPU counts a user may choose"),
    Key("flavor", _OPTION, "the flavors a user may choose"),
    Key("image", _OPTION, "the images a user may choose"),
    help="What a user chooses in the spawn form; each is an option (below).",
)
OPTION = section(
    "profiles.<name>.options.<option>",
    Key(
        "choices",
        KeyType(doc="list (image: or mapping name → image)"),
        "what may be chosen: GPU counts, flavor names or images; must include the profile's own",
        required=True,
    ),
    Key("display_name", Text(), "the option's label", Derived("GPUs, GPU type or Image")),
    Key(
        "unlisted_choice",
        MAPPING,
        "(image only) let users type an image, checked against a regex",
    ),
)
UNLISTED_CHOICE = section(
    "profiles.<name>.options.image.unlisted_choice",
    Key(
        "validation_regex",
        Text(doc="regular expression"),
        "what a typed image must match, whole",
        required=True,
        check=checks.regular_expression,
    ),
    Key("display_name", Text(), "the label of the typed choice", "Other image..."),
)
PROFILE = section(
    "profiles.<name>",
    Key("cpu", CPUS, "CPUs guaranteed (and the limit, unless cpu_limit)", "1"),
    Key("memory", MEMORY, "memory guaranteed (and the limit, unless memory_limit)", "1Gi"),
    Key("cpu_limit", CPUS, "the most CPU it may use (at least cpu)"),
    Key("memory_limit", MEMORY, "the most memory it may use (at least memory)"),
    Key("gpu", MAPPING, "its GPUs: `{flavor, count}`", null_unset=True),
    Key("options", KeyType(doc="mapping"), "what a user may choose: `gpus`, `flavor`, `image`"),
    Key(
        "kubespawner_override",
        Checked(check=checks.overrides, doc="mapping"),
        "KubeSpawner settings the policy does not account (environment, ...)",
        {},
    ),
    Key("default", Flag(), "the profile the form selects first", False),
    _DISPLAY_NAME,
    Key("description", Text(), "a line under its name in the form", ""),
    Key("image", Text(), "the single-user image (else the chart's)"),
    Key(
        "interfaces",
        NAMES,
        "which of `interfaces` it can open (else any its group offers)",
        null_unset=True,
    ),
    help="A notebook template offered to groups.",
)

# ---- interfaces and datasets ------------------------------------------------------

INTERFACE = section(
    "interfaces.<name>",
    Key(
        "url",
        Text(doc="path on the server"),
        "where the server opens, e.g. `/lab` or `/vscode/`",
        required=True,
        check=checks.url_path,
    ),
    Key("display_name", Text(), "the name users see", Derived("its name")),
)
NFS = section(
    "datasets.<name>.nfs",
    Key("server", Text(), "the NFS server's name or address", required=True),
    Key("path", Text(), "the export's absolute path", required=True, check=checks.absolute_export),
)
CSI = section(
    "datasets.<name>.csi",
    Key("driver", Text(), "the CSI driver (one that serves inline volumes)", required=True),
    Key("volume_attributes", Labels(), "the driver's volume attributes", {}),
    Key("fs_type", Text(), "the filesystem type"),
)
DATASET = section(
    "datasets.<name>",
    Key("nfs", MAPPING, "an NFS export, mounted inline: `{server, path}`"),
    Key(
        "claim",
        Text(doc="PersistentVolumeClaim name"),
        "an existing PersistentVolumeClaim in the server's namespace",
        check=checks.claim_name,
    ),
    Key("csi", MAPPING, "an inline CSI volume: `{driver, volume_attributes}`"),
    Key("read_only", Flag(), "mount it read-only", False),
    Key(
        "mount_path",
        Text(doc="absolute path"),
        "where servers see it, e.g. `/data/imagenet`",
        required=True,
    ),
    _DISPLAY_NAME,
    Key("description", Text(), "what it holds", ""),
    help="Give exactly one of `nfs`, `claim` or `csi`.",
)

# ---- groups -----------------------------------------------------------------------

AMOUNTS = section(
    "quota, limit",
    Key("gpus", GPUS, "GPU-equivalents"),
    Key("cpu", CPUS, "CPUs"),
    Key("memory", MEMORY, "memory"),
    Key("servers", Whole(minimum=0), "servers"),
    Key(
        "flavors",
        KeyType(doc="mapping: flavor → count"),
        "devices of each flavor (a name in `flavors`)",
    ),
    help="Caps on what the group's servers hold together; unset: not capped "
    "(a limit's: the quota's).",
)
BUDGET = section(
    "budget, per_user.budget",
    Key(
        "gpu_hours",
        Quantity(parse=parse_number, doc="number > 0"),
        "GPU-equivalent-hours in each period (this or `units`)",
        check=checks.positive,
    ),
    Key(
        "units",
        Quantity(parse=parse_number, doc="number > 0"),
        "billed units in each period, each hour at its flavor's `billing` weight",
        check=checks.positive,
    ),
    Key(
        "period",
        DURATION,
        "the rolling window",
        required="required (e.g. {gpu_hours: 40, period: 7d})",
    ),
    Key(
        "when_exhausted",
        Choice(values=WHEN_EXHAUSTED),
        "used up: `warn` running servers' users, or `stop` them",
        "warn",
    ),
    Key("grace", DURATION, "between the notice and the stop (when_exhausted: stop)", "15m"),
    help="GPU time in a rolling window; used up, new GPU servers are refused.",
)
PER_USER = section(
    "per_user",
    *AMOUNTS.keys.values(),
    Key("budget", MAPPING, "each member's own budget", null_unset=True),
    help="Each member's caps within the group (as `quota`), and budget.",
)
IDLE = section(
    "idle",
    Key(
        "after",
        DURATION,
        "how long a server's GPUs may idle before the notice",
        required="required: how long a server's GPUs may idle (e.g. 2h)",
    ),
    Key(
        "gpu_utilization_below",
        Checked(check=checks.utilization, doc="percentage"),
        "at or above it, the GPU is busy",
        5.0,
    ),
    help="Stop servers whose GPUs idle, after a notice.",
)
GROUP = section(
    "groups.<name>",
    Key("profiles", NAMES, "the profiles its members may start (names in `profiles`)", []),
    Key("quota", MAPPING, "guaranteed: `gpus`, `flavors`, `cpu`, `memory`, `servers`"),
    Key("limit", MAPPING, "the burst ceiling (≥ quota; above quota preemptible)"),
    Key("per_user", MAPPING, "each member's caps, and `budget`"),
    Key("budget", MAPPING, "GPU time in a rolling window", null_unset=True),
    Key("idle", MAPPING, "stop servers whose GPUs idle", null_unset=True),
    Key("max_runtime", DURATION, "servers are stopped after this long", null_unset=True),
    Key("queue", Text(), "its scheduler queue", Derived("the group's name")),
    Key("parent", Text(), "the group whose quota, limit and budget cap it and its siblings"),
    Key(
        "account",
        Text(),
        "the cost centre or grant code its use is billed to",
        Derived("its parent's"),
    ),
    _DISPLAY_NAME,
    Key(
        "priority_class",
        Text(),
        "the PriorityClass of its servers within quota (else the scheduler's)",
    ),
    Key("unlimited", Flag(), "no quota, limit or budget", False),
    Key("admin", Flag(), "its members see every group's usage in the GPU service", False),
    Key(
        "directory_groups",
        Checked(check=checks.directory_groups, doc="list of names, DNs, IDs or paths", unset=()),
        "the directory groups whose members are its members (else its own name)",
        null_unset=True,
    ),
    Key(
        "share",
        Checked(check=checks.share, doc="number > 0"),
        "its fair-share weight among its siblings",
        1,
    ),
    Key(
        "interfaces",
        NAMES,
        "which of `interfaces` its servers can open (else the first)",
        null_unset=True,
    ),
    Key(
        "datasets",
        NAMES,
        "which of `datasets` its servers mount (with its parents')",
        null_unset=True,
    ),
    Key(
        "when_full",
        Choice(values=WHEN_FULL),
        "what its spawns do when a cap is reached",
        Derived("its parent's, else `GPUPolicy.when_full`"),
        null_unset=True,
    ),
    help="A JupyterHub group, by name (from the identity provider or the hub's admin).",
)
#: what ``everyone`` may not have: every user is in it, whatever the directory says
EVERYONE_EXCLUDES = frozenset({"parent", "unlimited", "admin", "directory_groups"})

# ---- whole-policy settings ----------------------------------------------------------

SCHEDULER = section(
    "scheduler",
    Key("name", Choice(values=SCHEDULERS), "the cluster's scheduler", "default"),
    Key(
        "in_quota_priority_class",
        Text(),
        "the PriorityClass of servers within their group's quota",
        Derived("KAI's `build`, else `jupyterhub-gpu-in-quota`"),
    ),
    Key(
        "over_quota_priority_class",
        Text(),
        "the PriorityClass of servers between quota and limit (preemptible)",
        Derived("KAI's `build-preemptible`, else `jupyterhub-gpu-over-quota`"),
    ),
)
FAIR_SHARE = section(
    "fair_share",
    Key(
        "half_life",
        Quantity(parse=parse_duration, wrong="a duration like 7d", doc=DURATION.doc),
        "how fast past GPU time is forgotten (a half-life ago counts half)",
        required="required: how fast past GPU time is forgotten (e.g. 7d: a week ago counts half)",
    ),
    Key(
        "max_wait",
        Quantity(parse=parse_duration, wrong="a duration like 30m", doc=DURATION.doc),
        "waiting longer, a server goes first whatever its standing",
        "1h",
    ),
    Key(
        "count",
        Choice(values=FAIR_SHARE_COUNTS),
        "what usage counts: GPU-equivalent-hours, or billed units (each hour times its "
        "flavor's billing `weight` in force then, so an hour of a heavier flavor weighs more)",
        "gpu_hours",
    ),
)
EGRESS = section(
    "egress",
    Key("deny_private", Flag(), "deny the private, shared and link-local ranges", True),
    Key("allow_public", Flag(), "allow every other address (false: only what is allowed)", True),
    Key(
        "allow_cidrs",
        Checked(check=checks.cidrs, doc="list of networks", unset=()),
        "networks allowed even inside denied ones",
        null_unset=True,
    ),
    Key(
        "deny_cidrs",
        Checked(check=checks.cidrs, doc="list of networks", unset=()),
        "more networks to deny, e.g. the site's own public range",
        null_unset=True,
    ),
    Key(
        "allow_dataset_servers",
        Flag(),
        "allow the NFS servers of a group's datasets written as addresses",
        True,
    ),
)

__all__ = [
    "AMOUNTS",
    "BUDGET",
    "CSI",
    "DATASET",
    "EGRESS",
    "EVERYONE_EXCLUDES",
    "FAIR_SHARE",
    "FAIR_SHARE_COUNTS",
    "FLAVOR",
    "FLAVOR_KINDS",
    "GPU_REQUEST",
    "GPU_TOLERATION",
    "GROUP",
    "IDLE",
    "INTERFACE",
    "KINDS",
    "NFS",
    "OPTION",
    "OPTIONS",
    "PER_USER",
    "PROFILE",
    "RATE",
    "SCHEDULER",
    "SCHEDULERS",
    "UNLISTED_CHOICE",
    "WHEN_EXHAUSTED",
    "WHEN_FULL",
    "Section",
]
