"""A DRA server through a real hub on a cluster whose GPU node runs NVIDIA's DRA
driver (simulated slices): kube-scheduler allocates the server's claim to a device
on the node the pod lands on, and the spawn page and the service's api/capacity
count the free devices from the ResourceSlices and claims at each step, under the
RBAC ``jupyterhub-gpu manifests`` renders."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from hub_helpers import create_priority_classes, page_as, running_hub, stop_server
from jupyterhub_gpu.dev.localcluster.cluster import LocalCluster
from kube_helpers import eventually
from test_service_hub import aget, start_server, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

#: one H200 node run by the DRA driver (two GPUs), one A100 node by the device plugin
POOLS = {
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
    }
}

POLICY = {
    "flavors": {
        "h200": {
            "kind": "dra",
            "display_name": "H200 via DRA",
            "device_class": "gpu.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"],
        }
    },
    "profiles": {"h200": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "everyone": {"profiles": []},
    "groups": {"lab": {"display_name": "Lab", "quota": {"gpus": 2}, "profiles": ["h200"]}},
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
        users={"ann": ["lab"], "bob": ["lab"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.hub_poll_interval = 1\n"
            "c.KubeSpawner.http_timeout = 120\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        yield hub


async def spawn_line(hub) -> str:
    page = await asyncio.to_thread(page_as, hub.url, "bob", hub.password)
    found = re.search(r"cluster: [^<·]*", page)
    assert found, f"no cluster capacity on bob's spawn page: {page[:2000]}"
    return found.group(0).strip()


async def capacity_api(hub) -> dict:
    token = await user_token(hub, "bob")
    status, _, body = await aget(hub.service_url + "api/capacity", token)
    assert status == 200, body
    (h200,) = json.loads(body)["flavors"]
    return h200


async def shows(hub, free: int) -> None:
    async def page():
        return await spawn_line(hub) == f"cluster: {free} of 2 devices free"

    await eventually(page, f"the spawn page to show {free} of 2 devices free", within=30)

    async def api():
        h200 = await capacity_api(hub)
        return (h200["allocatable"], h200["free"]) == (2, free)

    await eventually(api, f"api/capacity to count {free} of 2 devices free", within=30)


async def test_a_dra_server_gets_a_device_on_its_node_and_the_free_count_follows(dra_hub, dra_kube):
    core, resource = client.CoreV1Api(dra_kube), client.ResourceV1Api(dra_kube)
    await shows(dra_hub, 2)
    await start_server(dra_hub, "ann", "lab--h200")
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
    await shows(dra_hub, 1)

    await stop_server(dra_hub, "ann")

    async def released():
        claims = await resource.list_namespaced_resource_claim(dra_hub.namespace)
        return not claims.items

    await eventually(released, "ann's claim released with her server", within=60)
    await shows(dra_hub, 2)
