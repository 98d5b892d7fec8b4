"""Kubernetes faults never let a group exceed its quota, and leave nothing behind.

The hub reaches the API server through a relay the test cuts (``Relay``), and is
restarted with its servers running, as z2jh's hub is (``cleanup_servers`` off).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from test_hub_failures import GPU, POLICY, hub_behind_relay

from hub_helpers import api, wait_no_pods
from kube_helpers import eventually
from test_service_hub import aget, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]


async def pods_of(core, namespace: str, user: str) -> list:
    selector = f"hub.jupyter.org/username={user}"
    return (await core.list_namespaced_pod(namespace, label_selector=selector)).items


async def running(hub, user: str) -> bool:
    _, model = await api(hub, "GET", f"/users/{user}")
    server = model["servers"].get("")
    return bool(server and server["ready"])


async def start_ann(hub) -> None:
    status, body = await api(hub, "POST", "/users/ann/server", GPU)
    assert status in (201, 202), body
    await eventually(lambda: running(hub, "ann"), "ann's server", within=120)


async def test_a_stop_during_an_api_outage_keeps_the_charge_until_the_pod_is_gone(
    hub_factory, core
):
    relay, hub = await hub_behind_relay(hub_factory)
    await start_ann(hub)
    await relay.cut()
    status, _ = await api(hub, "DELETE", "/users/ann/server")
    assert status in (202, 204)

    async def ann_forgotten():
        _, model = await api(hub, "GET", "/users/ann")
        return model["servers"] == {}

    await eventually(ann_forgotten, "the hub to give up ann's stop", within=60)
    # the pod still runs: the group's one GPU is still taken, and a refused spawn of
    # the same server does not free it either
    assert len(await pods_of(core, hub.namespace, "ann")) == 1
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "lab--nope"})
    assert status == 403, body
    status, body = await api(hub, "POST", "/users/bob/server", GPU)
    assert status == 403, body
    assert body["message"] == (
        "Lab already uses 1 of its 1 GPU, and this server needs 1: try again when one of its "
        "servers stops"
    )

    # the API returns: the hub finishes ann's stop by itself, and then frees the GPU
    await relay.restore()

    async def ann_pod_gone():
        return not await pods_of(core, hub.namespace, "ann") or None

    await eventually(ann_pod_gone, "ann's pod to be deleted", within=60)

    async def bob_admitted():
        status, body = await api(hub, "POST", "/users/bob/server", GPU)
        assert status in (201, 202, 403), body
        return status in (201, 202) or None

    await eventually(bob_admitted, "bob's spawn to be admitted", within=30)
    assert await pods_of(core, hub.namespace, "ann") == []


BRIEF = {
    **POLICY,
    "groups": {
        "lab": {
            "display_name": "Lab",
            "quota": {"gpus": 1},
            "max_runtime": "40s",
            "profiles": ["gpu"],
        }
    },
}


async def test_max_runtime_applies_after_a_hub_restart_to_a_server_started_without_options(
    hub_factory, core
):
    hub = await hub_factory(
        policy=BRIEF,
        users={"ann": ["lab"]},
        admin_users=("root",),
        gpu_service=True,
        cleanup_servers=False,
        extra_config="c.GPUService.rules_interval = 1\n"
        "c.GPUService.hub_poll_interval = 1\n"
        'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
        '"services": ["demo-admin"]})\n',
    )
    # no options: the default profile, the group's GPU
    status, body = await api(hub, "POST", "/users/ann/server", {})
    assert status in (201, 202), body
    await eventually(lambda: pods_of(core, hub.namespace, "ann"), "ann's pod", within=60)
    await asyncio.to_thread(hub.restart)
    await wait_for_service(hub)
    _, model = await api(hub, "GET", "/users/ann")
    assert model["servers"][""]["user_options"] == {}  # what the hub kept
    token = await user_token(hub, "root")

    async def charged():
        # the service joins the hub's server to its pod at its next poll of the hub
        # after its watch has listed the pod (the two run independently)
        _, _, body = await aget(hub.service_url + "api/usage", token)
        servers = json.loads(body)["servers"]
        return servers if servers and servers[0]["group"] else None

    (server,) = await eventually(charged, "the service to charge ann's server", within=30)
    assert server["group"] == "lab"  # from the pod's labels

    async def stopped():
        _, model = await api(hub, "GET", "/users/ann")
        return model["servers"] == {} or None

    await eventually(stopped, "the service to stop ann's server", within=90)
    await wait_no_pods(core, hub.namespace)


async def test_a_hub_restarted_while_the_api_is_down_still_knows_and_counts_its_servers(
    hub_factory, core
):
    relay, hub = await hub_behind_relay(hub_factory, cleanup_servers=False)
    await start_ann(hub)
    await relay.cut()
    restarting = asyncio.create_task(asyncio.to_thread(hub.restart, 180))
    await asyncio.sleep(15)
    await relay.restore()
    await restarting
    # the hub still knows ann's server, its pod lives, and it still counts
    await eventually(lambda: running(hub, "ann"), "ann's server after the restart", within=60)
    assert len(await pods_of(core, hub.namespace, "ann")) == 1
    status, body = await api(hub, "POST", "/users/bob/server", GPU)
    assert status == 403, body
    assert body["message"] == (
        "Lab already uses 1 of its 1 GPU, and this server needs 1: try again when one of its "
        "servers stops"
    )


async def test_after_an_outage_longer_than_the_pod_watch_retries_servers_start(hub_factory):
    relay, hub = await hub_behind_relay(hub_factory)
    await start_ann(hub)
    await relay.cut()
    # KubeSpawner's pod watch gives up for good after about 50 s of failed retries
    await asyncio.sleep(60)
    await relay.restore()
    status, body = await api(hub, "POST", "/users/cat/server", {"profile": "everyone--cpu"})
    assert status in (201, 202), body
    await eventually(lambda: running(hub, "cat"), "cat's server after the outage", within=60)
