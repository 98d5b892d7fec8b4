"""A real Volcano in the local cluster: the hub's servers queue, wait, start, and yield.

One cluster for the module runs Volcano's scheduler and controller-manager
(``schedulers=("volcano",)``) on two H200 GPUs, and one hub spawns into it. The
hub's quota is the first gate, Volcano's queue the second: group ``lab`` (quota
1 GPU, limit 4) may run four servers by the hub's count, but its queue's room
is the cluster's two GPUs, so Volcano keeps the third and fourth servers'
PodGroups ``Pending``. Groups ``a`` and ``b`` (quota 1 GPU each, limit 2) share the same
two GPUs: a server of ``b`` within its quota takes the GPU back from ``a``'s
server above its quota, and never from the one within it.

``start_timeout`` is short (15 s) and ``queue_timeout`` longer (45 s): a
server queued past ``start_timeout`` is not failed; one queued past
``queue_timeout`` is.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes_asyncio import client

from hub_helpers import api, no_server, progress_messages, ready, running_hub, server
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.pending import VOLCANO_GROUP_ANNOTATION
from jupyterhub_gpu.dev.localcluster import sockets, volcano
from jupyterhub_gpu.kube.reconciler import Reconciler
from jupyterhub_gpu.offline import render_pod
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

VOLCANO = ("scheduling.volcano.sh", "v1beta1")
H200 = "NVIDIA-H200-NVL"
START_TIMEOUT = 15
QUEUE_TIMEOUT = 45

POLICY = {
    "scheduler": {"name": "volcano"},
    "flavors": {"h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": H200}}},
    "profiles": {
        "gpu": {"display_name": "One H200", "cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}
    },
    "groups": {
        "lab": {"quota": {"gpus": 1}, "limit": {"gpus": 4}, "profiles": ["gpu"]},
        "a": {"quota": {"gpus": 1}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
        "b": {"quota": {"gpus": 1}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
    },
}
LAB = {"profile": "lab--gpu"}
USERS = ("ann", "bob", "cy", "dee", "fay", "gus", "hal")
GROUPS = {"fay": ["a"], "gus": ["a"], "hal": ["b"]}


@pytest.fixture(scope="module")
async def kube(volcano_cluster):
    async with volcano_cluster.api() as api_client:
        yield api_client


@pytest.fixture(scope="module")
async def hub(volcano_cluster, kube):
    """The hub, started once the reconciler's queues for its policy are open."""
    core = client.CoreV1Api(kube)
    extra = (
        f"c.KubeSpawner.start_timeout = {START_TIMEOUT}\n"
        f"c.GPUKubeSpawner.queue_timeout = {QUEUE_TIMEOUT}\n"
        "c.GPUKubeSpawner.wait_poll_interval = 1\n"
    )
    async with running_hub(
        volcano_cluster,
        core,
        start=False,
        policy=POLICY,
        users={u: GROUPS.get(u, ["lab"]) for u in USERS},
        extra_config=extra,
    ) as hub:
        report = await Reconciler(kube, hub.namespace).reconcile(parse_policy(**POLICY))
        assert report.ok, report.summary()
        custom = client.CustomObjectsApi(kube)
        for name in ("lab", "a", "b"):

            async def open_queue(name=name):
                queue = await custom.get_cluster_custom_object(*VOLCANO, "queues", name)
                return queue.get("status", {}).get("state") == "Open"

            await eventually(open_queue, f"Volcano queue {name} Open", within=60)
        await asyncio.to_thread(hub.start)
        yield hub


@pytest.fixture
async def stopped_after(hub, kube):
    """Every user's server is stopped, and every pod gone, after the test."""
    yield
    core = client.CoreV1Api(kube)
    for user in USERS:
        await api(hub, "DELETE", f"/users/{user}/server")
    for pod in (await core.list_namespaced_pod(hub.namespace)).items:
        await core.delete_namespaced_pod(pod.metadata.name, hub.namespace, grace_period_seconds=0)

    async def no_pods():
        return not (await core.list_namespaced_pod(hub.namespace)).items

    await eventually(no_pods, "every server's pod gone", within=90)


async def user_pod(kube, namespace: str, user: str) -> client.V1Pod | None:
    pods = await client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    return pods.items[0] if pods.items else None


async def podgroup(kube, pod: client.V1Pod) -> dict | None:
    """The PodGroup Volcano's controller made for ``pod``, once it has."""
    name = (pod.metadata.annotations or {}).get(VOLCANO_GROUP_ANNOTATION)
    if not name:
        return None
    return await client.CustomObjectsApi(kube).get_namespaced_custom_object(
        *VOLCANO, pod.metadata.namespace, "podgroups", name
    )


async def placed_by_volcano(kube, namespace: str, user: str, queue: str) -> client.V1Pod:
    """``user``'s pod, once Volcano let its PodGroup into ``queue`` and bound it to a node."""

    async def probe():
        pod = await user_pod(kube, namespace, user)
        group = pod and await podgroup(kube, pod)
        phase = (group or {}).get("status", {}).get("phase")
        if pod and pod.spec.node_name and phase in ("Inqueue", "Running"):
            return pod, group
        return None

    pod, group = await eventually(probe, f"{user}'s pod placed by Volcano", within=60)
    assert pod.spec.scheduler_name == "volcano"
    assert group["spec"]["queue"] == queue
    node = await client.CoreV1Api(kube).read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == H200
    return pod


async def held_by_volcano(kube, namespace: str, user: str) -> dict:
    """``user``'s PodGroup, once Volcano keeps it out of its queue (``Pending``)."""

    async def probe():
        pod = await user_pod(kube, namespace, user)
        group = pod and await podgroup(kube, pod)
        if group and group.get("status", {}).get("phase") == "Pending":
            return group
        return None

    return await eventually(probe, f"{user}'s PodGroup Pending", within=60)


async def test_volcano_runs_on_loopback_and_status_lists_it(volcano_cluster):
    status = volcano_cluster.status()
    roles = (volcano.SCHEDULER, volcano.CONTROLLER_MANAGER)
    assert all(status["processes"].get(role) is True for role in roles), status
    assert status["versions"]["volcano"] == "v1.10.0"
    pids = [volcano_cluster.state.pids[role] for role in roles]
    listened = [a for found in sockets.listening_addresses(pids).values() for a in found]
    ports = {volcano_cluster.state.ports[f"volcano-{s}"] for s in volcano.SERVERS if "health" in s}
    assert ports <= {int(a.rsplit(":", 1)[1]) for a in listened}, listened
    assert all(sockets.is_loopback(a) for a in listened), listened


async def test_a_queued_server_shows_its_place_outlasts_start_timeout_and_starts_when_one_stops(
    hub, kube, stopped_after
):
    # two lab servers: Volcano lets each into queue lab and binds it to a GPU node
    for user in ("ann", "bob"):
        status, body = await api(hub, "POST", f"/users/{user}/server", LAB)
        assert status in (201, 202), body
        await eventually(lambda user=user: ready(hub, user), f"{user}'s server", within=120)
        await placed_by_volcano(kube, hub.namespace, user, "lab")

    # the hub admits cy (lab's limit is 4), but the queue's room is the cluster's two GPUs
    status, body = await api(hub, "POST", "/users/cy/server", LAB)
    assert status == 202, body
    queued_at = time.monotonic()
    await held_by_volcano(kube, hub.namespace, "cy")
    messages = await asyncio.to_thread(
        progress_messages, hub, "cy", "waiting in Volcano queue lab: position 1", 60
    )
    line = messages[-1]
    assert "Volcano: the queue has no room for it yet (PodGroup Pending" in line, line
    assert "starts by itself when Volcano lets it in" in line, line

    status, body = await api(hub, "POST", "/users/dee/server", LAB)
    assert status == 202, body
    await asyncio.to_thread(
        progress_messages, hub, "dee", "waiting in Volcano queue lab: position 2"
    )

    # queued well past start_timeout, cy's spawn is still pending, not failed
    await asyncio.sleep(max(0.0, queued_at + START_TIMEOUT + 10 - time.monotonic()))
    pending = await server(hub, "cy")
    assert pending is not None
    assert pending["pending"] == "spawn", pending

    # ann stops: Volcano lets cy in, first in line, who starts; dee moves up
    await api(hub, "DELETE", "/users/ann/server")
    await eventually(lambda: ready(hub, "cy"), "cy's server after ann stopped", within=90)
    await placed_by_volcano(kube, hub.namespace, "cy", "lab")
    await asyncio.to_thread(
        progress_messages, hub, "dee", "waiting in Volcano queue lab: position 1"
    )

    # dee is still queued at queue_timeout: the spawn is given up with the reason
    messages = await asyncio.to_thread(
        progress_messages, hub, "dee", "without being admitted", QUEUE_TIMEOUT + 30
    )
    assert messages[-1].startswith("Spawn failed: the server waited"), messages[-1]
    assert "in Volcano queue lab without being admitted" in messages[-1], messages[-1]
    await eventually(lambda: no_server(hub, "dee"), "dee's server gone", within=30)
    assert await ready(hub, "bob")
    assert await ready(hub, "cy")


async def test_a_pod_created_past_the_hub_into_the_full_queue_is_held_not_run(
    hub, kube, tmp_path, stopped_after
):
    """The backstop: pods made the way kubectl would, skipping the hub's admission."""
    import yaml

    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {"hub": {"config": {"KubeSpawner": {"namespace": hub.namespace}, "GPUPolicy": POLICY}}}
        )
    )
    core = client.CoreV1Api(kube)
    for user in ("ann", "bob", "cy"):
        pod = await render_pod([str(values)], user, ["lab"], None, {})
        for container in pod["spec"]["containers"]:  # no hub to call back: a simulated pod
            container["env"] = [
                e for e in container.get("env", []) if e["name"] != "JUPYTERHUB_API_TOKEN"
            ]
        assert pod["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "lab"
        await core.create_namespaced_pod(hub.namespace, pod)
        if user != "cy":
            await placed_by_volcano(kube, hub.namespace, user, "lab")

    group = await held_by_volcano(kube, hub.namespace, "cy")
    assert group["spec"]["queue"] == "lab"
    await asyncio.sleep(5)  # several scheduling cycles later it is still held
    pod = await user_pod(kube, hub.namespace, "cy")
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"
    assert (await podgroup(kube, pod))["status"]["phase"] == "Pending"

    await core.delete_namespaced_pod(
        (await user_pod(kube, hub.namespace, "ann")).metadata.name, hub.namespace
    )
    await placed_by_volcano(kube, hub.namespace, "cy", "lab")


async def test_volcano_takes_back_the_gpu_a_server_above_its_groups_quota_holds(
    hub, kube, stopped_after
):
    """fay's and gus's servers fill both GPUs, gus's above group a's quota; hal's server,
    within b's quota, gets its GPU back from gus (Volcano's reclaim), never from fay."""
    for user in ("fay", "gus"):
        status, body = await api(hub, "POST", f"/users/{user}/server", {"profile": "a--gpu"})
        assert status in (201, 202), body
        await eventually(lambda user=user: ready(hub, user), f"{user}'s server", within=120)
    fay = await placed_by_volcano(kube, hub.namespace, "fay", "a")
    gus = await placed_by_volcano(kube, hub.namespace, "gus", "a")
    assert fay.spec.priority_class_name == "jupyterhub-gpu-in-quota"
    assert fay.metadata.annotations["volcano.sh/preemptable"] == "false"
    # the hub ran gus above a's quota: the preemptible tier
    assert gus.spec.priority_class_name == "jupyterhub-gpu-over-quota"
    assert gus.metadata.annotations["volcano.sh/preemptable"] == "true"
    assert gus.spec.priority < fay.spec.priority

    status, body = await api(hub, "POST", "/users/hal/server", {"profile": "b--gpu"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "hal"), "hal's server after Volcano's reclaim", within=120)
    await placed_by_volcano(kube, hub.namespace, "hal", "b")

    # gus's pod was evicted and the hub forgot the server; fay's runs on, untouched
    await eventually(lambda: no_server(hub, "gus"), "gus's server stopped", within=90)
    assert await ready(hub, "fay")
    still = await user_pod(kube, hub.namespace, "fay")
    assert still.metadata.uid == fay.metadata.uid
    assert still.status.phase == "Running"
