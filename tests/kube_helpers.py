"""Small helpers the k8s tests share: pod manifests, polling, a module's own cluster."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster

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


def gpu_server_pod(name: str, user: str, group: str, selector: dict[str, str]) -> dict:
    """A one-GPU server pod of ``user`` in ``group``, labelled and annotated as the
    spawner makes one (of profile ``small``, flavor ``h200``), placed by ``selector``."""
    charge = {"user": user, "request": {"gpus": "1", "cpu": 100, "memory": 1, "servers": 1}}
    body = pod_manifest(name, {"nvidia.com/gpu": "1"}, nodeSelector=selector)
    body["metadata"]["labels"] = {
        "component": "singleuser-server",
        "gpu.jupyterhub.org/group": group,
        "gpu.jupyterhub.org/profile": "small",
        "gpu.jupyterhub.org/flavor": "h200",
        "hub.jupyter.org/username": user,
    }
    body["metadata"]["annotations"] = {"gpu.jupyterhub.org/charge": json.dumps(charge)}
    return body


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


def module_cluster(request, tmp_path_factory, scheduler: str, **settings) -> LocalCluster:
    """A cluster of the test module's own that runs ``scheduler`` for real (the modules'
    queues share names, so each gets one); modules that use it override ``kube``. A
    module may run one per scheduler, one after the other."""
    module = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    directory = tmp_path_factory.mktemp(f"{module}-{scheduler}-cluster")
    return LocalCluster.create(
        name=f"pytest-{module}-{scheduler}-{os.getpid()}",
        directory=Path(directory),
        schedulers=(scheduler,),
        **settings,
    )


async def dedicated_gpu_node(core, pool: str, gpus: int) -> str:
    """A kwok node of its own with ``gpus`` A100s, labelled with ``pool`` for a flavor's
    node selector, for a test that fills it; its address in 127.0.0.0/8, away from the
    cluster's own nodes. The test deletes it."""
    from ipaddress import IPv4Network

    from jupyterhub_gpu_dev.localcluster.nodepools import NodeAddressing, render_nodes

    (node,) = render_nodes(
        {
            "node_pools": {
                pool: {
                    "count": 1,
                    "cpu": 8,
                    "memory": "32Gi",
                    "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "count": gpus},
                }
            }
        },
        NodeAddressing(IPv4Network("127.0.40.0/24")),
    )
    await core.create_node(node)
    name = node["metadata"]["name"]

    async def node_ready():
        read = await core.read_node(name)
        conditions = {c.type: c.status for c in read.status.conditions or []}
        return conditions.get("Ready") == "True"

    await eventually(node_ready, f"node {name} to be Ready")
    return name


async def user_pod(core, namespace: str, user: str):
    """The server pod of ``user`` in ``namespace`` (KubeSpawner's username label), or None."""
    listed = await core.list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    return listed.items[0] if listed.items else None


async def taken_away(core, pod) -> bool:
    """``pod`` is being deleted, or gone (a pod of its name may have replaced it): what a
    preemption does to its victim."""
    try:
        now = await core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return now.metadata.uid != pod.metadata.uid or now.metadata.deletion_timestamp is not None


# ---- claims and the volumes they bind to ---------------------------------------


def claim_body(name: str, volume: str | None = None) -> client.V1PersistentVolumeClaim:
    return client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"],
            storage_class_name="",
            volume_name=volume,
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
        ),
    )


async def create_claim(core, namespace: str, name: str) -> None:
    """A claim as an admin creates it; no volume here matches it, so it stays Pending."""
    await core.create_namespaced_persistent_volume_claim(namespace, claim_body(name))


async def create_bound_claim(core, namespace: str, name: str) -> None:
    """A claim bound to a volume made for it (a pre-provisioned volume, as a storage
    admin's): kube-scheduler places a pod only once its claims are bound. Bound both
    ways from the start (the claim names the volume and says its binding is complete,
    the volume's claimRef has the claim's uid), so it holds with or without a volume
    controller in the cluster."""
    volume = f"{namespace}-{name}"
    body = claim_body(name, volume)
    body.metadata.annotations = {"pv.kubernetes.io/bind-completed": "yes"}
    claim = await core.create_namespaced_persistent_volume_claim(namespace, body)
    await core.create_persistent_volume(
        volume_body(volume, namespace, name, "1Gi", "ReadWriteMany", uid=claim.metadata.uid)
    )


def volume_body(
    volume: str,
    namespace: str,
    claim: str,
    capacity: str,
    access_mode: str,
    *,
    uid: str | None = None,
    reclaim_policy: str | None = None,
) -> client.V1PersistentVolume:
    """A hostPath volume made for ``claim`` in ``namespace`` (with the claim's ``uid``:
    bound from the start; without it: for the cluster's volume binder to bind)."""
    return client.V1PersistentVolume(
        metadata=client.V1ObjectMeta(name=volume),
        spec=client.V1PersistentVolumeSpec(
            capacity={"storage": capacity},
            access_modes=[access_mode],
            host_path=client.V1HostPathVolumeSource(path=f"/srv/{volume}"),
            storage_class_name="",
            claim_ref=client.V1ObjectReference(namespace=namespace, name=claim, uid=uid),
            persistent_volume_reclaim_policy=reclaim_policy,
        ),
    )


async def remove_claims(core, namespace: str) -> None:
    """Delete the namespace's claims and the volumes made for them. The API server gives
    each claim the pvc-protection finalizer, which only a controller this cluster does
    not run removes: without taking it off, the claims (and their namespace) would
    never go."""
    for claim in (await core.list_namespaced_persistent_volume_claim(namespace)).items:
        name = claim.metadata.name
        await core.patch_namespaced_persistent_volume_claim(
            name, namespace, {"metadata": {"finalizers": None}}
        )
        try:
            await core.delete_namespaced_persistent_volume_claim(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise
    for volume in (await core.list_persistent_volume()).items:
        ref = volume.spec.claim_ref
        if ref is not None and ref.namespace == namespace:
            await core.patch_persistent_volume(
                volume.metadata.name, {"metadata": {"finalizers": None}}
            )
            await core.delete_persistent_volume(volume.metadata.name)

    async def gone() -> bool:
        claims = (await core.list_namespaced_persistent_volume_claim(namespace)).items
        volumes = [
            v
            for v in (await core.list_persistent_volume()).items
            if v.spec.claim_ref is not None and v.spec.claim_ref.namespace == namespace
        ]
        return not claims and not volumes

    await eventually(gone, f"the claims of {namespace} and their volumes to go")
