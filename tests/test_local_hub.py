"""A real JupyterHub (with configurable-http-proxy) spawning into the local cluster.

Stock KubeSpawner, driven over the hub's REST API as a client would: the pod is
created, the pod runner starts ``jupyterhub-singleuser`` on the pod's loopback
IP, the hub reaches it through the proxy, and stopping it removes the pod and
the process.
"""

from __future__ import annotations

import asyncio

import pytest

from jupyterhub_gpu_dev.localcluster import sockets
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]


@pytest.fixture
async def hub(local_cluster, namespace):
    hub = LocalHub(local_cluster, namespace=namespace, users={"alice": []})
    await asyncio.to_thread(hub.start)
    yield hub
    await asyncio.to_thread(hub.stop)


async def call(hub: LocalHub, method: str, path: str, body=None):
    return await asyncio.to_thread(hub.api, method, path, body)


async def start_server(hub: LocalHub, user: str) -> dict:
    status, body = await call(hub, "POST", f"/users/{user}/server")
    assert status in (201, 202), body

    async def ready():
        _, model = await call(hub, "GET", f"/users/{user}")
        server = model["servers"].get("")
        return server if server and server["ready"] else None

    return await eventually(ready, f"{user}'s server to be ready", within=120)


def notebook_addresses(hub: LocalHub) -> list[str]:
    """What the processes the pod runner started listen on."""
    runner = hub.cluster.state.pids["pod-runner"]
    return [a for addrs in sockets.listening_addresses([runner]).values() for a in addrs]


async def test_start_reach_and_stop_server_through_the_hub(hub, core, namespace):
    await start_server(hub, "alice")

    pods = (await core.list_namespaced_pod(namespace)).items
    assert [p.metadata.labels["hub.jupyter.org/username"] for p in pods] == ["alice"]
    pod_ip = pods[0].status.pod_ip
    assert pod_ip.startswith("127.")

    # through the proxy to the notebook server the pod runner started
    status, body = await asyncio.to_thread(hub.request, "GET", "/user/alice/api")
    assert status == 200, body
    assert "version" in body
    assert f"{pod_ip}:8888" in notebook_addresses(hub)

    status, _ = await call(hub, "DELETE", "/users/alice/server")
    assert status in (202, 204)

    async def pod_gone():
        return not (await core.list_namespaced_pod(namespace)).items

    await eventually(pod_gone, "alice's pod to be deleted", within=60)

    async def process_gone():
        return f"{pod_ip}:8888" not in await asyncio.to_thread(notebook_addresses, hub)

    await eventually(process_gone, "the notebook process to be stopped", within=30)
    _, model = await call(hub, "GET", "/users/alice")
    assert model["servers"] == {}


async def test_every_process_listens_on_loopback_only(hub, local_cluster):
    await start_server(hub, "alice")
    pids = [*local_cluster.state.pids.values(), hub.process.pid]
    listening = await asyncio.to_thread(sockets.listening_addresses, pids)
    addresses = [a for addrs in listening.values() for a in addrs]
    # etcd, apiserver, controller-manager, scheduler, kwok, hub, proxy, notebook
    assert len(listening) >= 8, listening
    assert addresses
    not_loopback = [a for a in addresses if not sockets.is_loopback(a)]
    assert not_loopback == [], f"listening beyond loopback: {not_loopback}"


async def test_stopping_the_hub_leaves_no_process(local_cluster, namespace):
    from jupyterhub_gpu_dev.localcluster.processes import alive

    hub = LocalHub(local_cluster, namespace=namespace, users={"alice": []})
    await asyncio.to_thread(hub.start)
    proxy_pid = int((hub.directory / "jupyterhub-proxy.pid").read_text())
    pids = [hub.process.pid, proxy_pid]
    assert all(alive(p) for p in pids)
    await asyncio.to_thread(hub.stop)
    assert [p for p in pids if alive(p)] == []
    assert not hub.directory.exists()
