"""Zero to JupyterHub values files, read the way Helm and the hub read them.

Files merge in order like ``helm -f a.yaml -f b.yaml``: mappings merge key by
key, anything else (lists included) is replaced by the later file. The policy is
then taken from ``hub.config.GPUPolicy`` through the same traitlets path the hub
uses (``c.GPUPolicy.update(...)``), so offline checks and the hub agree.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from traitlets import TraitError
from traitlets.config import Config

from ..core.model import PREFIX, Amounts, Group, Policy, PolicyError, unknown_settings
from ..core.quantities import format_bytes, format_cpu, format_duration, format_gpus
from ..core.selection import Offer, Request, offers, request_for, units_per_server
from .policy import GPUPolicy
from .service_settings import prometheus_url_error, service_setting_names


class ValuesError(ValueError):
    pass


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        elif value is None and key in merged:
            merged.pop(key)  # helm: null deletes a key
        else:
            merged[key] = value
    return merged


def load_values(paths: list[str | Path]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in paths:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as e:
            raise ValuesError(f"{path}: {e.strerror}") from e
        except yaml.YAMLError as e:
            raise ValuesError(f"{path}: not valid YAML: {e}") from e
        if loaded is None:
            continue
        if not isinstance(loaded, Mapping):
            raise ValuesError(f"{path}: expected a mapping of Helm values at the top level")
        values = merge(values, loaded)
    return values


def hub_config(values: Mapping[str, Any]) -> Config:
    """The traitlets config ``hub.config`` gives the hub (z2jh applies it section by section)."""
    config = Config()
    sections = ((values.get("hub") or {}).get("config")) or {}
    if not isinstance(sections, Mapping):
        raise ValuesError("hub.config: expected a mapping of config sections")
    for section, settings in sections.items():
        if not isinstance(settings, Mapping):
            raise ValuesError(f"hub.config.{section}: expected a mapping")
        config[section].update(settings)
    return config


#: how a hub config may name this bundle's spawner
GPU_SPAWNER_NAMES = ("gpu-kubespawner", "jupyterhub_gpu.spawner.GPUKubeSpawner")


def uses_gpu_spawner(spawner_class: Any) -> bool:
    """``spawner_class`` names GPUKubeSpawner, or is it (or a subclass: a plain
    ``jupyterhub_config.py`` may import the class itself)."""
    if isinstance(spawner_class, type):
        return any(
            f"{cls.__module__}.{cls.__qualname__}" in GPU_SPAWNER_NAMES
            for cls in spawner_class.__mro__
        )
    return spawner_class in GPU_SPAWNER_NAMES


def site_profile_list(
    sections: Mapping[str, Any], chart_profile_list: Any = None
) -> tuple[str, Any] | None:
    """The profile list a site set itself, with its key path, as the spawner gets it.

    z2jh writes ``singleuser.profileList`` (``chart_profile_list``) to
    ``c.KubeSpawner.profile_list`` and applies ``hub.config`` afterwards, where
    ``GPUKubeSpawner`` wins over ``KubeSpawner`` (traitlets merges config along
    the class hierarchy): the last one set is the one the spawner sees.
    """
    found = None
    if chart_profile_list is not None:
        found = ("singleuser.profileList", chart_profile_list)
    for section in ("KubeSpawner", "GPUKubeSpawner"):
        settings = sections.get(section)
        if isinstance(settings, Mapping) and "profile_list" in settings:
            found = (f"hub.config.{section}.profile_list", settings["profile_list"])
    return found


def setup_errors(
    sections: Mapping[str, Any], profile_list: Any = None, singleuser: Any = None
) -> list[str]:
    """Hub settings that would start a hub where no spawn can work, each in words.

    ``sections`` is ``hub.config`` (or a plain config's sections),
    ``profile_list`` the chart's ``singleuser.profileList`` and ``singleuser`` the
    chart's ``singleuser`` values, if any.
    """
    errors = site_gpu_resource_errors(sections, singleuser)
    errors += dataset_mount_errors(sections, singleuser)
    if "GPUPolicy" in sections:
        errors += _user_namespace_errors(sections)
    jupyterhub = sections.get("JupyterHub") or {}
    gpu_spawner = isinstance(jupyterhub, Mapping) and uses_gpu_spawner(
        jupyterhub.get("spawner_class")
    )
    if gpu_spawner and "GPUPolicy" not in sections:
        close = difflib.get_close_matches("GPUPolicy", [str(s) for s in sections], n=1, cutoff=0.6)
        hint = f"; did you mean hub.config.{close[0]} -> GPUPolicy?" if close else ""
        errors.append(
            "hub.config: spawner_class is gpu-kubespawner but there is no GPUPolicy section, "
            f"so nobody could start a server{hint}"
        )
    site_list = site_profile_list(sections, profile_list)
    if "GPUPolicy" in sections and site_list is not None:
        problem = site_profile_list_error(*site_list)
        if problem:
            errors.append(problem)
    return errors


def _is_time_zone(name: object) -> bool:
    try:
        ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return isinstance(name, str)


def spawner_setting(sections: Mapping[str, Any], name: str) -> str | None:
    """A setting of the hub's spawner as traitlets resolves it: a ``GPUKubeSpawner``
    section wins over ``KubeSpawner``. The service reads the spawner's ``namespace``
    and ``component_label`` so: it must see the servers the hub starts."""
    for section in ("GPUKubeSpawner", "KubeSpawner"):
        settings = sections.get(section)
        if isinstance(settings, Mapping) and settings.get(name):
            return str(settings[name])
    return None


def _user_namespace_errors(sections: Mapping[str, Any]) -> list[str]:
    errors = []
    for section in ("KubeSpawner", "GPUKubeSpawner"):
        settings = sections.get(section)
        if isinstance(settings, Mapping) and settings.get("enable_user_namespaces"):
            errors.append(
                f"hub.config.{section}.enable_user_namespaces: a namespace per user is not "
                "supported with the GPU policy (its quotas, usage and rules follow servers "
                "in the hub's namespace, or in one per group): turn it off, and use "
                "GPUPolicy.namespace_per_group to keep groups apart"
            )
    return errors


def site_profile_list_error(key: str, entries: Any) -> str | None:
    """Why a site's own ``profile_list`` (at ``key``) cannot work beside the policy, or
    None when it is empty (z2jh's default), which means the policy's profiles.

    KubeSpawner takes a list, a mapping keyed by slug, or a callable returning a
    list; GPUKubeSpawner offers and admits only the policy's profiles, so any of
    those would show profiles whose every spawn is refused.
    """
    if callable(entries):
        what = "is a callable"
    elif isinstance(entries, list | tuple | Mapping) and entries:
        what = f"has {len(entries)} profile{'s' if len(entries) != 1 else ''}"
    else:
        return None
    # z2jh leaves a null singleuser.profileList out; KubeSpawner refuses a null list
    empty = "null" if key == "singleuser.profileList" else "[]"
    return (
        f"{key} {what} and hub.config.GPUPolicy is set: GPUKubeSpawner offers the "
        f"policy's profiles, so no spawn of those profiles would work; remove {key} "
        f"(or set it to {empty}), or put those profiles in GPUPolicy.profiles"
    )


def values_setup_errors(values: Mapping[str, Any]) -> list[str]:
    """``setup_errors`` for a z2jh values mapping."""
    hub = values.get("hub") or {}
    sections = (hub.get("config") if isinstance(hub, Mapping) else None) or {}
    singleuser = values.get("singleuser") or {}
    profile_list = singleuser.get("profileList") if isinstance(singleuser, Mapping) else None
    return setup_errors(sections if isinstance(sections, Mapping) else {}, profile_list, singleuser)


def dataset_mount_errors(sections: Mapping[str, Any], singleuser: Any = None) -> list[str]:
    """An error for each dataset mounted where the chart already mounts a volume into
    every server: the users' homes (``singleuser.storage.homeMountPath``), the
    chart's extra volume mounts or KubeSpawner's ``volume_mounts``. Kubernetes
    refuses a pod with two volumes at one path, so every spawn would fail."""
    policy = sections.get("GPUPolicy")
    datasets = policy.get("datasets") if isinstance(policy, Mapping) else None
    if not isinstance(datasets, Mapping):
        return []
    taken: dict[str, str] = {}

    def mounts(path: str, items: Any) -> None:
        listed = list(items.values()) if isinstance(items, Mapping) else items
        if not isinstance(listed, list | tuple):
            return
        for item in listed:
            if isinstance(item, Mapping) and isinstance(item.get("mountPath"), str):
                taken.setdefault(item["mountPath"].rstrip("/") or "/", path)

    storage = singleuser.get("storage") if isinstance(singleuser, Mapping) else None
    if isinstance(storage, Mapping) or isinstance(singleuser, Mapping):
        storage = storage if isinstance(storage, Mapping) else {}
        # the chart's default storage is a dynamic claim per user at /home/jovyan
        if storage.get("type", "dynamic") in ("dynamic", "static"):
            home = storage.get("homeMountPath", "/home/jovyan")
            if isinstance(home, str):
                taken.setdefault(home.rstrip("/") or "/", "singleuser.storage.homeMountPath")
        mounts("singleuser.storage.extraVolumeMounts", storage.get("extraVolumeMounts"))
    for section in ("KubeSpawner", "GPUKubeSpawner"):
        settings = sections.get(section)
        if isinstance(settings, Mapping):
            mounts(f"hub.config.{section}.volume_mounts", settings.get("volume_mounts"))
    errors = []
    for name, dataset in datasets.items():
        path = dataset.get("mount_path") if isinstance(dataset, Mapping) else None
        if isinstance(path, str) and (path.rstrip("/") or "/") in taken:
            errors.append(
                f"{PREFIX}.datasets.{name}.mount_path: {path} is where "
                f"{taken[path.rstrip('/') or '/']} mounts a volume into every server "
                "(Kubernetes refuses a pod with two volumes at one path): give the dataset "
                "another mount_path"
            )
    return errors


#: resource names that are GPUs whatever the policy's flavors say
_GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/gpu", "gpu.intel.com/")


def site_gpu_resource_errors(sections: Mapping[str, Any], singleuser: Any = None) -> list[str]:
    """An error for each GPU resource in a setting every server gets.

    With the policy, GPUs belong to its flavors and profiles: a site-wide
    ``singleuser.extraResource`` (KubeSpawner's ``extra_resource_*``), or GPUs in
    ``extra_pod_config`` / ``extra_container_config``, would be added to every
    policy pod, so a CPU-only profile's server would ask for a GPU and be charged
    none. A GPU resource is one a flavor names, or any NVIDIA, AMD or Intel GPU
    resource.
    """
    policy = sections.get("GPUPolicy")
    if not isinstance(policy, Mapping):
        return []
    flavors = policy.get("flavors") or {}
    named = {
        str(f["resource"])
        for f in (flavors.values() if isinstance(flavors, Mapping) else ())
        if isinstance(f, Mapping) and f.get("resource")
    }

    def is_gpu(resource: Any) -> bool:
        return str(resource) in named or str(resource).startswith(_GPU_RESOURCE_PREFIXES)

    fix = (
        "with the GPU policy, GPUs belong to its flavors and profiles (a CPU profile's "
        "server would ask for this GPU and be charged none): remove it here and give "
        "GPUs through GPUPolicy.profiles"
    )
    found: list[str] = []

    def resources(path: str, amounts: Any) -> None:
        if isinstance(amounts, Mapping):
            found.extend(f"{path}.{name}" for name in amounts if is_gpu(name))

    def pod_config(path: str, config: Any) -> None:
        if isinstance(config, Mapping):
            for key in ("resourceClaims", "resource_claims"):
                if config.get(key):
                    found.append(f"{path}.{key}")

    def container_config(path: str, config: Any) -> None:
        if isinstance(config, Mapping) and isinstance(config.get("resources"), Mapping):
            for kind in ("limits", "requests", "claims"):
                amounts = config["resources"].get(kind)
                if kind == "claims":
                    if amounts:
                        found.append(f"{path}.resources.claims")
                else:
                    resources(f"{path}.resources.{kind}", amounts)

    if isinstance(singleuser, Mapping):
        extra = singleuser.get("extraResource")
        if isinstance(extra, Mapping):
            resources("singleuser.extraResource.limits", extra.get("limits"))
            resources("singleuser.extraResource.guarantees", extra.get("guarantees"))
        pod_config("singleuser.extraPodConfig", singleuser.get("extraPodConfig"))
        container_config("singleuser.extraContainerConfig", singleuser.get("extraContainerConfig"))
    for section in ("KubeSpawner", "GPUKubeSpawner"):
        settings = sections.get(section)
        if not isinstance(settings, Mapping):
            continue
        path = f"hub.config.{section}"
        for trait in ("extra_resource_limits", "extra_resource_guarantees"):
            resources(f"{path}.{trait}", settings.get(trait))
        pod_config(f"{path}.extra_pod_config", settings.get("extra_pod_config"))
        container_config(f"{path}.extra_container_config", settings.get("extra_container_config"))
    return [f"{path}: a GPU resource in a setting every server gets; {fix}" for path in found]


def service_setting_errors(config: Mapping[str, Any]) -> list[str]:
    """An error for each ``GPUService`` setting the service does not have (traitlets
    would only warn, and the setting would silently keep its default), and for a
    ``prometheus_url`` that is not a URL Prometheus could be at."""
    settings = config.get("GPUService") or {}
    if not settings:
        return []
    errors = unknown_settings("hub.config.GPUService", settings, service_setting_names())
    zone = settings.get("billing_timezone")
    if zone is not None and not _is_time_zone(zone):
        errors.append(
            f"hub.config.GPUService.billing_timezone: unknown time zone {zone!r}; use an IANA "
            "name such as Europe/Berlin or America/New_York"
        )
    problem = prometheus_url_error(settings.get("prometheus_url", ""))
    if problem:
        errors.append(f"hub.config.GPUService.prometheus_url: {problem}")
    return errors


def check_extra_config(extra_config: Any) -> None:
    """``hub.extraConfig`` must not change this bundle's settings.

    z2jh runs ``hub.extraConfig`` last, after the hub's start-up policy check;
    and the GPU service, which cannot run the hub's config file, reads
    ``hub.config`` only. A change made there to ``c.GPUPolicy`` or
    ``c.GPUService`` would give the hub and the service two policies.
    """
    if not isinstance(extra_config, Mapping):
        return
    for key, code in sorted(extra_config.items()):
        for section in ("GPUPolicy", "GPUService"):
            if section in str(code):
                raise ValuesError(
                    f"hub.extraConfig.{key}: sets {section}, which the GPU service cannot "
                    f"see (it reads hub.config.{section}): move the setting to "
                    f"hub.config.{section}"
                )


def policy_from_config(config: Config) -> Policy:
    try:
        policy = GPUPolicy(config=config)
    except TraitError as e:
        # a section of the wrong type (e.g. groups: [a, b]); traitlets names the trait
        raise PolicyError([f"{PREFIX}: {e}"]) from e
    return policy.model


def policy_from_values(paths: list[str | Path]) -> Policy:
    return policy_from_loaded(load_values(paths))


def policy_from_loaded(values: Mapping[str, Any]) -> Policy:
    """The policy of merged values, with the hub's set-up mistakes among its errors."""
    check_extra_config((values.get("hub") or {}).get("extraConfig"))
    errors = values_setup_errors(values)
    try:
        policy = policy_from_config(hub_config(values))
    except PolicyError as e:
        raise PolicyError(errors + e.errors) from None
    if errors:
        raise PolicyError(errors)
    return policy


def checked_values(
    paths: list[str | Path], overrides: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], Policy]:
    """The merged values and their policy, as ``jupyterhub-gpu check`` checks them:
    a ``PolicyError`` lists every mistake, the service's settings included.
    ``overrides``: values merged last, as one more ``-f`` file would be."""
    values = load_values(paths)
    if overrides:
        values = merge(values, overrides)
    service_errors = service_setting_errors(hub_config(values))
    try:
        policy = policy_from_loaded(values)
    except PolicyError as e:  # every mistake in one report
        raise PolicyError(e.errors + service_errors) from None
    if service_errors:
        raise PolicyError(service_errors)
    return values, policy


def identity_tls_warnings(values: Mapping[str, Any]) -> list[str]:
    """What ``jupyterhub-gpu check`` warns about (without failing): an authenticator
    that talks to the directory or the identity provider without TLS, or with TLS
    whose certificate it does not check, where anyone on the path reads passwords."""
    sections = ((values.get("hub") or {}).get("config")) or {}
    warnings: list[str] = []
    for name in ("LDAPGroupsAuthenticator", "LDAPAuthenticator"):
        section = sections.get(name)
        if not isinstance(section, Mapping):
            continue
        key = f"hub.config.{name}"
        if section.get("tls_strategy") == "insecure":
            warnings.append(
                f"{key}.tls_strategy: insecure sends every user's password to the directory "
                "unencrypted; use on_connect (LDAPS) or before_bind (StartTLS), with "
                "tls_ca_file naming the site's CA if the system's CAs do not sign it"
            )
        validate = (section.get("tls_kwargs") or {}).get("validate")
        if validate is not None and str(validate) in {"0", "CERT_NONE", "ssl.CERT_NONE"}:
            warnings.append(
                f"{key}.tls_kwargs.validate: the directory's certificate is not checked, so "
                "anyone on the path can pose as the directory and read passwords; remove "
                "it, and set tls_ca_file to the CA that signs the directory's certificate"
            )
    for name in ("OIDCGroupsAuthenticator", "GenericOAuthenticator"):
        section = sections.get(name)
        if isinstance(section, Mapping) and section.get("validate_server_cert") is False:
            warnings.append(
                f"hub.config.{name}.validate_server_cert: false does not check the identity "
                "provider's certificate, so anyone on the path can pose as it; remove it "
                "(http_request_kwargs.ca_certs names a site's own CA)"
            )
    return warnings


# ---- what check warns about: a deployment that would not do what it says ------------

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
    return policy_warnings(sections, policy) + usage_database_warnings(values)


def policy_warnings(sections: Mapping[str, Any], policy: Policy) -> list[str]:
    """What the hub's config (``hub.config``'s ``sections``) would not do as it says,
    though it is valid: a group's CPU, memory or server caps that leave its GPU quota
    or limit out of reach, and an idle rule that would judge whole GPUs without
    their metrics."""
    raw_groups = ((sections.get("GPUPolicy") or {}).get("groups")) or {}
    warnings: list[str] = []
    for group in policy.groups.values():
        raw = raw_groups.get(group.name) if isinstance(raw_groups, Mapping) else None
        warnings += unreachable_gpu_warnings(
            policy, group.name, raw if isinstance(raw, Mapping) else {}
        )
    return warnings + idle_without_metrics_warnings(policy, sections.get("GPUService") or {})


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
