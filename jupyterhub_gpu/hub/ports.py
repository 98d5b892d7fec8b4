"""What each part of the hub room needs from the spawner, and nothing more.

The parts (checks, the profile list, the pods the ledger is rebuilt from, the wait in
a scheduler's queue, a server's exit at start) are functions of these ports, not of
``GPUKubeSpawner``: each says which of the spawner's attributes it reads, and a test
may hand it any object that has them. ``GPUKubeSpawner`` is every port at once; the
parts never import it. KubeSpawner's private pod watch is reached through the
spawner's own ``pod_watch`` and ``restart_pod_watch``, one place to mend when
KubeSpawner changes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kubernetes_asyncio.client import CoreV1Api
    from kubespawner.reflector import ResourceReflector

    from ..core.model import Policy
    from ..core.selection import Selection
    from .admission import SpawnAdmission


class KubeAccess(Protocol):
    """The spawner's Kubernetes client and its log."""

    log: logging.Logger
    api: CoreV1Api
    #: how long one Kubernetes API request may take (KubeSpawner's setting)
    k8s_api_request_timeout: int

    @property
    def _log_name(self) -> str: ...


class CheckedSpawn(KubeAccess, Protocol):
    """What a spawn's checks read: the options, the hub's config and request, the
    volumes a dataset mounts beside."""

    config: Any
    handler: Any
    user_options: dict[str, Any]
    volumes: Any
    volume_mounts: Any
    gpu_policy: Policy


class ProfileViewer(KubeAccess, Protocol):
    """What the profile list reads: who asks, in which groups, and the hub's ledger."""

    user: Any
    admission: SpawnAdmission
    show_cluster_capacity: bool

    def _user_groups(self) -> list[str]: ...


class PodOwner(KubeAccess, Protocol):
    """What listing, watching and deleting a user's server pods reads."""

    user: Any
    name: str
    namespace: str
    pod_name: str
    component_label: str
    delete_grace_period: int
    server: Any
    started: bool
    admission: SpawnAdmission
    gpu_policy: Policy

    @property
    def _server_key(self) -> str: ...

    def pod_watch(self) -> ResourceReflector | None: ...

    async def restart_pod_watch(self, replace: bool) -> None: ...


class QueuedSpawn(KubeAccess, Protocol):
    """What the wait in a scheduler's queue reads: the pods' watch and the timeouts."""

    pod_reflector: ResourceReflector
    queue_timeout: float
    start_timeout: int
    wait_poll_interval: float
    gpu_policy: Policy

    @property
    def _server_key(self) -> str: ...


class ExitWatcher(KubeAccess, Protocol):
    """What reading a server's exit at start needs: its pod as the watch holds it."""

    pod_reflector: ResourceReflector


class WatchedPod(Protocol):
    """The server's pod as the hub's pod watch holds it."""

    pod_reflector: ResourceReflector

    @property
    def _server_key(self) -> str: ...


class DeviceHolder(KubeAccess, WatchedPod, Protocol):
    """What naming a DRA server's devices reads: its selection and its start."""

    gpu_selection: Selection | None
    pending: str | None


class EndingServer(KubeAccess, Protocol):
    """What ending a server's GPU time reads: its pod as the watch holds it, the hub's
    ledger and usage."""

    pod_reflector: ResourceReflector
    admission: SpawnAdmission
    gpu_policy: Policy

    @property
    def _server_key(self) -> str: ...

    async def ready_ledger(self) -> Any: ...
