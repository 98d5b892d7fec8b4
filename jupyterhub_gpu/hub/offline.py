"""What the hub would offer and create, computed offline from values files.

``jupyterhub-gpu profiles`` and ``pod`` run the real spawner code
(``GPUKubeSpawner.load_user_options`` and KubeSpawner's ``get_pod_manifest``)
against an empty ledger, so admins see exactly what users get. No cluster is
contacted: the spawner's client points at a closed loopback port.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import kube_config

from ..config.values import hub_config, load_values, policy_from_config
from ..core.selection import offers

_OFFLINE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    # port 9 (discard) on loopback: nothing is ever sent, and nothing listens
    "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
    "users": [{"name": "offline", "user": {"token": "offline"}}],
    "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "offline"}}],
    "current-context": "offline",
}


class _Named:
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def offered_profiles(paths: list[str], groups: list[str]) -> list[dict[str, Any]]:
    """The KubeSpawner ``profile_list`` a member of ``groups`` sees on an empty cluster."""
    from ..core.admission import Ledger
    from ..core.profiles import profile_entry

    policy = policy_from_config(hub_config(load_values(paths)))
    return [profile_entry(policy, Ledger(), offer) for offer in offers(policy, groups)]


async def render_pod(
    paths: list[str],
    user: str,
    groups: list[str],
    profile: str | None,
    options: dict[str, str],
    hub_namespace: str | None = None,
) -> dict[str, Any]:
    """The Pod manifest spawn would create, or ``SpawnRefused`` with the user's message;
    ``hub_namespace``: the release's namespace (z2jh sets the spawner's to it)."""
    config = hub_config(load_values(paths))
    if hub_namespace:
        config.KubeSpawner.namespace = hub_namespace
    policy_from_config(config)  # a policy error is reported as such, before anything else
    # no cluster to ask whether the datasets' claims exist (the command says so)
    config.GPUKubeSpawner.check_dataset_claims = False
    spawner = offline_spawner(config, user, groups)
    spawner.user_options = {**({"profile": profile} if profile else {}), **options}
    await spawner.load_user_options()
    pod = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
    # KubeSpawner names the namespace when it creates the pod; show it here
    pod["metadata"]["namespace"] = spawner.namespace
    return pod


@contextlib.contextmanager
def _unreachable_cluster() -> Iterator[None]:
    """KubeSpawner's client set-up pointed at a closed loopback port, for as long as a
    spawner is made: the process's own Kubernetes configuration is put back after."""
    saved_location = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    saved_default = Configuration.get_default_copy()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(_OFFLINE_KUBECONFIG))
        # read by KubeSpawner's client set-up; KUBECONFIG itself was read at import
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(kubeconfig)
        try:
            yield
        finally:
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved_location
            Configuration.set_default(saved_default)


def offline_spawner(config, user: str, groups: list[str], admission=None):
    """A GPUKubeSpawner for ``user`` whose Kubernetes client can reach nothing, admitting
    against ``admission`` (default: its own, of an empty cluster)."""
    from .admission import SpawnAdmission
    from .spawner import GPUKubeSpawner

    hub_user = _Named(
        name=user,
        id=1,
        url=f"/user/{user}/",
        groups=[_Named(name=g) for g in groups],
    )
    config = copy.deepcopy(config)
    # there is no cluster to watch: say nothing about its capacity
    config.GPUKubeSpawner.show_cluster_capacity = False
    with _unreachable_cluster():
        return GPUKubeSpawner(
            _mock=True,
            config=config,
            user=hub_user,
            admission=admission or SpawnAdmission.empty_cluster(),
        )
