"""The hub's config as this bundle reads it, and the check that stops a hub with a bad policy.

JupyterHub imports the spawner class while it is still loading its config and
creates spawners only when users start servers, so ``GPUKubeSpawner`` itself
would find a broken policy only at the first spawn. Instead the check runs as
soon as the hub loads its config. z2jh's ``jupyterhub_config.py`` loads every
file in ``/usr/local/etc/jupyterhub/jupyterhub_config.d/``, and the hub image
(``images/hub/Dockerfile``) puts ``jupyterhub_config.d/jupyterhub-gpu.py`` from
this package there. It reads the policy where z2jh itself reads it, from the
chart values (``z2jh.get_config("hub.config.GPUPolicy")``) —
``check_z2jh_values``. The GPU service, started by the hub inside the same pod,
reads the same values the same way (``config_from_z2jh_values``): it cannot run
z2jh's ``jupyterhub_config.py`` itself, which needs the pod's Kubernetes Service
variables that a hub-managed service does not inherit. A plain
``jupyterhub_config.py`` ends with::

    from jupyterhub_gpu.config.hubconfig import check_policy
    check_policy(c)

On an error the hub exits with status 1 before it binds any port, printing every
problem with its key path (the same report as ``jupyterhub-gpu check``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from traitlets.config import Config

from ..core.model import PolicyError, hub_namespace_errors
from .deployment import policy_warnings
from .values import (
    ValuesError,
    check_extra_config,
    policy_from_config,
    service_setting_errors,
    setup_errors,
    spawner_setting,
)

#: the file the hub image installs into z2jh's jupyterhub_config.d
CONFIG_D_FILE = Path(__file__).parent / "jupyterhub_config.d" / "jupyterhub-gpu.py"
#: the config sections of hub.config this bundle reads (the spawner's namespace from
#: KubeSpawner's, or GPUKubeSpawner's where that is set)
BUNDLE_SECTIONS = ("GPUPolicy", "GPUService", "KubeSpawner", "GPUKubeSpawner")


def config_from_z2jh_values(get_config: Callable[..., Any]) -> Config:
    """This bundle's sections of ``hub.config``, applied as z2jh applies them.

    ``get_config`` is z2jh's helper (``z2jh.get_config``) over the mounted chart
    values. ``hub.extraConfig`` runs after everything that reads the values here,
    so a change it makes to ``c.GPUPolicy`` or ``c.GPUService`` would reach the hub
    but not the GPU service: that is an error, never two policies.
    """
    check_extra_config(get_config("hub.extraConfig", None))
    config = Config()
    for section in BUNDLE_SECTIONS:
        settings = get_config(f"hub.config.{section}", None)
        if settings is None:
            continue
        if not isinstance(settings, dict):
            raise ValuesError(
                f"hub.config.{section}: expected a mapping, got {type(settings).__name__}"
            )
        config[section].update(settings)
    return config


def check_policy(
    config: Config, stream: TextIO | None = None, setup: list[str] | None = None
) -> None:
    """Exit (status 1) with every policy error listed; return quietly when the policy is good.

    ``setup``: errors in the hub's other settings that no policy can fix (see
    ``values.setup_errors``); default: those of ``config`` itself, a plain
    ``jupyterhub_config.py``'s ``c``.
    """
    if setup is None:
        setup = setup_errors(config)
    errors = list(setup) + service_setting_errors(config)
    try:
        policy = policy_from_config(config)
    except PolicyError as e:
        errors += e.errors
    else:
        # the hub's own namespace, where z2jh's hub runs: never a group's
        hub_namespace = spawner_setting(config, "namespace") or os.environ.get("POD_NAMESPACE")
        if hub_namespace:
            errors += hub_namespace_errors(policy, hub_namespace)
    if errors:
        out = stream or sys.stderr
        print(
            f"jupyterhub-gpu: the GPU configuration has {len(errors)} "
            f"error{'s' if len(errors) != 1 else ''}; the hub will not start:",
            file=out,
        )
        for error in errors:
            print(f"  {error}", file=out)
        print("Fix these settings (check with `jupyterhub-gpu check VALUES`).", file=out)
        out.flush()
        raise SystemExit(1)
    # valid, but not doing what it says (GPUs out of reach of the CPU or memory quota,
    # an idle rule without its metrics): the hub starts, and its log says so
    for warning in policy_warnings(config, policy):
        print(f"jupyterhub-gpu: warning: {warning}", file=stream or sys.stderr)
    print(
        "jupyterhub-gpu: GPU policy checked: "
        + ", ".join(
            f"{len(things)} {word}{'' if len(things) == 1 else 's'}"
            for things, word in (
                (policy.groups, "group"),
                (policy.profiles, "profile"),
                (policy.flavors, "flavor"),
            )
        ),
        file=stream or sys.stderr,
    )


def check_z2jh_values() -> None:
    """In a z2jh hub pod: check ``hub.config.GPUPolicy`` from the chart values.

    Outside z2jh (no ``z2jh`` helper module on the path) there is nothing to read
    and nothing happens; ``hub.extraConfig`` that changes ``c.GPUPolicy`` is not
    seen here (spawns still check the final policy).
    """
    try:
        from z2jh import get_config  # the chart's helper, beside jupyterhub_config.py
    except ImportError:
        return
    try:
        config = config_from_z2jh_values(get_config)
    except ValuesError as e:
        print(f"jupyterhub-gpu: {e}; the hub will not start", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    sections = get_config("hub.config", None) or {}
    check_policy(
        config,
        setup=setup_errors(
            sections, get_config("singleuser.profileList", None), get_config("singleuser", None)
        ),
    )
