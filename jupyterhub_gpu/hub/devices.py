"""The devices a DRA server holds, as the hub sees them: named on the spawn page, and
what its GPU time counts.

kube-scheduler allocates the claims of a server on DRA devices (a ``dra`` flavor's
ResourceClaim, or the claim it makes for a ``gpu`` flavor a DeviceClass serves)
when it places the pod, before the pod runs. The spawn page names those devices
(``device_line``) as soon as the hub's watch of DRA objects, the one the profile
list's capacity is read from (``kube.clusterview``), shows the allocation; the
start reads the pod's claims itself once it finishes (``start_allocation``: two
reads, what the server's GPU time counts), which names them where the watch does
not run (the profile list shows no capacity) or is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kubernetes_asyncio.client import CustomObjectsApi

from ..core.dra import DraInventory, pod_allocation
from ..kube.clusterview import pod_dra_inventory
from .ports import DeviceHolder
from .profiles import cluster_view
from .server_end import reflected_pod


def claims_devices(spawner: DeviceHolder) -> bool:
    """Whether the server's GPUs come through DRA claims: a dra flavor, or a gpu
    flavor a DeviceClass serves."""
    selection = spawner.gpu_selection
    flavor = selection.flavor if selection is not None else None
    return flavor is not None and (flavor.kind == "dra" or flavor.bridged)


def allocated_words(inventory: DraInventory, pod: dict[str, Any] | None) -> tuple[str, ...]:
    """The devices the pod's claims were allocated, in words; () where not known."""
    uid = ((pod or {}).get("metadata") or {}).get("uid")
    if not uid or inventory.problem is not None:
        return ()
    allocation = pod_allocation(inventory, uid)
    return allocation.words if allocation is not None else ()


class ServerDevices:
    """One server's DRA devices as the hub knows them, for its current start."""

    def __init__(self, spawner: DeviceHolder) -> None:
        self.spawner = spawner
        #: the devices the start's own read of the claims found, in words
        self.words: tuple[str, ...] = ()
        #: set once the start has read its claims (None: not a DRA server)
        self.read: asyncio.Event | None = None

    def begin(self) -> None:
        """A new start: no devices named yet; for a DRA server, an event the start sets
        once it has read its claims (what the spawn page waits for once the pod runs)."""
        self.words = ()
        self.read = asyncio.Event() if claims_devices(self.spawner) else None

    def line(self) -> str | None:
        """The spawn page's line naming the server's DRA devices, once they are known."""
        if not claims_devices(self.spawner):
            return None
        words = self.words
        if not words:
            view = cluster_view()
            _, pod = reflected_pod(self.spawner)
            words = allocated_words(view.dra_inventory(), pod) if view is not None else ()
        return f"DRA: kube-scheduler allocated {', '.join(words)}" if words else None

    async def wait_read(self) -> bool:
        """Wait (briefly) for the start to read the server's claims; False once there is
        nothing to wait for: not a DRA server, read already, or the start is over."""
        read = self.read
        if read is None or read.is_set() or self.spawner.pending != "spawn":
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(read.wait(), timeout=0.5)
        return True

    async def start_allocation(self, pod: dict[str, Any]) -> DraInventory | None:
        """What a started DRA server's claims were allocated, which its GPU time counts
        and the spawn page names; None for any other server."""
        spawner = self.spawner
        if not claims_devices(spawner):
            return None
        try:
            inventory = await pod_dra_inventory(
                CustomObjectsApi(spawner.api.api_client), pod, spawner.k8s_api_request_timeout
            )
            if inventory.problem is not None:
                spawner.log.warning(
                    "GPU usage of %s counted as asked, not as allocated: %s",
                    spawner._server_key,
                    inventory.problem,
                )
            self.words = allocated_words(inventory, pod)
            return inventory
        finally:
            if self.read is not None:
                self.read.set()
