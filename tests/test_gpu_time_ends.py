"""A server that ends on its own is billed to its pod's real end, through a real hub,
its GPU service and the local cluster: a pod deleted by an admin, a pod deleted while
the hub is down, and a JupyterLab "Shut Down". The hub's poll notices each later than
it happened (here its poll interval is 10 s, and the hub is down for 20 s); none may
be billed until the hub noticed. And a month's showback over all of these, a service
restart and a hub restart is each pod's life as the API server reported it."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import time
import urllib.request
from datetime import datetime

import pytest
from test_gpu_time_service import get_json, rows

from hub_helpers import api, no_server, running_hub
from jupyterhub_gpu.core.showback import month_of
from kube_helpers import eventually
from test_service_hub import aget, service_pids, start_server, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"alpha": {"display_name": "Alpha Lab", "quota": {"gpus": 8}, "profiles": ["small"]}},
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
        users={
            **{user: ["alpha"] for user in ("ann", "bob", "cid", "dee", "eli", "fay", "gus")},
            "root": [],
        },
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


class PodLives:
    """Every server pod of a namespace as the API server last reported it, by uid, those
    deleted too (the object of their deletion event), from a list and a watch."""

    SELECTOR = "component=singleuser-server"

    def __init__(self, core, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.last: dict[str, dict] = {}
        #: when the watch reported each deleted pod gone (epoch seconds)
        self.gone: dict[str, float] = {}

    async def watch(self) -> None:
        listed = await self.core.list_namespaced_pod(
            self.namespace, label_selector=self.SELECTOR, _preload_content=False
        )
        data = json.loads(await listed.read())
        for pod in data["items"]:
            self.last[pod["metadata"]["uid"]] = pod
        response = await self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.SELECTOR,
            watch=True,
            resource_version=data["metadata"]["resourceVersion"],
            timeout_seconds=900,
            _request_timeout=930,
            _preload_content=False,
        )
        async for line in response.content:
            event = json.loads(line)
            if event["type"] == "ERROR":
                raise RuntimeError(f"the pod watch failed: {event['object']}")
            pod = event["object"]
            self.last[pod["metadata"]["uid"]] = pod
            if event["type"] == "DELETED":
                self.gone[pod["metadata"]["uid"]] = time.time()

    def life(self, uid: str) -> tuple[float, float]:
        """(start, end) of pod ``uid``: its ``startTime``, and the earliest of its server
        container's ``finishedAt`` and the moment its deletion was asked
        (``deletionTimestamp`` less the grace it gave), else the moment it was reported
        gone."""
        pod = self.last[uid]
        ends = []
        for status in pod["status"].get("containerStatuses") or []:
            finished = ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")
            if status["name"] == "notebook" and finished:
                ends.append(epoch(finished))
        deleted = pod["metadata"].get("deletionTimestamp")
        if deleted:
            ends.append(epoch(deleted) - (pod["metadata"].get("deletionGracePeriodSeconds") or 0))
        if not ends:
            ends.append(self.gone[uid])
        return epoch(pod["status"]["startTime"]), min(ends)


def epoch(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def row_ended(hub, uid: str) -> float:
    async def ended():
        (row,) = await rows(hub, uid=uid)
        return row.ended

    return await eventually(ended, f"the row of pod {uid} to be ended", within=30)


async def showback_hours(hub, token: str, months: list[str]) -> tuple[dict, dict]:
    """Each alpha user's GPU-hours in ``months``: (from the JSON, from the CSV)."""
    from_json: dict[str, float] = {}
    from_csv: dict[str, float] = {}
    for month in months:
        status, body = await get_json(hub, token, f"api/showback?month={month}")
        assert status == 200, body
        for row in body["users"]:
            if row["group"] == "alpha":
                from_json[row["user"]] = from_json.get(row["user"], 0.0) + row["gpu_hours"]
        status, _, text = await aget(
            hub.service_url + f"api/showback?month={month}&format=csv", token
        )
        assert status == 200, text
        for row in csv.DictReader(io.StringIO(text)):
            if row["group"] == "alpha":
                from_csv[row["user"]] = from_csv.get(row["user"], 0.0) + float(row["gpu_hours"])
    return from_json, from_csv


async def test_a_months_showback_over_faults_is_each_pods_real_life(ends_hub, core):
    """Four GPU servers: dee's pod deleted by an admin; the GPU service killed, and fay's
    server shut down from JupyterLab while it is down; the hub's pod stopped, with eli's
    pod deleted while it is down; gus's running through all of it, stopped through the
    hub at the end. The month's showback (JSON and CSV) bills each the GPU-hours of its
    pod's life as the API server reported it, within one sighting interval (eli's: also
    the seconds between the hub's going down and the deletion, which nobody saw)."""
    hub = ends_hub
    lives = PodLives(core, hub.namespace)
    watching = asyncio.create_task(lives.watch())
    first_month = month_of(time.time())
    users = ("dee", "eli", "fay", "gus")
    opened = dict(
        zip(users, await asyncio.gather(*map(running_row, [hub] * 4, users)), strict=True)
    )
    uid = {user: row.uid for user, row in opened.items()}
    pods = {user: (await the_pod(core, hub, user)).metadata.name for user in users}

    await core.delete_namespaced_pod(pods["dee"], hub.namespace, grace_period_seconds=0)
    await row_ended(hub, uid["dee"])

    (service,) = service_pids(hub)
    os.kill(service, signal.SIGKILL)

    async def gone():
        return service not in service_pids(hub)

    await eventually(gone, "the service to be gone", within=10, interval=0.1)
    status, body = await api(
        hub, "POST", "/users/fay/tokens", {"scopes": ["access:servers!user=fay"]}
    )
    assert status == 201, body
    await asyncio.to_thread(shut_down, hub, "fay", body["token"])
    await wait_for_service(hub)  # the hub started it again
    back = time.time()

    async def seen_again():
        # the service's first pass after its restart has seen the servers still running
        found = [(await rows(hub, uid=uid[user]))[0] for user in ("eli", "gus")]
        return all(row.last_seen > back for row in found)

    await eventually(seen_again, "the restarted service to see eli's and gus's pods", 30)

    stopping = time.time()
    await asyncio.to_thread(hub._stop_process)
    await core.delete_namespaced_pod(pods["eli"], hub.namespace, grace_period_seconds=0)
    unseen = time.time() - stopping  # eli's pod went while nobody looked, up to this long
    await asyncio.to_thread(hub.start)
    await wait_for_service(hub)
    for user in ("dee", "eli", "fay"):
        await eventually(lambda u=user: no_server(hub, u), f"the hub to find {user}'s gone", 60)
    status, _ = await api(hub, "DELETE", "/users/gus/server")
    assert status in (202, 204)
    await eventually(lambda: no_server(hub, "gus"), "gus's server to stop", within=60)

    ended = {user: await row_ended(hub, uid[user]) for user in users}
    recorded = {user: (ended[user] - row.started) / 3600 for user, row in opened.items()}
    months = sorted({first_month, month_of(time.time())})
    root = await user_token(hub, "root")

    async def billed():
        # this month's showback is made once per pass: until it has every end
        found = await showback_hours(hub, root, months)
        return all(found[0].get(u) == pytest.approx(recorded[u], abs=1e-4) for u in users) and found

    from_json, from_csv = await eventually(billed, "showback to bill every end", within=30)
    assert not watching.done(), watching
    watching.cancel()
    for user in users:
        start, end = lives.life(uid[user])
        assert opened[user].started == start, user  # billed from its startTime
        allowed = (SIGHTING + 1 + (unseen if user == "eli" else 0)) / 3600
        real = (end - start) / 3600
        assert from_json[user] == pytest.approx(real, abs=allowed), (user, from_json[user], real)
        assert from_csv[user] == pytest.approx(from_json[user], abs=1e-4), user
