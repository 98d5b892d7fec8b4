"""Where the service finds the hub's policy, and where it listens.

The service reads the hub's own config, so ``hub.config.GPUPolicy`` is one policy
for hub and service. In a z2jh hub pod it reads the chart values through the
chart's ``z2jh`` helper instead of running z2jh's ``jupyterhub_config.py``,
which needs the pod's Kubernetes Service variables a hub-managed service does
not inherit. Never an empty policy in place of the hub's: a config that cannot
be read stops the service (a service without the policy would prune what the
policy created).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from pathlib import Path
from types import ModuleType

from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from ..config.hubconfig import config_from_z2jh_values
from ..config.values import ValuesError
from ..kube.client import in_cluster_namespace

#: where z2jh mounts the hub's config in the hub container
Z2JH_CONFIG = "/usr/local/etc/jupyterhub/jupyterhub_config.py"


def default_config_file() -> str:
    """``$JUPYTERHUB_GPU_CONFIG``, else z2jh's hub config, else ./jupyterhub_config.py."""
    if os.environ.get("JUPYTERHUB_GPU_CONFIG"):
        return os.environ["JUPYTERHUB_GPU_CONFIG"]
    if Path(Z2JH_CONFIG).exists():
        return Z2JH_CONFIG
    return "jupyterhub_config.py"


def z2jh_helper(path: Path) -> ModuleType:
    """The chart's ``z2jh`` helper module, loaded from ``path`` itself.

    Not ``import z2jh``: that would take whichever ``z2jh`` is imported already
    or comes first on the path, not the one beside the hub's config.
    """
    spec = importlib.util.spec_from_file_location("z2jh", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"jupyterhub-gpu-service: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _raised_by_environ(error: KeyError) -> bool:
    """True when the KeyError is ``os.environ[name]`` of a variable that is not set."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    # the frame that raised is os._Environ's (its file may be "<frozen os>")
    return tb is not None and tb.tb_frame.f_globals.get("__name__") == "os"


def listen_address(host: str | None) -> str:
    """Where to listen for a service URL's host (see ``GPUService.ip``)."""
    if not host or host == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return ""  # a name others resolve to this pod: every interface
    return host


def read_hub_config(path: Path) -> tuple[Config, str]:
    """The hub's config, and where the policy came from in words; SystemExit with the
    reason when it cannot be read or sets no GPUPolicy."""
    folder = path.parent.resolve()
    if (folder / "z2jh.py").exists():
        # a z2jh hub pod: the chart's helper beside the config reads the mounted values
        try:
            values = config_from_z2jh_values(z2jh_helper(folder / "z2jh.py").get_config)
        except ValuesError as e:
            raise SystemExit(f"jupyterhub-gpu-service: {e}") from None
        if "GPUPolicy" not in values:
            raise SystemExit(
                f"jupyterhub-gpu-service: the chart values, read by {folder / 'z2jh.py'}, "
                "have no hub.config.GPUPolicy; the service serves the hub's GPU policy and "
                "does not run without one: set hub.config.GPUPolicy (or check that the "
                "hub's values Secret is mounted in the hub pod)"
            )
        return values, "the chart values (hub.config)"
    if "POD_NAMESPACE" not in os.environ and in_cluster_namespace():
        # a hub config may read it (z2jh's does); a managed service does not inherit it
        os.environ["POD_NAMESPACE"] = in_cluster_namespace() or ""
    try:
        loaded = PyFileConfigLoader(path.name, path=str(folder)).load_config()
    except Exception as e:
        if isinstance(e, KeyError) and _raised_by_environ(e):
            raise SystemExit(
                f"jupyterhub-gpu-service: the hub's config file {path} failed to load: "
                f"the environment variable {e} is not set. A hub-managed service gets only "
                "JupyterHub's variables: pass it in the service's `environment` "
                "(c.JupyterHub.services)"
            ) from None
        raise SystemExit(
            f"jupyterhub-gpu-service: the hub's config file {path} failed to load: "
            f"{type(e).__name__}: {e}"
        ) from None
    if "GPUPolicy" not in loaded:
        raise SystemExit(
            f"jupyterhub-gpu-service: the hub's config file {path} sets no GPUPolicy; the "
            "service serves the hub's GPU policy and does not run without one: pass the "
            "hub's own config file (--config PATH or $JUPYTERHUB_GPU_CONFIG)"
        )
    return loaded, str(path)
