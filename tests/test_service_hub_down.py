"""Through a hub upgrade: a real hub stopped while servers run and the GPU service, in its
own Deployment's form, goes on: it sights pods and writes usage, a server whose pod is
deleted meanwhile ends at its real time, and a budget's stop that falls due is either
waited with until the hub answers (``stop_without_hub: wait``) or made by deleting the
pod, the hub told once it is back (``delete-pod``); the hub then finds what the cluster
holds.

The service runs as its own process under its own service account with the RBAC
``manifests`` renders for that form (its Lease included); the hub is down for about
a minute.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time

import pytest
from replica_helpers import HUB_SETTINGS, deployment_replica, stop_rows, usage_rows

from kube_helpers import eventually
from test_service_hub import start_server

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
#: 0.015 GPU-hours: 54 GPU-seconds, used up well after the hub is stopped (its server's
#: start and the hub's stop take seconds each on a loaded machine)
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "node_selector": H200}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "alpha": {"quota": {"gpus": 4}, "profiles": ["small"]},
        "course": {
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "budget": {"gpu_hours": 0.015, "period": "1h", "when_exhausted": "stop", "grace": "5s"},
        },
    },
}
SETTINGS = {**HUB_SETTINGS, "metrics_require_auth": False}
#: an end the service witnessed is off by at most a pass and a second of slack
END_ERROR = SETTINGS["usage_interval"] + 1.0


def metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def told_stop(database) -> float | None:
    """The stop announced to the course server (its budget's notice)."""
    with sqlite3.connect(database) as db:
        try:
            row = db.execute("SELECT stop_at FROM jupyterhub_gpu_budget_told").fetchone()
        except sqlite3.OperationalError:
            return None
    return row[0] if row else None


async def server_pod(core, namespace: str, user: str):
    pods = await core.list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    return pods.items[0] if pods.items else None


@pytest.mark.parametrize("mode", ["wait", "delete-pod"])
async def test_through_a_hub_upgrade_usage_goes_on_and_stops_are_made_as_the_docs_say(
    hub_factory, core, local_cluster, tmp_path, mode
):
    hub = await hub_factory(
        users={"ann": ["alpha"], "cid": ["course"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        external_gpu_service=True,
        cleanup_servers=False,  # an upgrade leaves the servers running
        service_settings={**SETTINGS, "stop_without_hub": mode},
        extra_config="c.Spawner.poll_interval = 5\n",
    )
    service = await deployment_replica(hub, core, local_cluster, POLICY, tmp_path)
    database = hub.directory / "jupyterhub-gpu-usage.sqlite"
    try:
        await start_server(hub, "ann", "alpha--small")
        await start_server(hub, "cid", "course--small")
        ann = await server_pod(core, hub.namespace, "ann")
        cid = await server_pod(core, hub.namespace, "cid")

        # the hub goes down (an upgrade); its servers keep running
        await asyncio.to_thread(hub._stop_process)
        # a server's pod goes while nobody but the service watches
        await asyncio.sleep(12)  # past the service's "younger than a pass" margin
        ann_deleted = time.time()
        await core.delete_namespaced_pod(ann.metadata.name, hub.namespace, grace_period_seconds=0)

        async def ann_ended():
            rows = await asyncio.to_thread(usage_rows, database)
            (row,) = rows[f"{hub.namespace}/{ann.metadata.name}"]
            return row[1]

        ended = await eventually(ann_ended, "ann's usage row to end", 30)
        assert ann_deleted - END_ERROR <= ended <= ann_deleted + 1

        # the course's budget is used up, the notice names the stop, its grace ends
        stop_at = await eventually(lambda: asyncio.to_thread(told_stop, database), "notice", 90)
        await asyncio.sleep(max(stop_at - time.time(), 0) + 3 * SETTINGS["rules_interval"])
        metrics = await service.metrics()
        pod_now = await server_pod(core, hub.namespace, "cid")
        if mode == "wait":
            # nothing it cannot stop through the hub: the pod runs, and it says so
            assert pod_now is not None
            assert pod_now.metadata.deletion_timestamp is None
            assert metric(metrics, "jupyterhub_gpu_stops_waiting_for_hub") == 1.0
            assert "cid's server is due to stop (budget) and is not stopped until the hub " in (
                service.log()
            )
        else:
            # deleted directly at the announced time, the hub to be told
            assert pod_now is None or pod_now.metadata.deletion_timestamp is not None
            assert metric(metrics, "jupyterhub_gpu_stops_hub_not_told") == 1.0
        # usage went on meanwhile: the course server's row was seen while the hub was down
        rows = await asyncio.to_thread(usage_rows, database)
        ((_, _, seen),) = rows[f"{hub.namespace}/{cid.metadata.name}"]
        assert seen >= stop_at - 2 * SETTINGS["usage_interval"]

        # the hub is back
        await asyncio.to_thread(hub.start)
        back = time.time()

        async def no_server(user: str):
            status, model = await asyncio.to_thread(hub.api, "GET", f"/users/{user}")
            return status == 200 and "" not in model["servers"]

        # the hub's first look finds the pod that went while it was down
        await eventually(lambda: no_server("ann"), "the hub to find ann's server gone", 60)
        # the course server's stop is carried out through the hub / told to the hub
        await eventually(lambda: no_server("cid"), "cid's server to be stopped", 60)
        await eventually(lambda: _gone(core, hub, "cid"), "cid's pod to be gone", 60)

        async def nothing_left() -> bool:
            metrics = await service.metrics()
            return (
                metric(metrics, "jupyterhub_gpu_stops_waiting_for_hub") == 0.0
                and metric(metrics, "jupyterhub_gpu_stops_hub_not_told") == 0.0
            )

        await eventually(nothing_left, "no stop left waiting for the hub", 30)
        if mode == "delete-pod":
            assert "Told the hub of the servers stopped while it did not answer" in service.log()

        async def cid_ended():
            rows = await asyncio.to_thread(usage_rows, database)
            (row,) = rows[f"{hub.namespace}/{cid.metadata.name}"]
            return row[1]

        cid_end = await eventually(cid_ended, "cid's usage row to end", 30)
        if mode == "wait":
            # stopped once the hub answered, never before the announced time
            assert back - 1 <= cid_end <= time.time()
        else:
            # at its deletion: never before the announced time, within a rules pass of it
            assert stop_at <= cid_end <= stop_at + 2 * SETTINGS["rules_interval"] + 1

        # each end recorded once, the course server's with its reason (the server events
        # are written a run after they happen)
        async def both_ends():
            stops = await asyncio.to_thread(stop_rows, database)
            return stops if {cid.metadata.uid, ann.metadata.uid} <= set(stops) else None

        stops = await eventually(both_ends, "both ends recorded", 30)
        await asyncio.sleep(3 * SETTINGS["rules_interval"])  # and no second one comes
        stops = await asyncio.to_thread(stop_rows, database)
        assert [r for r, _ in stops[cid.metadata.uid]] == ["budget"]
        assert len(stops[ann.metadata.uid]) == 1
        # ann's end stays at its real time, whatever the hub did when it came back
        assert ann_deleted - END_ERROR <= await ann_ended() <= ann_deleted + 1
    finally:
        service.stop()


async def _gone(core, hub, user: str) -> bool:
    return await server_pod(core, hub.namespace, user) is None
