"""Small helpers the k8s tests share: pod manifests and polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod_manifest(name: str, requests: dict[str, str] | None = None, **spec) -> dict:
    """A one-container pod; extended resources go in limits too, as Kubernetes requires."""
    requests = requests or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": dict(requests), "limits": dict(requests)},
                }
            ],
            "tolerations": [GPU_TOLERATION],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


async def eventually(
    probe: Callable[[], Awaitable[T]], what: str, within: float = 30, interval: float = 0.2
) -> T:
    """Poll until ``probe`` returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + within
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {within}s waiting for {what} (last: {last!r})")


async def created_once_quota_admits(
    create: Callable[[], Awaitable[T]], what: str, lagging: str = "status unknown for quota"
) -> T:
    """Create something a ResourceQuota has room for, waiting for quota admission to see it.

    The plugin decides from the API server's cached copy of each quota, which can lag
    behind the status a client reads (Kubernetes promises it catches up, not when): a
    refusal whose message has ``lagging`` (by default: the copy has no status yet; pass
    "exceeded quota" when room was just freed) is retried within a bound, any other raises.
    """
    from kubernetes_asyncio.client import ApiException

    async def attempt():
        try:
            return await create()
        except ApiException as e:
            if e.status == 403 and lagging in (e.body or ""):
                return None
            raise

    return await eventually(attempt, f"quota admission to let {what} in ({lagging!r} until then)")


async def failed_scheduling(core, namespace: str, pod: str) -> list:
    """The scheduler's FailedScheduling events for a pod, once there is one."""

    async def events():
        listed = await core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod}"
        )
        return [e for e in listed.items if e.reason == "FailedScheduling"]

    return await eventually(events, f"a FailedScheduling event for {pod}")
