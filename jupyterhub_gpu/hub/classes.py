"""The hub's classes as a deployment's ``hub.config`` names them, for ``jupyterhub-gpu check``.

``JupyterHub.spawner_class`` and ``authenticator_class`` are resolved as
JupyterHub resolves them (an entry point's name, else an import path), and every
``hub.config.<Class>.<trait>`` is checked against the settings traitlets would
apply it to: the named class's own, and those of each class the hub runs whose
ancestors include a class of that name (``Spawner.<trait>`` reaches the
spawner's traits). The hub would only log a misspelt setting and carry on with
the default; here it is an error with the likely setting.

This module imports the classes (JupyterHub, KubeSpawner, the authenticators),
so it sits beside the command line rather than in ``config/``, which reads the
core alone.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from traitlets.config import Configurable

#: the entry point group JupyterHub looks a class's short name up in
ENTRY_POINT_GROUPS = {
    "spawner_class": "jupyterhub.spawners",
    "authenticator_class": "jupyterhub.authenticators",
}
#: what each of this bundle's modules needs installed beside it (pyproject's extras)
EXTRAS = {"jupyterhub_gpu.auth.ldap": "ldap", "jupyterhub_gpu.auth.oidc": "oidc"}
#: the spawner that enforces GPUPolicy, as its import path and its entry point
GPU_SPAWNER = "jupyterhub_gpu.hub.spawner.GPUKubeSpawner"
GPU_SPAWNER_NAME = "gpu-kubespawner"
#: what z2jh's own jupyterhub_config.py sets when the values name no class
Z2JH_DEFAULTS = {"spawner_class": "kubespawner.KubeSpawner", "authenticator_class": "dummy"}
#: sections other checks read key by key (the policy's parser, the service's settings)
CHECKED_ELSEWHERE = frozenset({"GPUPolicy", "GPUService"})
#: classes a hub config often names that no entry point lists, by import path
KNOWN_CLASSES = {
    "JupyterHub": "jupyterhub.app.JupyterHub",
    "Spawner": "jupyterhub.spawner.Spawner",
    "Authenticator": "jupyterhub.auth.Authenticator",
    "LocalAuthenticator": "jupyterhub.auth.LocalAuthenticator",
    "CryptKeeper": "jupyterhub.crypto.CryptKeeper",
    "Proxy": "jupyterhub.proxy.Proxy",
    "KubeSpawner": "kubespawner.KubeSpawner",
    "GPUKubeSpawner": GPU_SPAWNER,
    "OAuthenticator": "oauthenticator.oauth2.OAuthenticator",
    "LDAPAuthenticator": "ldapauthenticator.LDAPAuthenticator",
    "LDAPGroupsAuthenticator": "jupyterhub_gpu.auth.ldap.LDAPGroupsAuthenticator",
    "OIDCGroupsAuthenticator": "jupyterhub_gpu.auth.oidc.OIDCGroupsAuthenticator",
}


@dataclass
class Report:
    """What ``check`` says about the hub's classes: errors (the hub would not start,
    or would run without the policy or with a setting ignored), warnings, and the
    extras the hub image needs."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: (extra, why): ``pip install 'jupyterhub-gpu[extra]'`` in the hub image
    extras: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Resolved:
    """A class named in the config: the class, or why there is none."""

    cls: type | None = None
    #: the class's import path where known without importing it (an entry point's value)
    path: str | None = None
    #: the import error of a class whose module is not installed here
    missing: str | None = None
    #: why the name names no class (a typo, a module), in words
    problem: str | None = None


def _entry_points(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def _import(path: str) -> Resolved:
    module_name, _, attr = path.rpartition(".")
    target: Any
    try:
        target = importlib.import_module(path)
    except ImportError:
        if not module_name:
            return Resolved(path=path, problem="no module or class of that name is installed")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            return Resolved(path=path, missing=f"{type(e).__name__}: {e}")
        if not hasattr(module, attr):
            names = [n for n, v in vars(module).items() if inspect.isclass(v)]
            close = difflib.get_close_matches(attr, names, n=1)
            hint = f"; did you mean {module_name}.{close[0]}?" if close else ""
            return Resolved(path=path, problem=f"{module_name} has no {attr}{hint}")
        target = getattr(module, attr)
    else:
        return Resolved(path=path, problem=f"{path} is a module, not a class")
    if not inspect.isclass(target):
        return Resolved(path=path, problem=f"{path} is not a class")
    return Resolved(cls=target, path=path)


def resolve(key: str, value: Any) -> Resolved:
    """``JupyterHub.<key>`` (``spawner_class`` or ``authenticator_class``) as the hub
    would load it: an entry point's name, an import path, or a class itself."""
    if inspect.isclass(value):
        return Resolved(cls=value, path=f"{value.__module__}.{value.__qualname__}")
    if not isinstance(value, str) or not value:
        return Resolved(problem=f"expected a class's name, got {value!r}")
    named = _entry_points(ENTRY_POINT_GROUPS[key])
    if value in named:
        ep = named[value]
        path = ep.value.replace(":", ".")
        try:
            return Resolved(cls=ep.load(), path=path)
        except ImportError as e:
            return Resolved(path=path, missing=f"{type(e).__name__}: {e}")
    if "." not in value:
        close = difflib.get_close_matches(value, list(named), n=1, cutoff=0.75)
        if close:
            what = key.removesuffix("_class")
            return Resolved(
                problem=f"no installed {what} is called {value!r}; did you mean {close[0]}?"
            )
    return _import(value)


def _is_gpu_spawner(cls: type) -> bool:
    return any(f"{c.__module__}.{c.__qualname__}" == GPU_SPAWNER for c in cls.__mro__)


def _extra_for(path: str | None) -> str | None:
    for module, extra in EXTRAS.items():
        if path and (path == module or path.startswith(module + ".")):
            return extra
    return None


def check_classes(sections: Mapping[str, Any]) -> Report:
    """The hub's classes in ``hub.config`` (``sections``) resolved and its settings
    checked: what ``jupyterhub-gpu check`` reports beside the policy."""
    report = Report()
    jupyterhub = sections.get("JupyterHub")
    jupyterhub = jupyterhub if isinstance(jupyterhub, Mapping) else {}
    has_policy = "GPUPolicy" in sections
    in_use: list[type] = []
    not_checked: set[str] = set()
    for key in ("spawner_class", "authenticator_class"):
        given = jupyterhub.get(key)
        resolved = resolve(key, given if given is not None else Z2JH_DEFAULTS[key])
        where = f"hub.config.JupyterHub.{key}"
        shown = given if given is not None else f"not set (z2jh's {Z2JH_DEFAULTS[key]})"
        extra = _extra_for(resolved.path)
        if extra:
            report.extras.append((extra, f"{key}: {given}"))
        if resolved.cls is not None:
            in_use.append(resolved.cls)
        if key == "spawner_class" and has_policy and resolved.missing:
            # a site's own spawner, perhaps a GPUKubeSpawner subclass, not installed here
            report.warnings.append(
                f"{where}: {given} cannot be imported here ({resolved.missing}): unless it "
                "is GPUKubeSpawner or a subclass of it, hub.config.GPUPolicy is not "
                f"enforced (set spawner_class: {GPU_SPAWNER_NAME}); install it here to "
                "have it checked"
            )
            continue
        if key == "spawner_class" and has_policy:
            if resolved.cls is None or not _is_gpu_spawner(resolved.cls):
                report.errors.append(_unenforced(where, shown, resolved))
            continue
        if resolved.missing:
            name = (resolved.path or "").rpartition(".")[2]
            not_checked.add(name)
            install = (
                f"pip install 'jupyterhub-gpu[{extra}]'"
                if extra
                else "install the package that provides it"
            )
            report.warnings.append(
                f"{where}: {given} cannot be imported here ({resolved.missing}): the hub "
                f"image needs it ({install}); install it here too to have "
                f"hub.config.{name} checked"
            )
        elif resolved.problem:
            report.errors.append(f"{where}: {given}: {resolved.problem} (the hub would not start)")
    report.errors += _trait_errors(sections, in_use, not_checked, report.warnings)
    return report


def _unenforced(where: str, shown: str, resolved: Resolved) -> str:
    """The error for a spawner that would leave ``GPUPolicy`` unenforced."""
    problem = resolved.problem or ""
    if "did you mean" in problem:  # a typo: the hub would not even start
        return f"{where}: {shown}: {problem} (the hub would not start)"
    if resolved.cls is not None:
        what = f"{shown} is {resolved.cls.__name__}, which does not enforce"
    else:
        what = f"{shown} is not GPUKubeSpawner ({problem}), the only spawner that enforces"
    return (
        f"{where}: {what} hub.config.GPUPolicy: servers would start with none of its "
        f"profiles, quotas or GPU checks; set spawner_class: {GPU_SPAWNER_NAME}"
    )


def _class_named(name: str, in_use: list[type]) -> Resolved | None:
    """The class a section names: one the hub runs or an ancestor of one, an entry
    point's class, or a class hub configs often name. None: no known class."""
    for cls in in_use:
        for ancestor in cls.__mro__:
            if ancestor.__name__ == name and issubclass(ancestor, Configurable):
                return Resolved(cls=ancestor)
    for group in (*ENTRY_POINT_GROUPS.values(), "jupyterhub.proxies"):
        for ep in entry_points(group=group):
            if ep.value.rpartition(":")[2] == name:
                path = ep.value.replace(":", ".")
                try:
                    return Resolved(cls=ep.load(), path=path)
                except ImportError as e:
                    return Resolved(path=path, missing=f"{type(e).__name__}: {e}")
    if name in KNOWN_CLASSES:
        return _import(KNOWN_CLASSES[name])
    return None


def _known_names() -> list[str]:
    names = set(KNOWN_CLASSES) | CHECKED_ELSEWHERE
    for group in (*ENTRY_POINT_GROUPS.values(), "jupyterhub.proxies"):
        names |= {ep.value.rpartition(":")[2] for ep in entry_points(group=group)}
    return sorted(names)


def _trait_errors(
    sections: Mapping[str, Any], in_use: list[type], not_checked: set[str], warnings: list[str]
) -> list[str]:
    from jupyterhub.app import JupyterHub

    in_use = [JupyterHub, *in_use]
    errors = []
    for section, settings in sections.items():
        if section in CHECKED_ELSEWHERE or section in not_checked:
            continue
        if not isinstance(settings, Mapping):
            continue  # values.hub_config reports a section that is not a mapping
        named = _class_named(str(section), in_use)
        if named is None:
            close = difflib.get_close_matches(str(section), _known_names(), n=1, cutoff=0.8)
            hint = f"; did you mean hub.config.{close[0]}?" if close else ""
            warnings.append(
                f"hub.config.{section}: no class the hub loads here is called {section}, "
                f"so its settings are not checked{hint}"
            )
            continue
        if named.cls is None:
            warnings.append(
                f"hub.config.{section}: {named.path} cannot be imported here "
                f"({named.missing}), so its settings are not checked"
            )
            continue
        known = set(named.cls.class_traits(config=True))
        for cls in in_use:
            if any(c.__name__ == section for c in cls.__mro__):
                known |= set(cls.class_traits(config=True))
        for trait in settings:
            if trait in known:
                continue
            close = difflib.get_close_matches(str(trait), sorted(known), n=1)
            fix = f"did you mean {close[0]}?" if close else "remove it"
            errors.append(
                f"hub.config.{section}.{trait}: {section} has no setting {trait} (the hub "
                f"would only log a warning and keep the default); {fix}"
            )
    return errors
