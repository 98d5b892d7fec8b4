"""A live copy of the cluster's nodes and bound pods, for free capacity per flavor.

``capacity_watches`` are the two watches capacity is read from: nodes, and
(cluster-wide) pods that are bound to a node and not finished, each a
``Reflector`` slimmed to what capacity needs, in the API's JSON form, which is
what ``core.capacity`` reads. The spawner's ``ClusterView`` runs them for the
profile list; the service runs the same two behind its page. Thin I/O: the
arithmetic is in ``core.capacity``.

``dra_watches`` are the three DRA capacity is read from: ResourceSlices (the
devices drivers publish), DeviceClasses (what selects them) and ResourceClaims
in every namespace (which devices are allocated); ``dra_inventory`` makes them
the ``core.dra.DraInventory`` that ``flavor_capacity`` counts dra flavors from.

Reading nodes, pods and DRA objects in every namespace needs RBAC the z2jh chart
does not grant (``jupyterhub-gpu manifests`` renders it). Without it the view
says so once in the log, reports capacity as unknown, and tries again every few
minutes; nothing else depends on it, so spawns go on. A cluster that serves no
DRA API (``resource.k8s.io/v1``, Kubernetes 1.34 on) leaves only the dra
flavors' capacity unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from ..core.capacity import FlavorCapacity, flavor_capacity
from ..core.dra import DraInventory
from ..core.model import Policy
from .client import KubeAPIError
from .reflector import Reflector, slim_node, slim_pod

#: pods that hold node resources: bound to a node and not finished
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def capacity_watches(
    core: client.CoreV1Api | None,
    *,
    on_nodes: Callable[[Reflector], None],
    on_pods: Callable[[Reflector], None],
    on_pod_event: Callable[[str, Any, Any], None] | None = None,
    watch_timeout: int = 300,
) -> tuple[Reflector, Reflector]:
    """The node watch and the bound-pod watch (``core`` None: fed by hand, in tests)."""

    def call(name: str) -> Callable[..., Any] | None:
        return getattr(core, name) if core is not None else None

    nodes = Reflector(
        "nodes",
        call("list_node"),
        transform=slim_node,
        on_change=on_nodes,
        watch_timeout=watch_timeout,
    )
    pods = Reflector(
        "bound pods",
        call("list_pod_for_all_namespaces"),
        transform=slim_pod,
        on_change=on_pods,
        on_event=on_pod_event,
        watch_timeout=watch_timeout,
        field_selector=BOUND_PODS,
    )
    return nodes, pods


def slim_slice(resource_slice: dict[str, Any]) -> dict[str, Any]:
    """What DRA capacity needs of a ResourceSlice: its pool, node and devices' attributes."""
    spec = resource_slice.get("spec") or {}
    return {
        "metadata": {"name": (resource_slice.get("metadata") or {}).get("name")},
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": spec.get("pool") or {},
            "devices": [
                {"name": d.get("name"), "attributes": d.get("attributes") or {}}
                for d in spec.get("devices") or []
            ],
        },
    }


def slim_class(device_class: dict[str, Any]) -> dict[str, Any]:
    """What DRA capacity needs of a DeviceClass: its name, selectors and the extended
    resource it serves (the extended-resource bridge)."""
    spec = device_class.get("spec") or {}
    return {
        "metadata": {"name": (device_class.get("metadata") or {}).get("name")},
        "spec": {
            "selectors": spec.get("selectors") or [],
            "extendedResourceName": spec.get("extendedResourceName"),
        },
    }


def slim_claim(claim: dict[str, Any]) -> dict[str, Any]:
    """What DRA capacity needs of a ResourceClaim: the devices it was allocated, and
    the pod that owns it (what a server was allocated)."""
    metadata = claim.get("metadata") or {}
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    owners = [
        {k: o.get(k) for k in ("kind", "name", "uid", "controller")}
        for o in metadata.get("ownerReferences") or []
        if o.get("kind") == "Pod"
    ]
    return {
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "ownerReferences": owners,
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {k: r.get(k) for k in ("driver", "pool", "device")} for r in results
                    ]
                }
            }
        },
    }


#: DRA's API (GA in Kubernetes 1.34), read through the generic object API: the
#: kubernetes_asyncio of older hub images (z2jh 4.0's) has no typed client for it
DRA_API = ("resource.k8s.io", "v1")


def dra_watches(
    custom: client.CustomObjectsApi | None,
    *,
    on_change: Callable[[Reflector], None],
    watch_timeout: int = 300,
) -> tuple[Reflector, Reflector, Reflector]:
    """The ResourceSlice, DeviceClass and (cluster-wide) ResourceClaim watches
    (``custom`` None: fed by hand, in tests)."""

    def call(plural: str) -> Callable[..., Any] | None:
        if custom is None:
            return None
        return functools.partial(custom.list_cluster_custom_object, *DRA_API, plural)

    return (
        Reflector(
            "resourceslices",
            call("resourceslices"),
            transform=slim_slice,
            on_change=on_change,
            watch_timeout=watch_timeout,
        ),
        Reflector(
            "deviceclasses",
            call("deviceclasses"),
            transform=slim_class,
            on_change=on_change,
            watch_timeout=watch_timeout,
        ),
        Reflector(
            "resource claims",
            call("resourceclaims"),
            transform=slim_claim,
            on_change=on_change,
            watch_timeout=watch_timeout,
        ),
    )


async def pod_dra_inventory(
    custom: client.CustomObjectsApi, pod: dict[str, Any], request_timeout: float
) -> DraInventory:
    """The DRA objects that say what one pod's claims were allocated: the claims of its
    namespace and the ResourceSlices of its node (two reads, at a DRA server's start);
    a ``DraInventory`` with ``problem`` when they cannot be read."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    try:
        claims = await custom.list_namespaced_custom_object(
            *DRA_API,
            metadata.get("namespace", ""),
            "resourceclaims",
            _request_timeout=request_timeout,
        )
        slices = await custom.list_cluster_custom_object(
            *DRA_API,
            "resourceslices",
            field_selector=f"spec.nodeName={spec.get('nodeName', '')}",
            _request_timeout=request_timeout,
        )
    except client.ApiException as e:
        return DraInventory(problem=f"reading the pod's DRA claims: {e.status} {e.reason}")
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        return DraInventory(problem=f"reading the pod's DRA claims: {e!r}")
    return DraInventory(
        [slim_slice(s) for s in slices.get("items") or []],
        (),
        [slim_claim(c) for c in claims.get("items") or []],
    )


def dra_inventory(
    slices: Reflector, classes: Reflector, claims: Reflector, problem: str | None = None
) -> DraInventory:
    """The three watches' objects as ``flavor_capacity`` counts them; ``problem`` (or
    a watch not listed yet) makes the dra flavors' capacity unknown, saying why."""
    for reflector in (slices, classes, claims):
        if reflector.items is None and problem is None:
            problem = f"{reflector.what} not listed yet"
    if problem is not None:
        return DraInventory(problem=problem)
    return DraInventory(
        (slices.items or {}).values(), (classes.items or {}).values(), (claims.items or {}).values()
    )


class _Watch:
    """Keeps one ``Reflector`` running: relists after errors with backoff, and says
    what is wrong (e.g. no RBAC) in ``problem`` until a list succeeds again."""

    def __init__(self, reflector: Reflector, log: logging.Logger, forbidden_retry: float) -> None:
        self.reflector = reflector
        self.log = log
        self.forbidden_retry = forbidden_retry
        self.problem: str | None = "not listed yet"
        self.ready = asyncio.Event()
        #: set once the API server has answered: listed, or refused for good (no
        #: RBAC, a kind it does not serve), so a first page need not wait longer
        self.answered = asyncio.Event()
        self.status = SimpleNamespace(last_result="")  # what Reflector.run reports to
        self._warned = False

    def succeeded(self, _result: str) -> None:
        self.problem = None
        self.ready.set()
        self.answered.set()

    async def run(self) -> None:
        delay = 1.0
        refused_delay = 1.0
        while True:
            try:
                await self.reflector.run(self)  # returns when a watch expires: list again
                delay = refused_delay = 1.0
                continue
            except asyncio.CancelledError:
                raise
            except KubeAPIError as e:
                self.problem = str(e)
                if e.status in (401, 403, 404):  # 404: an API this cluster does not serve
                    self.answered.set()
                    if not self._warned:
                        self.log.warning(
                            "GPU capacity unknown: %s; the profile list says so and spawns go on",
                            e,
                        )
                        self._warned = True
                    # asked again soon, then less and less often: an API server that
                    # has just restarted refuses for a moment while its authorizer
                    # warms up, where a missing grant stays missing until an admin adds it
                    await asyncio.sleep(min(refused_delay, self.forbidden_retry))
                    refused_delay *= 2
                    continue
            except Exception as e:  # the API server restarting, the network: retry
                self.problem = f"reading {self.reflector.what} failed: {e!r}"
            self.log.warning("GPU capacity: %s; retrying in %.0fs", self.problem, delay)
            await asyncio.sleep(delay)
            # at most 30 s between tries (as Kubernetes' own reflectors): the profile
            # list says "capacity unknown" no longer than that after the API server is back
            delay = min(delay * 2, 30)


class ClusterView:
    """Nodes, bound pods and DRA objects, and free capacity per flavor derived from them."""

    def __init__(
        self,
        api_client: client.ApiClient,
        log: logging.Logger,
        refresh: float = 1.0,
        forbidden_retry: float = 300,
    ) -> None:
        self.refresh = refresh
        self.version = 0  # bumped on every change, so capacity is recomputed only then
        nodes, pods = capacity_watches(
            client.CoreV1Api(api_client), on_nodes=self._changed, on_pods=self._changed
        )
        self.nodes = _Watch(nodes, log, forbidden_retry)
        self.pods = _Watch(pods, log, forbidden_retry)
        self.dra = [
            _Watch(r, log, forbidden_retry)
            for r in dra_watches(client.CustomObjectsApi(api_client), on_change=self._changed)
        ]
        self._tasks: list[asyncio.Task] = []
        self._cache: tuple[tuple[int, int], dict[str, FlavorCapacity]] | None = None
        self._computed_at = 0.0
        self._inventory: tuple[int, float, DraInventory] | None = None

    def _changed(self, _reflector: Reflector) -> None:
        self.version += 1

    def start(self) -> ClusterView:
        self._tasks = [asyncio.create_task(k.run()) for k in (self.nodes, self.pods, *self.dra)]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_ready(self, within: float) -> bool:
        """Wait up to ``within`` s for the first lists; False if capacity is still unknown."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self.nodes.ready.wait()
                await self.pods.ready.wait()
                for watch in self.dra:
                    await watch.answered.wait()
        return self.problem is None

    @property
    def problem(self) -> str | None:
        return self.nodes.problem or self.pods.problem

    def capacity(self, policy: Policy) -> dict[str, FlavorCapacity] | None:
        """Free capacity per flavor now, or None when it is unknown (see ``problem``)."""
        if self.problem is not None:
            return None
        key = (id(policy), self.version)
        now = time.monotonic()
        # recomputed when something changed, at most once a second: during a spawn
        # storm every pod event would otherwise cost a pass over every pod
        stale = self._cache is None or self._cache[0][0] != key[0]
        if stale or (self._cache[0] != key and now - self._computed_at >= self.refresh):
            nodes = (self.nodes.reflector.items or {}).values()
            pods = (self.pods.reflector.items or {}).values()
            computed = flavor_capacity(policy, nodes, pods, dra=self.dra_inventory(fresh=True))
            self._cache, self._computed_at = (key, computed), now
        return self._cache[1]

    def dra_inventory(self, fresh: bool = False) -> DraInventory:
        """The DRA objects as the watches hold them now (unknown, saying why, while a
        watch has not listed or fails), made again after a change, at most once every
        ``refresh`` s (every spawning DRA server's page asks each second) unless
        ``fresh`` (capacity, which keeps that pace itself)."""
        now = time.monotonic()
        cached = self._inventory
        changed = cached is None or cached[0] != self.version
        if cached is None or (changed and (fresh or now - cached[1] >= self.refresh)):
            problems = [w.problem for w in self.dra if w.problem is not None]
            inventory = dra_inventory(
                *(w.reflector for w in self.dra), problem=problems[0] if problems else None
            )
            self._inventory = cached = (self.version, now, inventory)
        return cached[2]
