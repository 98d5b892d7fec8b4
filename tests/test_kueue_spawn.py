"""A server Kueue queues: its place in line on the spawn page, its own timeout.

One cluster for the module runs Kueue's manager, and one hub spawns into it.
The hub's quota is the first gate, Kueue's ClusterQueue the second: group
``lab`` (quota 1 GPU, limit 3) sits under ``dept`` (quota 1 GPU, limit 3), so
the hub admits lab servers over quota, up to three GPUs, while the cohort's
nominal quota is one GPU with nothing to borrow: Kueue queues the second and
third servers.

``start_timeout`` is short (15 s) and ``queue_timeout`` longer (45 s): a
server queued past ``start_timeout`` is not failed; one queued past
``queue_timeout`` is.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from browser import log_in
from hub_helpers import api, no_server, pod_json, progress_messages, ready, running_hub, server
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.kube.reconciler import Reconciler
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

KUEUE = ("kueue.x-k8s.io", "v1beta2")
GATE = "kueue.x-k8s.io/admission"
H200 = "NVIDIA-H200-NVL"
SCREENSHOTS = Path(os.environ.get("JUPYTERHUB_GPU_SCREENSHOTS", "/tmp/jupyterhub-gpu-screenshots"))
START_TIMEOUT = 15
QUEUE_TIMEOUT = 45

POLICY = {
    "scheduler": {"name": "kueue"},
    "flavors": {
        "h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": H200}},
        # no node has it: Kueue admits such a server (it counts quota, not nodes), and
        # then the scheduler cannot place it
        "b300": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-B300"}},
    },
    "profiles": {
        "gpu": {"display_name": "One H200", "cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}},
        "b300": {"display_name": "One B300", "cpu": 1, "memory": "1Gi", "gpu": {"flavor": "b300"}},
    },
    "groups": {
        "dept": {"quota": {"gpus": 1}, "limit": {"gpus": 3}},
        "lab": {
            "parent": "dept",
            "quota": {"gpus": 1},
            "limit": {"gpus": 3},
            "profiles": ["gpu"],
        },
        "ops": {"quota": {"gpus": 1}, "profiles": ["b300"]},
        # a cohort of two groups with one GPU each; the hub lets the pool run a third
        # server over its quota, which Kueue's cohort (two GPUs) has no room for
        "pool": {"quota": {"gpus": 2}, "limit": {"gpus": 3}},
        "a": {"parent": "pool", "quota": {"gpus": 1}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
        "b": {"parent": "pool", "quota": {"gpus": 1}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
    },
}
GPU = {"profile": "lab--gpu"}
USERS = ("ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal")
GROUPS = {"eve": ["ops"], "fay": ["a"], "gus": ["a"], "hal": ["b"]}


@pytest.fixture(scope="module")
async def kube(kueue_cluster):
    async with kueue_cluster.api() as api_client:
        yield api_client


@pytest.fixture(scope="module")
async def hub(kueue_cluster, kube):
    """The hub, started once the reconciler's queues for its namespace are active."""
    core = client.CoreV1Api(kube)
    extra = (
        f"c.KubeSpawner.start_timeout = {START_TIMEOUT}\n"
        f"c.GPUKubeSpawner.queue_timeout = {QUEUE_TIMEOUT}\n"
        "c.GPUKubeSpawner.wait_poll_interval = 1\n"
        # KubeSpawner 7.1's "please be patient", early: it must not hide the queue line
        "c.KubeSpawner.slow_spawn_message_threshold = 3\n"
        'c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}\n'
    )
    async with running_hub(
        kueue_cluster,
        core,
        start=False,
        policy=POLICY,
        users={u: GROUPS.get(u, ["lab"]) for u in USERS},
        extra_config=extra,
    ) as hub:
        report = await Reconciler(kube, hub.namespace).reconcile(parse_policy(**POLICY))
        assert report.ok, report.summary()
        custom = client.CustomObjectsApi(kube)
        for name in ("lab", "dept", "ops", "pool", "a", "b"):
            await eventually(
                lambda name=name: _active(
                    custom.get_cluster_custom_object(*KUEUE, "clusterqueues", name)
                ),
                f"ClusterQueue {name} Active",
                within=60,
            )
        local_queue = custom.get_namespaced_custom_object
        for name in ("lab", "ops", "a", "b"):
            await eventually(
                lambda name=name: _active(local_queue(*KUEUE, hub.namespace, "localqueues", name)),
                f"LocalQueue {name} Active",
                within=60,
            )
        await asyncio.to_thread(hub.start)
        yield hub


@pytest.fixture
async def stopped_after(hub, kube):
    """Every user's server is stopped, and its pod gone, after the test."""
    yield
    core = client.CoreV1Api(kube)
    for user in USERS:
        await api(hub, "DELETE", f"/users/{user}/server")

    async def no_pods():
        return not (await core.list_namespaced_pod(hub.namespace)).items

    await eventually(no_pods, "every server's pod gone", within=90)


async def _active(read) -> bool:
    obj = await read
    return any(
        c["type"] == "Active" and c["status"] == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


async def gated_pod(kube, namespace: str, user: str) -> dict | None:
    pods = await client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    if not pods.items:
        return None
    pod = await pod_json(client.CoreV1Api(kube), namespace, pods.items[0].metadata.name)
    gates = [g["name"] for g in pod["spec"].get("schedulingGates", [])]
    return pod if GATE in gates else None


async def test_a_queued_server_shows_its_place_outlasts_start_timeout_and_starts_when_one_stops(
    hub, kube, stopped_after
):
    # a GPU server spawned through the hub: Kueue admits it, and it becomes ready
    status, body = await api(hub, "POST", "/users/ann/server", GPU)
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's server ready", within=120)
    await admitted_by_kueue(kube, hub.namespace, "ann")

    # the hub admits bob over lab's quota (up to its limit); Kueue's queue is full
    status, body = await api(hub, "POST", "/users/bob/server", GPU)
    assert status == 202, body
    queued_at = time.monotonic()
    await eventually(lambda: gated_pod(kube, hub.namespace, "bob"), "bob's pod gated", within=60)
    messages = await asyncio.to_thread(
        progress_messages, hub, "bob", "waiting in Kueue queue lab: position 1", 60
    )
    line = messages[-1]
    # Kueue's own reason: the GPU quota it cannot assign
    assert "Kueue: couldn't assign flavors" in line, line
    assert "nvidia.com/gpu" in line, line
    assert "starts by itself when Kueue admits it" in line

    # cy queues behind bob
    status, body = await api(hub, "POST", "/users/cy/server", GPU)
    assert status == 202, body
    await asyncio.to_thread(progress_messages, hub, "cy", "waiting in Kueue queue lab: position 2")

    # queued well past start_timeout, bob's spawn is still pending, not failed
    await asyncio.sleep(max(0.0, queued_at + START_TIMEOUT + 10 - time.monotonic()))
    pending = await server(hub, "bob")
    assert pending is not None
    assert pending["pending"] == "spawn", pending
    assert await gated_pod(kube, hub.namespace, "bob")

    # ann stops: Kueue admits bob, first in line, who starts; cy moves up
    await api(hub, "DELETE", "/users/ann/server")
    await eventually(lambda: ready(hub, "bob"), "bob's server after ann stopped", within=90)
    await admitted_by_kueue(kube, hub.namespace, "bob")
    await asyncio.to_thread(progress_messages, hub, "cy", "waiting in Kueue queue lab: position 1")

    # cy is still queued at queue_timeout: the spawn page says the spawn was given up
    messages = await asyncio.to_thread(
        progress_messages, hub, "cy", "without being admitted", QUEUE_TIMEOUT + 30
    )
    assert messages[-1].startswith("Spawn failed: the server waited"), messages[-1]
    assert (
        "in Kueue queue lab without being admitted (the hub's queue_timeout is " in (messages[-1])
    )
    assert f"queue_timeout is {QUEUE_TIMEOUT} s" in messages[-1]
    await eventually(lambda: no_server(hub, "cy"), "cy's server gone", within=30)
    await eventually(lambda: _no_pod(kube, hub.namespace, "cy"), "cy's pod deleted", within=60)
    assert await ready(hub, "bob")  # the queue's timeout touched no running server


async def test_start_timeout_still_bounds_a_start_that_kueue_admitted(hub, kube, stopped_after):
    """Kueue admits eve's server at once (its queue is empty), but no node has its GPU."""
    started = time.monotonic()
    status, body = await api(hub, "POST", "/users/eve/server", {"profile": "ops--b300"})
    assert status == 202, body
    messages = await asyncio.to_thread(
        progress_messages, hub, "eve", "Spawn failed", START_TIMEOUT + 30
    )
    failed_after = time.monotonic() - started
    # start_timeout, not the longer bound the hub keeps for servers queued in Kueue
    assert failed_after < START_TIMEOUT + 10, failed_after
    assert f"did not start in {START_TIMEOUT} seconds" in messages[-1], messages
    await eventually(lambda: no_server(hub, "eve"), "eve's server gone", within=30)
    await eventually(lambda: _no_pod(kube, hub.namespace, "eve"), "eve's pod deleted", within=60)


async def test_kueue_preempts_the_over_quota_server_for_one_its_cohort_lent(
    hub, kube, stopped_after
):
    """fay's server is within group a's quota, gus's over it (borrowing b's GPU through
    the cohort); when hal starts one in b, Kueue takes b's GPU back from gus, not fay."""
    core = client.CoreV1Api(kube)
    for user in ("fay", "gus"):
        status, body = await api(hub, "POST", f"/users/{user}/server", {"profile": "a--gpu"})
        assert status in (201, 202), body
        await eventually(lambda user=user: ready(hub, user), f"{user}'s server", within=120)
    fay = await user_pod(kube, hub.namespace, "fay")
    gus = await user_pod(kube, hub.namespace, "gus")
    assert fay.spec.priority_class_name == "jupyterhub-gpu-in-quota"
    # the hub ran gus over a's quota: the preemptible tier
    assert gus.spec.priority_class_name == "jupyterhub-gpu-over-quota"
    assert gus.metadata.labels["gpu.jupyterhub.org/tier"] == "over-quota"
    assert gus.spec.priority < fay.spec.priority

    workloads = await client.CustomObjectsApi(kube).list_namespaced_custom_object(
        *KUEUE, hub.namespace, "workloads"
    )
    (gus_workload,) = [
        w["metadata"]["name"]
        for w in workloads["items"]
        if any(o["uid"] == gus.metadata.uid for o in w["metadata"].get("ownerReferences", []))
    ]

    status, body = await api(hub, "POST", "/users/hal/server", {"profile": "b--gpu"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "hal"), "hal's server after Kueue preempted", within=120)
    await admitted_by_kueue(kube, hub.namespace, "hal", "b")

    # Kueue says why gus's server went (its Workload is gone with the pod by now)
    async def preempted():
        events = await core.list_namespaced_event(
            hub.namespace, field_selector=f"involvedObject.name={gus_workload}"
        )
        return [e for e in events.items if e.reason == "Preempted"]

    (event,) = await eventually(preempted, "Kueue's Preempted event for gus", within=30)
    assert "reclamation within the cohort" in event.message, event.message
    await eventually(lambda: no_server(hub, "gus"), "gus's server stopped", within=90)
    assert await ready(hub, "fay")  # the in-quota server was not touched
    assert (await core.read_namespaced_pod(fay.metadata.name, hub.namespace)).status.phase == (
        "Running"
    )


async def user_pod(kube, namespace: str, user: str) -> client.V1Pod:
    pods = await client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    (pod,) = pods.items
    return pod


async def admitted_by_kueue(kube, namespace: str, user: str, queue: str = "lab") -> None:
    pods = await client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    pod = pods.items[0]
    assert pod.metadata.labels["kueue.x-k8s.io/managed"] == "true"  # Kueue took it on
    assert not pod.spec.scheduling_gates
    workloads = await client.CustomObjectsApi(kube).list_namespaced_custom_object(
        *KUEUE, namespace, "workloads"
    )
    mine = [
        w
        for w in workloads["items"]
        if any(o["uid"] == pod.metadata.uid for o in w["metadata"].get("ownerReferences", []))
    ]
    assert len(mine) == 1
    assert mine[0]["status"]["admission"]["clusterQueue"] == queue


async def _no_pod(kube, namespace: str, user: str) -> bool:
    pods = await client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    return not pods.items


async def test_the_spawn_page_shows_the_place_in_the_kueue_queue(hub, kube, page, stopped_after):
    status, body = await api(hub, "POST", "/users/ann/server", GPU)
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's server ready", within=120)

    await log_in(page, hub.url, "dee", hub.password)
    await page.click("button[type=submit]")  # the one profile, One H200
    await page.wait_for_url(f"{hub.url}/hub/spawn-pending/dee**", timeout=30_000)
    # the line under the progress bar says where dee waits and why
    message = page.locator("#progress-message")
    await message.get_by_text("waiting in Kueue queue lab: position 1").wait_for(timeout=60_000)
    text = await message.inner_text()
    assert "Kueue: couldn't assign flavors" in text, text
    # still there after KubeSpawner's "please be patient" would have replaced it
    await asyncio.sleep(8)
    text = await message.inner_text()
    assert text.startswith("waiting in Kueue queue lab: position 1"), text
    await page.click("#progress-details summary")  # the event log, for the screenshot
    await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / "spawn-kueue-queue.png"), full_page=True)
