"""The parsers of the policy's sections: a flavor, a profile, a group, a dataset...

Each reads its mapping through its keys (``keys``: types, defaults, the checks of
single keys, unknown keys) and adds what relates keys to each other or to the rest
of the policy: a limit at least its quota, a profile's flavor one the policy
defines, the resource a MIG strategy requests. Each error names its key path and
what to write instead; a section that cannot be built is None (its errors said
why). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .keys import (
    AMOUNTS,
    BUDGET,
    CSI,
    DATASET,
    EVERYONE_EXCLUDES,
    FLAVOR,
    FLAVOR_KINDS,
    GPU_REQUEST,
    GROUP,
    IDLE,
    INTERFACE,
    NFS,
    OPTION,
    OPTIONS,
    PROFILE,
    UNLISTED_CHOICE,
)
from .rates import parse_billing
from .schema import Errors, Reader
from .types import (
    Amounts,
    Budget,
    Dataset,
    Flavor,
    GpuRequest,
    Group,
    Idle,
    Interface,
    Option,
    Profile,
)

# what a group's name must be to serve as a label value, a queue and a namespace suffix
_NAME = re.compile(r"^[a-z0-9A-Z]([a-z0-9A-Z_.-]{0,61}[a-z0-9A-Z])?$")
#: each kind's keys with every flavor's
_FLAVOR_KEYS = {kind: FLAVOR + own for kind, own in FLAVOR_KINDS.items()}
_EVERYONE_KEYS = GROUP.names - EVERYONE_EXCLUDES


def parse_flavor(e: Errors, name: str, raw: Any, scheduler: str) -> Flavor | None:
    path = f"flavors.{name}"
    r = Reader(e, path, raw, FLAVOR, check_unknown=False)
    kind = r["kind"]
    if kind is None:
        return None
    r.check_unknown(_FLAVOR_KEYS[kind])  # which keys it may have depends on its kind
    common: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "tolerations": r["tolerations"],
        "display_name": r["display_name"] or name,
        "node_selector": r["node_selector"],
        "runtime_class_name": r["runtime_class_name"],
        "billing": parse_billing(e, f"{path}.billing", r["billing"]),
    }
    if kind == "gpu":
        # a DeviceClass whose extendedResourceName is this resource: a DRA driver serves
        # it (Kubernetes' extended-resource bridge); absent, a device plugin
        return Flavor(resource=r["resource"], device_class=r["device_class"], **common)
    if kind == "mig":
        return _mig(e, path, r, common)
    if kind in ("timeslice", "mps"):
        replicas = r["replicas"]
        resource = r["resource"]
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
        if ("gpu_fraction" in r) == ("gpu_memory" in r):
            e.add(path, "set exactly one of gpu_fraction (e.g. 0.5) or gpu_memory (MiB)")
            return None
        return Flavor(
            gpu_fraction=r["gpu_fraction"],
            gpu_memory=r["gpu_memory"],
            device_memory=r["device_memory"],
            **common,
        )
    if kind == "hami":
        return Flavor(
            resource="nvidia.com/gpu",
            gpu_memory=r["gpu_memory"],
            gpucores=r["gpucores"],
            device_memory=r["device_memory"],
            scheduler_name=r["scheduler_name"],
            **common,
        )
    return Flavor(
        device_class=r["device_class"],
        selectors=r["selectors"],
        sharing=r["sharing"],
        dra_equivalents=r["gpu_equivalents"],
        **common,
    )


def _mig(e: Errors, path: str, r: Reader, common: dict[str, Any]) -> Flavor | None:
    profile = r["profile"]
    strategy = r["strategy"]
    product = r["product"]
    if strategy == "single" and not product:
        e.add(
            f"{path}.product",
            "required with strategy: single (the GPU model, e.g. NVIDIA-A100-SXM4-40GB), "
            "to select nodes labelled <product>-MIG-<profile>",
        )
    if profile is None:
        return None
    resource = (
        f"nvidia.com/mig-{profile.replace('+', '.')}" if strategy == "mixed" else "nvidia.com/gpu"
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


# ---- profiles ---------------------------------------------------------------------

#: an option's label in the form when it names none
_OPTION_LABELS = {"gpus": "GPUs", "flavor": "GPU type", "image": "Image"}


def _parse_options(e: Errors, path: str, raw: Any, flavors: Mapping[str, Any]) -> dict[str, Option]:
    options: dict[str, Option] = {}
    for name, spec in e.mapping(path, raw).items():
        opath = f"{path}.{name}"
        if name not in OPTIONS.names:
            e.add(opath, f"unknown option (allowed: {', '.join(OPTIONS)})")
            continue
        r = Reader(e, opath, spec, OPTION)
        display = r["display_name"] or _OPTION_LABELS[name]
        raw_choices = r["choices"]
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
        unlisted = _parse_unlisted(e, f"{opath}.unlisted_choice", name, r["unlisted_choice"])
        options[name] = Option(name, display, tuple(choices), *unlisted)
    return options


def _parse_unlisted(e: Errors, path: str, option: str, raw: Any) -> tuple[str | None, str]:
    """``unlisted_choice: {validation_regex, display_name}``: images only, and never unchecked."""
    if raw is None:
        return None, UNLISTED_CHOICE["display_name"].default
    if option != "image":
        e.add(
            path,
            "only the image option takes unlisted choices (GPU counts and flavors are charged)",
        )
        return None, ""
    r = Reader(e, path, raw, UNLISTED_CHOICE)
    return r["validation_regex"], r["display_name"]


def _parse_gpu(e: Errors, path: str, raw: Any, flavors: Mapping[str, Flavor]) -> GpuRequest | None:
    if raw is None:
        return None
    r = Reader(e, path, raw, GPU_REQUEST)
    flavor = r["flavor"]
    count = r["count"]
    if flavor not in flavors:
        e.add(
            f"{path}.flavor",
            f"no flavor named {flavor!r} (flavors: {', '.join(flavors) or 'none defined'})",
        )
        return None
    if count is None:
        return None
    if flavors[flavor].kind == "fraction" and count != 1:
        e.add(f"{path}.count", "a fraction flavor is one slice per server: use 1")
    return GpuRequest(flavor, count)


def parse_profile(
    e: Errors,
    name: str,
    raw: Any,
    flavors: Mapping[str, Flavor],
    interfaces: Mapping[str, Interface] | None = None,
) -> Profile | None:
    path = f"profiles.{name}"
    r = Reader(e, path, raw, PROFILE)
    if "--" in name:
        e.add(path, "a profile name may not contain '--' (it separates group and profile in slugs)")
    cpu = r["cpu"]
    memory = r["memory"]
    cpu_limit = r["cpu_limit"]
    if cpu_limit is not None and cpu is not None and cpu_limit < cpu:
        e.add(f"{path}.cpu_limit", f"must be >= cpu ({r.written('cpu')})")
    memory_limit = r["memory_limit"]
    if memory_limit is not None and memory is not None and memory_limit < memory:
        e.add(f"{path}.memory_limit", f"must be >= memory ({r.written('memory')})")
    gpu = _parse_gpu(e, f"{path}.gpu", r["gpu"], flavors)
    options = _parse_options(e, f"{path}.options", r["options"], flavors)
    if options and gpu is None and ("gpus" in options or "flavor" in options):
        e.add(f"{path}.options", "gpus and flavor options need the profile to have a gpu")
    if gpu and "gpus" in options and gpu.count not in [v for _, v in options["gpus"].choices]:
        e.add(f"{path}.options.gpus.choices", f"must include the profile's gpu.count ({gpu.count})")
    if gpu and "flavor" in options and gpu.flavor not in [v for _, v in options["flavor"].choices]:
        e.add(
            f"{path}.options.flavor.choices",
            f"must include the profile's gpu.flavor ({gpu.flavor})",
        )
    override = r["kubespawner_override"]
    default = r["default"]
    if cpu is None or memory is None:
        return None
    return Profile(
        name=name,
        display_name=r["display_name"] or name,
        description=r["description"],
        cpu=cpu,
        memory=memory,
        cpu_limit=cpu_limit,
        memory_limit=memory_limit,
        image=r["image"],
        gpu=gpu,
        options=options,
        default=default,
        kubespawner_override=override,
        interfaces=parse_names(
            e, f"{path}.interfaces", r["interfaces"], interfaces or {}, "interface"
        ),
    )


# ---- groups -----------------------------------------------------------------------


def _parse_amounts(e: Errors, path: str, raw: Any, flavors: Mapping[str, Flavor]) -> Amounts:
    r = Reader(e, path, raw, AMOUNTS)
    gpus, cpu, memory, servers = r["gpus"], r["cpu"], r["memory"], r["servers"]
    per_flavor = {}
    for flavor, count in e.mapping(f"{path}.flavors", r["flavors"]).items():
        if flavor not in flavors:
            e.add(f"{path}.flavors.{flavor}", f"no flavor named {flavor!r}")
        elif (n := e.whole(f"{path}.flavors.{flavor}", count)) is not None:
            per_flavor[flavor] = n
    return Amounts(gpus=gpus, cpu=cpu, memory=memory, servers=servers, flavors=per_flavor)


def _check_limit(e: Errors, path: str, quota: Amounts, limit: Amounts) -> Amounts:
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


def parse_group(
    e: Errors,
    path: str,
    name: str,
    raw: Any,
    profiles: Mapping[str, Profile],
    flavors: Mapping[str, Flavor],
    interfaces: Mapping[str, Interface] | None = None,
    datasets: Mapping[str, Dataset] | None = None,
) -> Group:
    r = Reader(e, path, raw, GROUP, allowed=_EVERYONE_KEYS if name == "everyone" else None)
    if name != "everyone" and (not _NAME.match(name) or "--" in name):
        e.add(
            path,
            "a group name must be 1-63 letters, digits, '-', '_' or '.', start and end "
            "with a letter or digit, and not contain '--'",
        )
    names = r["profiles"]
    if not isinstance(names, list):
        e.add(f"{path}.profiles", f"expected a list of profile names, got {names!r}")
        names = []
    for i, profile in enumerate(names):
        if profile not in profiles:
            e.add(
                f"{path}.profiles[{i}]",
                f"no profile named {profile!r} (profiles: {', '.join(profiles) or 'none defined'})",
            )
    unlimited, admin = r["unlimited"], r["admin"]
    quota = _parse_amounts(e, f"{path}.quota", r["quota"], flavors)
    limit_raw = _parse_amounts(e, f"{path}.limit", r["limit"], flavors)
    if unlimited and not (quota.is_empty() and limit_raw.is_empty()):
        e.add(
            f"{path}.unlimited", "an unlimited group has no quota or limit: remove one or the other"
        )
    limit = _check_limit(e, path, quota, limit_raw)
    offers_gpus = any(profiles[p].gpu for p in names if p in profiles)
    if offers_gpus and not unlimited and limit.gpus is None:
        gpu_profiles = [p for p in names if p in profiles and profiles[p].gpu]
        e.add(
            f"{path}.quota.gpus",
            f"required: the group offers GPU profiles ({', '.join(gpu_profiles)}); "
            "set a number of GPU-equivalents, or unlimited: true",
        )
    # per_user's own budget is a budget; the rest are caps like the quota's
    per_user_spec = dict(e.mapping(f"{path}.per_user", r["per_user"]))
    user_budget_raw = per_user_spec.pop("budget", None)
    per_user = _parse_amounts(e, f"{path}.per_user", per_user_spec, flavors)
    budget = parse_budget(e, f"{path}.budget", r["budget"])
    user_budget = parse_budget(e, f"{path}.per_user.budget", user_budget_raw)
    if unlimited and budget is not None:
        e.add(f"{path}.budget", "an unlimited group has no budget: remove one or the other")
    idle = _parse_idle(e, f"{path}.idle", r["idle"])
    max_runtime = r["max_runtime"]
    queue = r["queue"] or name
    parent = r["parent"]
    return Group(
        name=name,
        display_name=r["display_name"] or ("Everyone" if name == "everyone" else name),
        profiles=tuple(p for p in names if p in profiles),
        quota=quota,
        limit=limit,
        per_user=per_user,
        max_runtime=max_runtime,
        queue=queue,
        parent=parent,
        priority_class=r["priority_class"],
        unlimited=unlimited,
        admin=admin,
        budget=budget,
        user_budget=user_budget,
        idle=idle,
        directory_groups=r["directory_groups"],
        share=r["share"],
        interfaces=parse_names(
            e, f"{path}.interfaces", r["interfaces"], interfaces or {}, "interface"
        ),
        datasets=parse_names(e, f"{path}.datasets", r["datasets"], datasets or {}, "dataset") or (),
        when_full=r["when_full"],
        account=r["account"],
    )


def parse_names(
    e: Errors, path: str, raw: Any, known: Mapping[str, Any], what: str
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


def parse_budget(e: Errors, path: str, raw: Any) -> Budget | None:
    if raw is None:
        return None
    r = Reader(e, path, raw, BUDGET)
    r.require("period")
    gpu_hours, units = r["gpu_hours"], r["units"]  # each checked, whatever the other
    if ("gpu_hours" in r) == ("units" in r):
        e.add(
            path,
            "give exactly one of gpu_hours or units (e.g. {gpu_hours: 40, period: 7d}, or "
            "{units: 100, period: 30d} in billed units)",
        )
        return None
    period, when = r["period"], r["when_exhausted"]
    if "grace" in r and when != "stop":
        e.add(
            f"{path}.grace",
            "only a budget with when_exhausted: stop has a grace period before the stop",
        )
    grace = r["grace"]
    if (gpu_hours is None and units is None) or period is None:
        return None
    return Budget(gpu_hours=gpu_hours, period=period, when_exhausted=when, grace=grace, units=units)


def _parse_idle(e: Errors, path: str, raw: Any) -> Idle | None:
    if raw is None:
        return None
    r = Reader(e, path, raw, IDLE)
    if "after" not in r:
        r.require("after")
        return None
    after = r["after"]
    below = r["gpu_utilization_below"]
    if below is None:
        return None
    return Idle(after=after, gpu_utilization_below=below) if after else None


# ---- interfaces and datasets ------------------------------------------------------


def parse_interfaces(e: Errors, raw: Any) -> dict[str, Interface]:
    parsed = {}
    for name, spec in e.mapping("interfaces", raw).items():
        r = Reader(e, f"interfaces.{name}", spec, INTERFACE)
        url = r["url"]
        if url is not None:
            parsed[str(name)] = Interface(str(name), r["display_name"] or str(name), url)
    return parsed


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
#: a dataset's source: exactly one is given
_SOURCES = ("nfs", "claim", "csi")


def _hides_image_files(mount_path: str) -> bool:
    path = mount_path.rstrip("/") or "/"
    return path in _IMAGE_DIRECTORIES or any(
        path == top or path.startswith(top + "/") for top in _IMAGE_PATHS
    )


def parse_dataset(e: Errors, name: str, raw: Any) -> Dataset | None:
    path = f"datasets.{name}"
    r = Reader(e, path, raw, DATASET)
    given = [k for k in _SOURCES if k in r]
    if len(given) != 1:
        e.add(
            path,
            "give exactly one of nfs: {server, path}, claim: <PersistentVolumeClaim name> or "
            f"csi: {{driver, volume_attributes}} (got {', '.join(given) or 'none'})",
        )
        return None
    read_only = r["read_only"]
    mount_path = _mount_path(e, path, name, r["mount_path"])
    source = _source(e, path, given[0], r, read_only)
    if source is None or mount_path is None:
        return None
    return Dataset(
        name=str(name),
        display_name=r["display_name"] or str(name),
        description=r["description"],
        mount_path=mount_path.rstrip("/") or "/",
        read_only=read_only,
        source=source,
    )


def _mount_path(e: Errors, path: str, name: str, mount_path: str | None) -> str | None:
    if mount_path is None:
        return None
    parts = mount_path.split("/")
    if not mount_path.startswith("/") or ".." in parts or "" in parts[1:-1]:
        e.add(
            f"{path}.mount_path",
            f"expected an absolute path such as /data/{name}, got {mount_path!r}",
        )
        return None
    if _hides_image_files(mount_path):
        e.add(
            f"{path}.mount_path",
            f"{mount_path} would hide the image's own files: mount under /data or the like",
        )
        return None
    return mount_path


def _source(e: Errors, path: str, kind: str, r: Reader, read_only: bool) -> dict | None:
    """The pod volume's source, as Kubernetes writes it."""
    if kind == "nfs":
        nfs = Reader(e, f"{path}.nfs", r["nfs"], NFS)
        server, export = nfs["server"], nfs["path"]
        if server and export:
            return {"nfs": {"server": server, "path": export, "readOnly": read_only}}
        return None
    if kind == "claim":
        claim = r["claim"]
        if claim is None:
            return None
        return {"persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}
    csi = Reader(e, f"{path}.csi", r["csi"], CSI)
    driver, attributes, fs_type = csi["driver"], csi["volume_attributes"], csi["fs_type"]
    if not driver:
        return None
    volume: dict[str, Any] = {"driver": driver, "readOnly": read_only}
    if attributes:
        volume["volumeAttributes"] = attributes
    if fs_type:
        volume["fsType"] = fs_type
    return {"csi": volume}
