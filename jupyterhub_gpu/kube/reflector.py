"""List+watch reflectors in the API's JSON form, shared by the spawner and the service.

A ``Reflector`` lists a kind, then watches it from the listed resourceVersion,
keeping ``items`` (key -> transformed object) in step; when the watch expires
(HTTP 410) it lists again. It holds no state that the API server does not: a
restarted service lists and is caught up. Errors (unreachable API, missing
RBAC) raise out of ``run`` so the ``BackgroundTask`` around it retries with
backoff and shows the error; ``items`` is ``None`` until a list succeeds, so
views can say "unknown" instead of showing zeros. After a failure ``items`` is
still the last state seen, but ``failing_since`` says it may be behind (an
object deleted meanwhile is still in it) until a list succeeds again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from .client import KubeAPIError, error_message


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What capacity needs of any pod: where it is bound, what it requests, its phase."""
    spec = pod.get("spec") or {}

    def resources(containers: Any) -> list[dict[str, Any]]:
        return [{"resources": c.get("resources") or {}} for c in containers or []]

    return {
        "metadata": {
            "name": (pod.get("metadata") or {}).get("name"),
            "namespace": (pod.get("metadata") or {}).get("namespace"),
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": resources(spec.get("containers")),
            "initContainers": resources(spec.get("initContainers")),
            "overhead": spec.get("overhead") or {},
        },
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What capacity needs of a node (its image list alone can be megabytes)."""
    metadata, spec, status = (node.get(k) or {} for k in ("metadata", "spec", "status"))
    return {
        "metadata": {"name": metadata.get("name"), "labels": metadata.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": spec.get("taints") or []},
        "status": {
            "allocatable": status.get("allocatable") or {},
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in status.get("conditions") or []
            ],
        },
    }


def object_key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata['name']}" if namespace else metadata["name"]


class Reflector:
    """``items`` kept in step with one list call (e.g. ``CoreV1Api.list_node``)."""

    def __init__(
        self,
        what: str,
        list_call: Callable[..., Any],
        *,
        transform: Callable[[Mapping[str, Any]], Any] = lambda o: o,
        on_change: Callable[[Reflector], None] = lambda reflector: None,
        on_event: Callable[[str, Any, Any], None] | None = None,
        watch_timeout: int = 300,
        **selectors: str,
    ) -> None:
        self.what = what
        self.list_call = list_call
        self.transform = transform
        self.on_change = on_change
        #: called with (key, old, new) for each watch event (new None: gone), so
        #: derived state can be updated by the difference instead of rebuilt
        self.on_event = on_event
        self.watch_timeout = watch_timeout
        self.selectors = selectors
        self.items: dict[str, Any] | None = None
        #: since when the list or the watch has failed (epoch seconds): ``items`` may
        #: be behind from then on. None: the last list succeeded and the watch that
        #: followed it has not failed
        self.failing_since: float | None = None

    async def _json(self, **kwargs: Any) -> Any:
        """The raw response; an error status raises (the client only checks preloaded ones)."""
        response = await self.list_call(**self.selectors, _preload_content=False, **kwargs)
        if not 200 <= response.status <= 299:
            body = await response.read()
            response.release()
            message = error_message(body, body.decode(errors="replace")[:300])
            raise KubeAPIError(self.what, response.status, message)
        return response

    def _set(self, key: str, obj: Mapping[str, Any] | None) -> None:
        """Apply one object (None: deleted) to ``items``."""
        assert self.items is not None
        old = self.items.get(key)
        value = None if obj is None else self.transform(obj)
        if value is None:
            self.items.pop(key, None)
        else:
            self.items[key] = value
        if self.on_event is not None:
            self.on_event(key, old, value)

    async def relist(self) -> str:
        response = await self._json(_request_timeout=60)
        data = json.loads(await response.read())
        items: dict[str, Any] = {}
        for obj in data.get("items") or []:
            value = self.transform(obj)
            if value is not None:
                items[object_key(obj)] = value
        # a new dict: on_change sees a complete list at once
        self.items = items
        self.failing_since = None
        self.on_change(self)
        return data["metadata"]["resourceVersion"]

    async def run(self, task: Any = None) -> str:
        """List, then watch until the watch expires; raises on errors (the task retries),
        and ``items`` counts as behind (``failing_since``) until a list succeeds again."""
        try:
            return await self._list_and_watch(task)
        except BaseException:
            if self.failing_since is None:
                self.failing_since = time.time()
            raise

    async def _list_and_watch(self, task: Any) -> str:
        version = await self.relist()
        if task is not None:
            task.succeeded(f"{len(self.items or {})} {self.what}")
        while True:
            response = await self._json(
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout,
                _request_timeout=self.watch_timeout + 30,
            )
            try:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            return f"{self.what}: watch expired, listed again"
                        raise RuntimeError(f"watching {self.what}: {obj.get('message', obj)}")
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    if kind == "BOOKMARK":
                        continue
                    self._set(object_key(obj), None if kind == "DELETED" else obj)
                    self.on_change(self)
                    if task is not None:
                        task.status.last_result = f"{len(self.items or {})} {self.what}"
            finally:
                response.release()
            if task is not None:
                task.succeeded(f"{len(self.items or {})} {self.what}")
