"""A server that ends on its own is billed to its pod's real end, through a real hub,
its GPU service and the local cluster: a pod deleted by an admin, a pod deleted while
the hub is down, and a JupyterLab "Shut Down". The hub's poll notices each later than
it happened (here its poll interval is 10 s, and the hub is down for 20 s); none may
be billed until the hub noticed."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from test_gpu_time_service import rows

from hub_helpers import api, no_server, running_hub
from kube_helpers import eventually
from test_service_hub import start_server, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"alpha": {"display_name": "Alpha Lab", "quota": {"gpus": 4}, "profiles": ["small"]}},
}
#: the service's sighting interval
SIGHTING = 2
#: the most an end found after the fact may be off: one sighting, and a second of slack
END_ERROR = SIGHTING + 1
#: the hub's poll: far longer than a sighting, so an end billed when the hub noticed
#: shows
POLL = 10


@pytest.fixture(scope="module")
async def ends_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        users={"ann": ["alpha"], "bob": ["alpha"], "cid": ["alpha"], "root": []},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        # as z2jh's hub: a hub restart leaves the servers running
        cleanup_servers=False,
        extra_config=(
            f"c.GPUService.usage_interval = {SIGHTING}\n"
            "c.GPUService.hub_poll_interval = 1\n"
            "c.GPUKubeSpawner.ledger_resync_interval = 30\n"
            f"c.Spawner.poll_interval = {POLL}\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        yield hub


async def running_row(hub, user: str):
    """Start ``user``'s GPU server and wait until its row is written."""
    await start_server(hub, user, "alpha--small")

    async def recorded():
        found = await rows(hub, user=user)
        return found and found[-1].ended is None and found[-1]

    return await eventually(recorded, f"{user}'s server to be recorded", within=30)


async def billed_end(hub, user: str, uid: str) -> float:
    """The end of pod ``uid``'s row once the hub has noticed the server stopped too."""
    await eventually(lambda: no_server(hub, user), f"the hub to find {user}'s server gone", 90)

    async def ended():
        (row,) = await rows(hub, uid=uid)
        return row.ended

    return await eventually(ended, f"{user}'s row to be ended", within=30)


async def the_pod(core, hub, user: str):
    (pod,) = (
        await core.list_namespaced_pod(
            hub.namespace, label_selector=f"hub.jupyter.org/username={user}"
        )
    ).items
    return pod


async def test_a_pod_an_admin_deletes_is_billed_to_its_deletion_not_to_the_hubs_poll(
    ends_hub, core
):
    row = await running_row(ends_hub, "cid")
    pod = await the_pod(core, ends_hub, "cid")
    await core.delete_namespaced_pod(pod.metadata.name, ends_hub.namespace, grace_period_seconds=0)
    deleted = time.time()
    end = await billed_end(ends_hub, "cid", row.uid)
    assert deleted - END_ERROR <= end <= deleted + 1, (end - deleted, end, deleted)
    log = ends_hub.log_path.read_text(errors="replace")
    assert "its pod had ended before the hub stopped it" in log, "\n".join(
        [line for line in log.splitlines() if "cid" in line and "GET /hub/api" not in line]
    )


async def test_a_pod_deleted_while_the_hub_is_down_is_billed_to_its_end_not_the_restart(
    ends_hub, core
):
    row = await running_row(ends_hub, "ann")
    pod = await the_pod(core, ends_hub, "ann")
    stopping = time.time()
    # the hub's pod goes (its GPU service with it), and so does ann's server meanwhile
    await asyncio.to_thread(ends_hub._stop_process)
    await core.delete_namespaced_pod(pod.metadata.name, ends_hub.namespace, grace_period_seconds=0)
    deleted = time.time()
    await asyncio.sleep(20)  # the hub is down this long
    await asyncio.to_thread(ends_hub.start)
    restarted = time.time()
    end = await billed_end(ends_hub, "ann", row.uid)
    # its last sighting, before the hub went down: nobody saw it after that
    assert stopping - END_ERROR <= end <= deleted + 1, (end - stopping, deleted - stopping)
    assert end < restarted - 15
    log = ends_hub.log_path.read_text(errors="replace")
    assert "GPU time of ann: its pod had ended before the hub stopped it" in log
    await wait_for_service(ends_hub)
    # the service, back too, leaves it there
    (row,) = await rows(ends_hub, uid=row.uid)
    assert row.ended == end


def shut_down(hub, user: str, token: str) -> None:
    """JupyterLab's File > Shut Down: POST api/shutdown to the user's server."""
    request = urllib.request.Request(
        f"{hub.url}/user/{user}/api/shutdown",
        data=b"",
        method="POST",
        headers={"Authorization": f"token {token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 202, 204), response.status


async def test_a_server_shut_down_from_jupyterlab_is_billed_to_its_process_exit(ends_hub, core):
    row = await running_row(ends_hub, "bob")
    status, body = await api(
        ends_hub, "POST", "/users/bob/tokens", {"scopes": ["access:servers!user=bob"]}
    )
    assert status == 201, body
    await asyncio.to_thread(shut_down, ends_hub, "bob", body["token"])
    shut = time.time()
    end = await billed_end(ends_hub, "bob", row.uid)
    # its container's finishedAt (whole seconds), as the pod reported it
    assert shut - END_ERROR <= end <= shut + END_ERROR, (end - shut, end, shut)
    log = ends_hub.log_path.read_text(errors="replace")
    assert "ended when the pod ended" in log
