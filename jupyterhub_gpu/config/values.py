"""Zero to JupyterHub values files, read the way Helm and the hub read them.

Files merge in order like ``helm -f a.yaml -f b.yaml``: mappings merge key by
key, anything else (lists included) is replaced by the later file. The policy is
then taken from ``hub.config.GPUPolicy`` through the same traitlets path the hub
uses (``c.GPUPolicy.update(...)``), so offline checks and the hub agree.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from traitlets import TraitError
from traitlets.config import Config

from ..core.model import PREFIX, Policy, PolicyError, unknown_settings
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
GPU_SPAWNER_NAMES = (
    "gpu-kubespawner",
    "jupyterhub_gpu.spawner.GPUKubeSpawner",
    "jupyterhub_gpu.hub.spawner.GPUKubeSpawner",
)


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
    factor = settings.get("emissions_factor")
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, int | float) or factor < 0
    ):
        errors.append(
            "hub.config.GPUService.emissions_factor: expected grams of CO2 per kWh "
            f"(a number, 0 or more, such as 350), got {factor!r}"
        )
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
