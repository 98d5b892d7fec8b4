"""A live copy of the cluster's nodes and bound pods, for free capacity per flavor.

``capacity_watches`` are the two watches capacity is read from: nodes, and
(cluster-wide) pods that are bound to a node and not finished, each a
``Reflector`` slimmed to what capacity needs, in the API's JSON form, which is
what ``core.capacity`` reads. The spawner's ``ClusterView`` runs them for the
profile list; the service runs the same two behind its page. Thin I/O: the
arithmetic is in ``core.capacity``.

Reading nodes and pods in every namespace needs RBAC the z2jh chart does not
grant (``jupyterhub-gpu manifests`` renders it). Without it the view says so
once in the log, reports capacity as unknown, and tries again every few
minutes; nothing else depends on it, so spawns go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kubernetes_asyncio import client

from ..core.capacity import FlavorCapacity, flavor_capacity
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


class _Watch:
    """Keeps one ``Reflector`` running: relists after errors with backoff, and says
    what is wrong (e.g. no RBAC) in ``problem`` until a list succeeds again."""

    def __init__(self, reflector: Reflector, log: logging.Logger, forbidden_retry: float) -> None:
        self.reflector = reflector
        self.log = log
        self.forbidden_retry = forbidden_retry
        self.problem: str | None = "not listed yet"
        self.ready = asyncio.Event()
        self.status = SimpleNamespace(last_result="")  # what Reflector.run reports to
        self._warned = False

    def succeeded(self, _result: str) -> None:
        self.problem = None
        self.ready.set()

    async def run(self) -> None:
        delay = 1.0
        while True:
            try:
                await self.reflector.run(self)  # returns when a watch expires: list again
                delay = 1.0
                continue
            except asyncio.CancelledError:
                raise
            except KubeAPIError as e:
                self.problem = str(e)
                if e.status in (401, 403):
                    if not self._warned:
                        self.log.warning(
                            "GPU capacity unknown: %s; the profile list says so and spawns go on",
                            e,
                        )
                        self._warned = True
                    await asyncio.sleep(self.forbidden_retry)
                    continue
            except Exception as e:  # the API server restarting, the network: retry
                self.problem = f"reading {self.reflector.what} failed: {e!r}"
            self.log.warning("GPU capacity: %s; retrying in %.0fs", self.problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60)


class ClusterView:
    """Nodes and bound pods, and free capacity per flavor derived from them."""

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
        self._tasks: list[asyncio.Task] = []
        self._cache: tuple[tuple[int, int], dict[str, FlavorCapacity]] | None = None
        self._computed_at = 0.0

    def _changed(self, _reflector: Reflector) -> None:
        self.version += 1

    def start(self) -> ClusterView:
        self._tasks = [asyncio.create_task(k.run()) for k in (self.nodes, self.pods)]
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
            computed = flavor_capacity(policy, nodes, pods)
            self._cache, self._computed_at = (key, computed), now
        return self._cache[1]
