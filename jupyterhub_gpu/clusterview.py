"""A live copy of the cluster's nodes and bound pods, for free capacity per flavor.

``ClusterView`` lists and then watches nodes and (cluster-wide) pods that are
bound to a node and not finished, keeping them in the API's JSON form, which is
what ``capacity.flavor_capacity`` reads. It is a thin I/O adapter: the
arithmetic is in ``capacity``.

Reading nodes and pods in every namespace needs RBAC the z2jh chart does not
grant (``jupyterhub-gpu manifests`` renders it). Without it the view says so
once in the log, reports capacity as unknown, and tries again every few
minutes; nothing else depends on it, so spawns go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client import ApiException

from .capacity import FlavorCapacity, flavor_capacity
from .model import Policy

#: pods that hold node resources: bound to a node and not finished
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


class WatchedKind:
    """One kind of object, listed once and then kept current by a watch."""

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Awaitable[Any]],
        log: logging.Logger,
        field_selector: str = "",
        forbidden_retry: float = 300,
    ) -> None:
        self.name = name
        self.list_call = list_call
        self.field_selector = field_selector
        self.log = log
        self.forbidden_retry = forbidden_retry
        self.items: dict[str, dict[str, Any]] = {}
        self.ready = asyncio.Event()
        #: why the copy is unknown (e.g. no RBAC), or None while it is current
        self.problem: str | None = "not listed yet"
        self.version = 0  # bumped on every change, so readers can cache what they derive
        self._warned = False

    @staticmethod
    def _key(item: Mapping[str, Any]) -> str:
        meta = item.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name')}"

    async def _list(self) -> str:
        response = await self.list_call(field_selector=self.field_selector, _preload_content=False)
        listed = json.loads(await response.read())
        if listed.get("kind") == "Status":  # a raw response does not raise by itself
            raise ApiException(status=listed.get("code"), reason=listed.get("message"))
        self.items = {self._key(i): i for i in listed.get("items") or []}
        self.version += 1
        self.problem = None
        self.ready.set()
        return listed["metadata"]["resourceVersion"]

    async def _watch(self, resource_version: str) -> None:
        # a watch call without a docstring: events stay JSON, not client models
        async def call(**kwargs):
            return await self.list_call(**kwargs)

        w = watch.Watch()
        async with w.stream(
            call,
            field_selector=self.field_selector,
            resource_version=resource_version,
            timeout_seconds=300,
            allow_watch_bookmarks=True,
        ) as stream:
            async for event in stream:
                kind, item = event["type"], event["raw_object"]
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.items.pop(self._key(item), None)
                else:
                    self.items[self._key(item)] = item
                self.version += 1

    async def run(self) -> None:
        delay = 1.0
        while True:
            try:
                resource_version = await self._list()
                delay = 1.0
                while True:
                    await self._watch(resource_version)
                    resource_version = await self._list()
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                if e.status in (401, 403):
                    self.problem = f"no permission to read {self.name}"
                    if not self._warned:
                        self.log.warning(
                            "GPU capacity: %s (HTTP %s); the profile list says capacity "
                            "is unknown. Grant it with the RBAC `jupyterhub-gpu manifests` "
                            "renders.",
                            self.problem,
                            e.status,
                        )
                        self._warned = True
                    await asyncio.sleep(self.forbidden_retry)
                    continue
                if e.status == 410:  # the watch's version expired: list again
                    continue
                self.problem = f"reading {self.name} failed: HTTP {e.status}"
            except Exception as e:  # the API server restarting, the network: retry
                self.problem = f"reading {self.name} failed: {e!r}"
            self.log.warning("GPU capacity: %s; retrying in %.0fs", self.problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60)


class ClusterView:
    """Nodes and bound pods, and free capacity per flavor derived from them."""

    def __init__(
        self, api_client: client.ApiClient, log: logging.Logger, refresh: float = 1.0
    ) -> None:
        self.refresh = refresh
        core = client.CoreV1Api(api_client)
        self.nodes = WatchedKind("nodes", core.list_node, log)
        self.pods = WatchedKind(
            "pods in all namespaces", core.list_pod_for_all_namespaces, log, BOUND_PODS
        )
        self._tasks: list[asyncio.Task] = []
        self._cache: tuple[tuple[int, int, int], dict[str, FlavorCapacity]] | None = None
        self._computed_at = 0.0

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
        key = (id(policy), self.nodes.version, self.pods.version)
        now = time.monotonic()
        # recomputed when something changed, at most once a second: during a spawn
        # storm every pod event would otherwise cost a pass over every pod
        stale = self._cache is None or self._cache[0][0] != key[0]
        if stale or (self._cache[0] != key and now - self._computed_at >= self.refresh):
            computed = flavor_capacity(policy, self.nodes.items.values(), self.pods.items.values())
            self._cache, self._computed_at = (key, computed), now
        return self._cache[1]
