"""A DRA server through a real hub on a cluster whose GPU node runs NVIDIA's DRA
driver (simulated slices): kube-scheduler allocates the server's claim to a device
on the node the pod lands on, the spawn page names that device as the server
starts, and the spawn form and the service's api/capacity count the free devices
from the ResourceSlices and claims at each step, under the RBAC ``jupyterhub-gpu
manifests`` renders.

The driver's DeviceClass ``gpu.nvidia.com`` also maps ``nvidia.com/gpu`` (the
extended-resource bridge): a ``gpu`` flavor's server, asking for ``nvidia.com/gpu``
as on a device-plugin node, gets a GPU of the DRA node through a claim
kube-scheduler makes for it, and its capacity, and the DRA flavor's, follow."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from hub_helpers import (
    create_priority_classes,
    page_as,
    progress_messages,
    ready,
    running_hub,
    stop_server,
)
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from kube_helpers import eventually
from test_service_hub import aget, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

#: one H200 node run by the DRA driver (two GPUs), one A100 node by the device plugin
POOLS = {
    # the DeviceClass gpu.nvidia.com serves pods that ask for nvidia.com/gpu
    "dra": {"extended_resource_name": "nvidia.com/gpu"},
    "node_pools": {
        "h200dra": {
            "count": 1,
            "cpu": 64,
            "memory": "512Gi",
            "dra": True,
            "gpu": {"product": "NVIDIA-H200-NVL", "memory": 143771, "count": 2},
        },
        "a100": {
            "count": 1,
            "cpu": 32,
            "memory": "128Gi",
            "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "count": 2},
        },
    },
}

POLICY = {
    "flavors": {
        "h200": {
            "kind": "dra",
            "display_name": "H200 via DRA",
            "device_class": "gpu.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"],
        },
        # pods ask for nvidia.com/gpu; on the H200 node the DRA driver serves it
        "h200-bridged": {
            "kind": "gpu",
            "display_name": "H200 (nvidia.com/gpu)",
            "device_class": "gpu.nvidia.com",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
        },
        # any GPU node: the A100's device plugin or the H200's DRA driver
        "any": {"kind": "gpu", "display_name": "Any GPU"},
    },
    "profiles": {
        "h200": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "bridged": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200-bridged"}},
        "any": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "any"}},
    },
    "everyone": {"profiles": []},
    "groups": {
        "lab": {"display_name": "Lab", "quota": {"gpus": 2}, "profiles": ["h200"]},
        "ops": {"display_name": "Ops", "quota": {"gpus": 2}, "profiles": ["bridged", "any"]},
    },
}


@pytest.fixture(scope="module")
def dra_cluster(tmp_path_factory):
    cluster = LocalCluster.create(
        name=f"pytest-dra-hub-{os.getpid()}",
        directory=Path(tmp_path_factory.mktemp("dra-hub-cluster")),
        node_pools=POOLS,
    )
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
async def dra_kube(dra_cluster):
    async with dra_cluster.api() as api:
        await create_priority_classes(api)
        yield api


@pytest.fixture(scope="module")
async def dra_hub(dra_cluster, dra_kube):
    async with running_hub(
        dra_cluster,
        client.CoreV1Api(dra_kube),
        users={"ann": ["lab"], "bob": ["lab"], "cy": ["ops"], "dee": ["ops"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.hub_poll_interval = 1\n"
            "c.KubeSpawner.http_timeout = 120\n"
            # the spawn goes on as the test reads its page's events
            'c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}\n'
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        yield hub


async def spawn_lines(hub, user: str = "bob") -> list[str]:
    """The cluster capacity each of the user's profiles shows, in the form's order."""
    page = await asyncio.to_thread(page_as, hub.url, user, hub.password)
    found = [m.strip() for m in re.findall(r"cluster: [^<·]*", page)]
    assert found, f"no cluster capacity on {user}'s spawn page: {page[:2000]}"
    return found


async def capacity_api(hub, flavor: str = "h200") -> dict:
    token = await user_token(hub, "bob")
    status, _, body = await aget(hub.service_url + "api/capacity", token)
    assert status == 200, body
    (found,) = [f for f in json.loads(body)["flavors"] if f["flavor"] == flavor]
    return found


async def shows(hub, free: int, bridged: int | None = None, any_gpu: int | None = None) -> None:
    """bob's spawn page and api/capacity show ``free`` of the H200 node's 2 devices
    free for the DRA flavor; dee's page (ops) the bridged flavor's (of 2) and any GPU's (of
    4: the A100's two and the H200's) when given."""

    async def page():
        return await spawn_lines(hub) == [f"cluster: {free} of 2 devices free"]

    await eventually(page, f"the spawn page to show {free} of 2 devices free", within=30)

    async def api():
        h200 = await capacity_api(hub)
        return (h200["allocatable"], h200["free"]) == (2, free)

    await eventually(api, f"api/capacity to count {free} of 2 devices free", within=30)
    if bridged is None:
        return
    lines = [f"cluster: {bridged} of 2 GPUs free", f"cluster: {any_gpu} of 4 GPUs free"]

    async def ops_page():
        return await spawn_lines(hub, "dee") == lines

    await eventually(ops_page, f"dee's spawn page to show {lines}", within=30)


async def spawn_naming_devices(hub, user: str, profile: str) -> str:
    """Start ``user``'s server, reading its spawn page's events as it starts; the line
    that names the DRA devices kube-scheduler allocated it (before it is ready)."""
    status, body = await asyncio.to_thread(
        hub.api, "POST", f"/users/{user}/server", {"profile": profile}
    )
    assert status == 202, body
    messages = await asyncio.to_thread(
        progress_messages, hub, user, "DRA: kube-scheduler allocated", 120
    )
    await eventually(lambda: ready(hub, user), f"{user}'s server to be ready", within=180)
    return messages[-1]


async def test_a_dra_server_gets_a_device_on_its_node_and_the_free_count_follows(dra_hub, dra_kube):
    core, resource = client.CoreV1Api(dra_kube), client.ResourceV1Api(dra_kube)
    await shows(dra_hub, 2)
    line = await spawn_naming_devices(dra_hub, "ann", "lab--h200")
    (pod,) = [
        p
        for p in (await core.list_namespaced_pod(dra_hub.namespace)).items
        if p.metadata.name.startswith("jupyter-ann")
    ]
    assert pod.spec.node_name == "h200dra-0"
    (status,) = pod.status.resource_claim_statuses
    claim = await resource.read_namespaced_resource_claim(
        status.resource_claim_name, dra_hub.namespace
    )
    (result,) = claim.status.allocation.devices.results
    assert (result.driver, result.pool) == ("gpu.nvidia.com", "h200dra-0")
    assert result.device in ("gpu-0", "gpu-1")
    # the spawn page named that device as it started
    assert line == f"DRA: kube-scheduler allocated {result.device} (NVIDIA H200 NVL) on h200dra-0"
    await shows(dra_hub, 1)

    await stop_server(dra_hub, "ann")

    async def released():
        claims = await resource.list_namespaced_resource_claim(dra_hub.namespace)
        return not claims.items

    await eventually(released, "ann's claim released with her server", within=60)
    await shows(dra_hub, 2)


async def test_a_gpu_flavor_served_by_dra_gets_a_device_through_the_bridge(dra_hub, dra_kube):
    """cy's server asks for nvidia.com/gpu as on any device-plugin node; the H200 node
    advertises none, so kube-scheduler serves it from the DRA driver's devices through
    a claim of its own for the pod (Kubernetes 1.36's DRAExtendedResource, on by
    default), and every flavor over those devices counts it."""
    core, custom = client.CoreV1Api(dra_kube), client.CustomObjectsApi(dra_kube)
    await shows(dra_hub, 2, bridged=2, any_gpu=4)
    line = await spawn_naming_devices(dra_hub, "cy", "ops--bridged")
    (pod,) = [
        p
        for p in (await core.list_namespaced_pod(dra_hub.namespace)).items
        if p.metadata.name.startswith("jupyter-cy")
    ]
    assert pod.spec.node_name == "h200dra-0"
    (container,) = pod.spec.containers
    assert container.resources.requests["nvidia.com/gpu"] == "1"
    assert not pod.spec.resource_claims  # no claim of its own: the scheduler's
    raw = await core.read_namespaced_pod(
        pod.metadata.name, dra_hub.namespace, _preload_content=False
    )
    status = json.loads(await raw.read())["status"]
    name = status["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = await custom.get_namespaced_custom_object(
        "resource.k8s.io", "v1", dra_hub.namespace, "resourceclaims", name
    )
    annotations = claim["metadata"]["annotations"]
    assert annotations["resource.kubernetes.io/extended-resource-claim"] == "true"
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Pod", pod.metadata.uid)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == ("gpu.nvidia.com", "h200dra-0")
    # the spawn page names the device of kube-scheduler's own claim too
    assert line == (
        f"DRA: kube-scheduler allocated {result['device']} (NVIDIA H200 NVL) on h200dra-0"
    )
    # one H200 taken: the bridged flavor, any GPU, and the DRA claims' flavor
    await shows(dra_hub, 1, bridged=1, any_gpu=3)
    bridged = await capacity_api(dra_hub, "h200-bridged")
    assert bridged["note"] == "2 of them through DeviceClass gpu.nvidia.com (DRA)"

    await stop_server(dra_hub, "cy")

    async def released():
        claims = await custom.list_namespaced_custom_object(
            "resource.k8s.io", "v1", dra_hub.namespace, "resourceclaims"
        )
        return not claims["items"]

    await eventually(released, "cy's claim released with the server", within=60)
    await shows(dra_hub, 2, bridged=2, any_gpu=4)
