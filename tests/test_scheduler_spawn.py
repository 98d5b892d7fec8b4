"""The hub's servers in a real scheduler's queue: they wait in line, start, and yield.

The same tests run against Kueue and Volcano: the ``scheduler`` fixture's params
are the two, each with a cluster of its own that runs the scheduler for real, and
one hub spawning into it (the two clusters run one after the other, never at once).
What differs between them (the policy that fills a queue, how the scheduler holds
a pod and says why, how it marks the tiers) is the small object per scheduler
below; a test of one scheduler's own behaviour asks for that one alone.

The hub's quota is the first gate, the scheduler's queue the second: the hub
admits group ``lab``'s servers over its quota, up to its limit, and the queue
has room for fewer, so the next servers wait in it. Groups ``a`` and ``b``
(quota 1 GPU each, limit 2) share the room of two GPUs: a server of ``b``
within its quota takes the GPU back from ``a``'s server above its quota, and
never from the one within it.

``start_timeout`` is short (15 s) and ``queue_timeout`` longer (45 s): a
server queued past ``start_timeout`` is not failed; one queued past
``queue_timeout`` is.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from kubernetes_asyncio import client

from browser import log_in
from hub_helpers import api, no_server, progress_messages, ready, running_hub, server
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.pending import VOLCANO_GROUP_ANNOTATION, kueue_waiting
from jupyterhub_gpu.hub.offline import render_pod
from jupyterhub_gpu.kube.reconciler import Reconciler
from jupyterhub_gpu_dev.localcluster import sockets, volcano
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from kube_helpers import eventually, module_cluster

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = "NVIDIA-H200-NVL"
SCREENSHOTS = Path(os.environ.get("JUPYTERHUB_GPU_SCREENSHOTS", "/tmp/jupyterhub-gpu-screenshots"))
START_TIMEOUT = 15
QUEUE_TIMEOUT = 45

GPU_PROFILE = {"display_name": "One H200", "cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}
H200_FLAVOR = {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": H200}}
#: a whole H200 claimed through DRA (the default pools' h200-dra node)
DRA_FLAVOR = {
    "kind": "dra",
    "display_name": "H200 via DRA",
    "selectors": ["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"],
}
#: what Kueue counts a DRA server's devices in: the name the local cluster's Kueue
#: configuration maps the DeviceClass gpu.nvidia.com to
DRA_DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"


async def user_pod(kube, namespace: str, user: str) -> client.V1Pod | None:
    pods = await client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    return pods.items[0] if pods.items else None


async def _no_pod(kube, namespace: str, user: str) -> bool:
    return await user_pod(kube, namespace, user) is None


class Kueue:
    """Kueue's manager: one cluster of the default node pools. Group ``lab`` (quota 1
    GPU, limit 3) sits under ``dept`` (quota 1 GPU, limit 3), so the hub admits lab
    servers over quota, up to three GPUs, while the cohort's nominal quota is one GPU
    with nothing to borrow: Kueue queues the second and third servers. Group
    ``dralab`` under ``dradept`` is the same for an H200 claimed through DRA (the
    default pools' DRA node), which Kueue counts by its DeviceClass."""

    name = "kueue"
    label = "Kueue"
    api = ("kueue.x-k8s.io", "v1beta2")
    gate = "kueue.x-k8s.io/admission"
    #: the cluster's nodes (LocalCluster's node_pools; None: the default pools)
    node_pools: ClassVar[dict[str, Any] | None] = None
    policy: ClassVar[dict[str, Any]] = {
        "scheduler": {"name": "kueue"},
        "flavors": {
            "h200": H200_FLAVOR,
            # no node has it: Kueue admits such a server (it counts quota, not nodes), and
            # then the scheduler cannot place it
            "b300": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-B300"}},
            "h200-dra": DRA_FLAVOR,
        },
        "profiles": {
            "gpu": GPU_PROFILE,
            "dra": {**GPU_PROFILE, "display_name": "H200 via DRA", "gpu": {"flavor": "h200-dra"}},
            "b300": {
                "display_name": "One B300",
                "cpu": 1,
                "memory": "1Gi",
                "gpu": {"flavor": "b300"},
            },
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
            "a": {
                "parent": "pool",
                "quota": {"gpus": 1},
                "limit": {"gpus": 2},
                "profiles": ["gpu"],
            },
            "b": {
                "parent": "pool",
                "quota": {"gpus": 1},
                "limit": {"gpus": 2},
                "profiles": ["gpu"],
            },
            # lab and dept again, for a DRA server
            "dradept": {"quota": {"gpus": 1}, "limit": {"gpus": 2}},
            "dralab": {
                "parent": "dradept",
                "quota": {"gpus": 1},
                "limit": {"gpus": 2},
                "profiles": ["dra"],
            },
        },
    }
    users: ClassVar[dict[str, list[str]]] = {
        **{u: ["lab"] for u in ("ann", "bob", "cy", "dee")},
        "eve": ["ops"],
        "fay": ["a"],
        "gus": ["a"],
        "hal": ["b"],
        "ivy": ["dralab"],
        "jo": ["dralab"],
    }
    hub_config = (
        # KubeSpawner 7.1's "please be patient", early: it must not hide the queue line
        "c.KubeSpawner.slow_spawn_message_threshold = 3\n"
        'c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}\n'
    )
    #: lab's servers that fill its queue's room; the next ones wait in line
    fill = ("ann",)
    queued = ("bob", "cy")
    #: what the spawn page's line says of a server waiting in the queue
    waiting_reasons = (
        # Kueue's own reason: the GPU quota it cannot assign
        "Kueue: couldn't assign flavors",
        "nvidia.com/gpu",
        "starts by itself when Kueue admits it",
    )
    processes = ("kueue",)
    version = "v0.19.2"

    def health_ports(self, cluster: LocalCluster) -> set[int]:
        return {cluster.state.ports[f"kueue-{s}"] for s in ("webhook", "health")}

    async def queues_open(self, kube, namespace: str) -> None:
        custom = client.CustomObjectsApi(kube)
        for name in ("lab", "dept", "ops", "pool", "a", "b", "dradept", "dralab"):
            await eventually(
                lambda name=name: self._active(
                    custom.get_cluster_custom_object(*self.api, "clusterqueues", name)
                ),
                f"ClusterQueue {name} Active",
                within=60,
            )
        local_queue = custom.get_namespaced_custom_object
        for name in ("lab", "ops", "a", "b", "dralab"):
            await eventually(
                lambda name=name: self._active(
                    local_queue(*self.api, namespace, "localqueues", name)
                ),
                f"LocalQueue {name} Active",
                within=60,
            )

    @staticmethod
    async def _active(read) -> bool:
        obj = await read
        return any(
            c["type"] == "Active" and c["status"] == "True"
            for c in obj.get("status", {}).get("conditions", [])
        )

    @staticmethod
    def condition(obj: dict, kind: str) -> dict | None:
        conditions = obj.get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == kind), None)

    async def workloads_of(self, kube, pod: client.V1Pod) -> list[dict]:
        """The Workloads Kueue made for a pod (owned by it)."""
        listed = await client.CustomObjectsApi(kube).list_namespaced_custom_object(
            *self.api, pod.metadata.namespace, "workloads"
        )
        return [
            w
            for w in listed["items"]
            if any(o["uid"] == pod.metadata.uid for o in w["metadata"].get("ownerReferences", []))
        ]

    def queue_of(self, pod: dict) -> str:
        return pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]

    async def placed(self, kube, namespace: str, user: str, queue: str) -> client.V1Pod:
        """``user``'s pod, once Kueue admitted it into ``queue`` and it runs."""

        async def probe():
            pod = await user_pod(kube, namespace, user)
            mine = pod and await self.workloads_of(kube, pod)
            admitted = mine and self.condition(mine[0], "Admitted")
            if admitted and admitted["status"] == "True" and pod.status.phase == "Running":
                return pod, mine
            return None

        pod, mine = await eventually(probe, f"{user}'s pod admitted by Kueue, running", within=60)
        assert pod.metadata.labels["kueue.x-k8s.io/managed"] == "true"  # Kueue took it on
        assert not pod.spec.scheduling_gates
        assert len(mine) == 1
        assert mine[0]["status"]["admission"]["clusterQueue"] == queue
        assert kueue_waiting(mine[0]) is None
        return pod

    async def held(self, kube, namespace: str, user: str) -> None:
        """Once Kueue holds ``user``'s pod at its admission gate."""
        await eventually(lambda: self.is_held(kube, namespace, user), f"{user}'s pod gated", 60)

    async def is_held(self, kube, namespace: str, user: str) -> bool:
        pod = await user_pod(kube, namespace, user)
        return bool(pod) and any(g.name == self.gate for g in pod.spec.scheduling_gates or [])

    async def why_held(self, kube, namespace: str, user: str) -> None:
        """Kueue's own reason, on the pod's Workload, naming the resource the queue is
        out of; the hub's line for the pod is that reason."""
        pod = await user_pod(kube, namespace, user)

        async def not_reserved():
            mine = await self.workloads_of(kube, pod)
            reserved = mine and self.condition(mine[0], "QuotaReserved")
            return (mine[0], reserved) if reserved and reserved["status"] == "False" else None

        workload, reserved = await eventually(not_reserved, f"Kueue holding {user}", within=60)
        admitted = self.condition(workload, "Admitted")
        assert admitted is None or admitted["status"] == "False"
        assert reserved["reason"] == "Pending"
        assert "nvidia.com/gpu" in reserved["message"], reserved
        assert kueue_waiting(workload) == f"waiting in Kueue queue lab: {reserved['message']}"

    def mark_tiers(self, in_quota: client.V1Pod, over_quota: client.V1Pod) -> None:
        """Kueue preempts by the priority classes alone."""

    async def before_reclaim(self, kube, over_quota: client.V1Pod) -> str:
        """The over-quota pod's Workload, whose events say why it went (the Workload goes
        with the pod)."""
        (workload,) = await self.workloads_of(kube, over_quota)
        return workload["metadata"]["name"]

    async def after_reclaim(self, kube, namespace: str, workload: str) -> None:
        async def preempted():
            events = await client.CoreV1Api(kube).list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={workload}"
            )
            return [e for e in events.items if e.reason == "Preempted"]

        (event,) = await eventually(preempted, "Kueue's Preempted event", within=30)
        assert "reclamation within the cohort" in event.message, event.message


class Volcano:
    """Volcano's scheduler and controller-manager on two H200 GPUs. Group ``lab``
    (quota 1 GPU, limit 4) may run four servers by the hub's count, but its queue's
    room is the cluster's two GPUs, so Volcano keeps the third and fourth servers'
    PodGroups ``Pending``."""

    name = "volcano"
    label = "Volcano"
    api = ("scheduling.volcano.sh", "v1beta1")
    #: two H200 GPUs in all: a queue's room is the cluster's, so Volcano queues and reclaims
    node_pools: ClassVar[dict[str, Any] | None] = {
        "node_pools": {
            "cpu": {"count": 1, "cpu": 32, "memory": "128Gi"},
            "h200": {
                "count": 1,
                "cpu": 64,
                "memory": "512Gi",
                "gpu": {"product": H200, "memory": 143771, "count": 2},
            },
        }
    }
    policy: ClassVar[dict[str, Any]] = {
        "scheduler": {"name": "volcano"},
        "flavors": {"h200": H200_FLAVOR},
        "profiles": {"gpu": GPU_PROFILE},
        "groups": {
            "lab": {"quota": {"gpus": 1}, "limit": {"gpus": 4}, "profiles": ["gpu"]},
            "a": {"quota": {"gpus": 1}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
            "b": {"quota": {"gpus": 1}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
        },
    }
    users: ClassVar[dict[str, list[str]]] = {
        **{u: ["lab"] for u in ("ann", "bob", "cy", "dee")},
        "fay": ["a"],
        "gus": ["a"],
        "hal": ["b"],
    }
    hub_config = ""
    fill = ("ann", "bob")
    queued = ("cy", "dee")
    waiting_reasons = (
        "Volcano: the queue has no room for it yet (PodGroup Pending",
        "starts by itself when Volcano lets it in",
    )
    processes = (volcano.SCHEDULER, volcano.CONTROLLER_MANAGER)
    version = "v1.10.0"

    def health_ports(self, cluster: LocalCluster) -> set[int]:
        return {cluster.state.ports[f"volcano-{s}"] for s in volcano.SERVERS if "health" in s}

    async def queues_open(self, kube, namespace: str) -> None:
        custom = client.CustomObjectsApi(kube)
        for name in ("lab", "a", "b"):

            async def open_queue(name=name):
                queue = await custom.get_cluster_custom_object(*self.api, "queues", name)
                return queue.get("status", {}).get("state") == "Open"

            await eventually(open_queue, f"Volcano queue {name} Open", within=60)

    async def podgroup(self, kube, pod: client.V1Pod) -> dict | None:
        """The PodGroup Volcano's controller made for ``pod``, once it has."""
        name = (pod.metadata.annotations or {}).get(VOLCANO_GROUP_ANNOTATION)
        if not name:
            return None
        return await client.CustomObjectsApi(kube).get_namespaced_custom_object(
            *self.api, pod.metadata.namespace, "podgroups", name
        )

    def queue_of(self, pod: dict) -> str:
        return pod["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"]

    async def placed(self, kube, namespace: str, user: str, queue: str) -> client.V1Pod:
        """``user``'s pod, once Volcano let its PodGroup into ``queue`` and bound it."""

        async def probe():
            pod = await user_pod(kube, namespace, user)
            group = pod and await self.podgroup(kube, pod)
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

    async def held(self, kube, namespace: str, user: str) -> None:
        """Once Volcano keeps ``user``'s PodGroup out of its queue (``Pending``)."""
        await eventually(
            lambda: self.is_held(kube, namespace, user), f"{user}'s PodGroup Pending", 60
        )

    async def is_held(self, kube, namespace: str, user: str) -> bool:
        pod = await user_pod(kube, namespace, user)
        group = pod and await self.podgroup(kube, pod)
        return bool(group) and group.get("status", {}).get("phase") == "Pending"

    async def why_held(self, kube, namespace: str, user: str) -> None:
        group = await self.podgroup(kube, await user_pod(kube, namespace, user))
        assert group["spec"]["queue"] == "lab"

    def mark_tiers(self, in_quota: client.V1Pod, over_quota: client.V1Pod) -> None:
        """Volcano's reclaim takes only what is marked preemptable."""
        assert in_quota.metadata.annotations["volcano.sh/preemptable"] == "false"
        assert over_quota.metadata.annotations["volcano.sh/preemptable"] == "true"

    async def before_reclaim(self, kube, over_quota: client.V1Pod) -> None:
        return None

    async def after_reclaim(self, kube, namespace: str, _: None) -> None:
        return None


SCHEDULERS = {s.name: s for s in (Kueue(), Volcano())}


@pytest.fixture(scope="module", params=list(SCHEDULERS))
def scheduler(request) -> Kueue | Volcano:
    """Each scheduler in turn; ``@pytest.mark.parametrize("scheduler", [name],
    indirect=True)`` for a test of one scheduler alone."""
    return SCHEDULERS[request.param]


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory, scheduler) -> LocalCluster:
    """The scheduler's own cluster (the schedulers' queues share names)."""
    cluster = module_cluster(
        request, tmp_path_factory, scheduler.name, node_pools=scheduler.node_pools
    )
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
async def kube(cluster):
    async with cluster.api() as api_client:
        yield api_client


@pytest.fixture(scope="module")
async def hub(scheduler, cluster, kube):
    """The hub, started once the reconciler's queues for its policy are open."""
    core = client.CoreV1Api(kube)
    extra = (
        f"c.KubeSpawner.start_timeout = {START_TIMEOUT}\n"
        f"c.GPUKubeSpawner.queue_timeout = {QUEUE_TIMEOUT}\n"
        "c.GPUKubeSpawner.wait_poll_interval = 1\n"
    ) + scheduler.hub_config
    async with running_hub(
        cluster,
        core,
        start=False,
        policy=scheduler.policy,
        users=scheduler.users,
        extra_config=extra,
    ) as hub:
        report = await Reconciler(kube, hub.namespace).reconcile(parse_policy(**scheduler.policy))
        assert report.ok, report.summary()
        await scheduler.queues_open(kube, hub.namespace)
        await asyncio.to_thread(hub.start)
        yield hub


@pytest.fixture
async def stopped_after(scheduler, hub, kube):
    """Every user's server is stopped, and every pod gone, after the test."""
    yield
    core = client.CoreV1Api(kube)
    for user in scheduler.users:
        await api(hub, "DELETE", f"/users/{user}/server")
    for pod in (await core.list_namespaced_pod(hub.namespace)).items:
        await core.delete_namespaced_pod(pod.metadata.name, hub.namespace, grace_period_seconds=0)

    async def no_pods():
        return not (await core.list_namespaced_pod(hub.namespace)).items

    await eventually(no_pods, "every server's pod gone", within=90)


async def test_the_scheduler_runs_on_loopback_and_status_lists_it(scheduler, cluster):
    status = cluster.status()
    assert all(status["processes"].get(p) is True for p in scheduler.processes), status
    assert status["versions"][scheduler.name] == scheduler.version
    pids = [cluster.state.pids[p] for p in scheduler.processes]
    listened = [a for found in sockets.listening_addresses(pids).values() for a in found]
    assert scheduler.health_ports(cluster) <= {int(a.rsplit(":", 1)[1]) for a in listened}, listened
    assert all(sockets.is_loopback(a) for a in listened), listened


async def test_a_queued_server_shows_its_place_outlasts_start_timeout_and_starts_when_one_stops(
    scheduler, hub, kube, stopped_after
):
    label, namespace = scheduler.label, hub.namespace
    first, second = scheduler.queued
    # lab's servers that fill the queue: the scheduler lets each in, and it becomes ready
    for user in scheduler.fill:
        status, body = await api(hub, "POST", f"/users/{user}/server", {"profile": "lab--gpu"})
        assert status in (201, 202), body
        await eventually(lambda user=user: ready(hub, user), f"{user}'s server", within=120)
        await scheduler.placed(kube, namespace, user, "lab")

    # the hub admits the next one over lab's quota (up to its limit); the queue is full
    status, body = await api(hub, "POST", f"/users/{first}/server", {"profile": "lab--gpu"})
    assert status == 202, body
    queued_at = time.monotonic()
    await scheduler.held(kube, namespace, first)
    messages = await asyncio.to_thread(
        progress_messages, hub, first, f"Waiting in {label} queue lab: position 1", 60
    )
    line = messages[-1]
    for reason in scheduler.waiting_reasons:
        assert reason in line, line

    # the next queues behind it
    status, body = await api(hub, "POST", f"/users/{second}/server", {"profile": "lab--gpu"})
    assert status == 202, body
    await asyncio.to_thread(
        progress_messages, hub, second, f"Waiting in {label} queue lab: position 2"
    )

    # queued well past start_timeout, the first one's spawn is still pending, not failed
    await asyncio.sleep(max(0.0, queued_at + START_TIMEOUT + 10 - time.monotonic()))
    pending = await server(hub, first)
    assert pending is not None
    assert pending["pending"] == "spawn", pending
    assert await scheduler.is_held(kube, namespace, first)

    # one stops: the scheduler lets the first in line in, who starts; the next moves up.
    # Its page is read from the stop on: its queue_timeout runs meanwhile, and the move
    # comes with the first one's admission, not once that server is ready
    moved_up = asyncio.ensure_future(
        asyncio.to_thread(
            progress_messages, hub, second, f"Waiting in {label} queue lab: position 1"
        )
    )
    stopping = scheduler.fill[0]
    await api(hub, "DELETE", f"/users/{stopping}/server")
    await eventually(
        lambda: ready(hub, first), f"{first}'s server after {stopping} stopped", within=90
    )
    await scheduler.placed(kube, namespace, first, "lab")
    await moved_up

    # still queued at queue_timeout: the spawn page says the spawn was given up, and why
    messages = await asyncio.to_thread(
        progress_messages, hub, second, "without being admitted", QUEUE_TIMEOUT + 30
    )
    assert messages[-1].startswith("Spawn failed: the server waited"), messages[-1]
    assert (
        f"in {label} queue lab without being admitted, and this hub lets a server wait at "
        f"most {QUEUE_TIMEOUT} seconds: it was not started" in messages[-1]
    ), messages[-1]
    await eventually(lambda: no_server(hub, second), f"{second}'s server gone", within=30)
    await eventually(lambda: _no_pod(kube, namespace, second), f"{second}'s pod deleted", within=60)
    # the queue's timeout touched no running server
    for user in (*scheduler.fill[1:], first):
        assert await ready(hub, user), user


async def test_a_pod_created_past_the_hub_into_the_full_queue_is_held_until_there_is_room(
    scheduler, hub, kube, tmp_path, stopped_after
):
    """The backstop: pods made the way kubectl would, skipping the hub's admission. The
    servers run in the hub's namespace, where no ResourceQuota can tell groups apart:
    the scheduler's queue is what holds them."""
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "hub": {
                    "config": {
                        "KubeSpawner": {"namespace": hub.namespace},
                        "GPUPolicy": scheduler.policy,
                    }
                }
            }
        )
    )
    core = client.CoreV1Api(kube)
    waiting = scheduler.queued[0]
    for user in (*scheduler.fill, waiting):
        pod = await render_pod([str(values)], user, ["lab"], None, {})
        # without a hub to call back, a hub token would make the pod runner start a
        # server that exits at once; without one the pod stays simulated
        for container in pod["spec"]["containers"]:
            container["env"] = [
                e for e in container.get("env", []) if e["name"] != "JUPYTERHUB_API_TOKEN"
            ]
        assert scheduler.queue_of(pod) == "lab"
        assert pod["metadata"]["namespace"] == hub.namespace
        await core.create_namespaced_pod(hub.namespace, pod)
        if user != waiting:
            await scheduler.placed(kube, hub.namespace, user, "lab")

    await scheduler.held(kube, hub.namespace, waiting)
    await scheduler.why_held(kube, hub.namespace, waiting)
    await asyncio.sleep(5)  # several scheduling cycles later it is still held
    pod = await user_pod(kube, hub.namespace, waiting)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"
    assert await scheduler.is_held(kube, hub.namespace, waiting)

    first = await user_pod(kube, hub.namespace, scheduler.fill[0])
    await core.delete_namespaced_pod(first.metadata.name, hub.namespace)
    await scheduler.placed(kube, hub.namespace, waiting, "lab")


async def test_a_server_within_its_quota_takes_the_gpu_back_from_one_above_it(
    scheduler, hub, kube, stopped_after
):
    """fay's and gus's servers hold group a's room, gus's above a's quota (in Kueue
    borrowing b's GPU through the cohort); hal's server, within b's quota, gets its GPU
    back from gus (Kueue's preemption, Volcano's reclaim), never from fay."""
    for user in ("fay", "gus"):
        status, body = await api(hub, "POST", f"/users/{user}/server", {"profile": "a--gpu"})
        assert status in (201, 202), body
        await eventually(lambda user=user: ready(hub, user), f"{user}'s server", within=120)
    fay = await scheduler.placed(kube, hub.namespace, "fay", "a")
    gus = await scheduler.placed(kube, hub.namespace, "gus", "a")
    assert fay.spec.priority_class_name == "jupyterhub-gpu-in-quota"
    # the hub ran gus above a's quota: the preemptible tier
    assert gus.spec.priority_class_name == "jupyterhub-gpu-over-quota"
    assert gus.metadata.labels["gpu.jupyterhub.org/tier"] == "over-quota"
    assert gus.spec.priority < fay.spec.priority
    scheduler.mark_tiers(fay, gus)
    evidence = await scheduler.before_reclaim(kube, gus)

    status, body = await api(hub, "POST", "/users/hal/server", {"profile": "b--gpu"})
    assert status in (201, 202), body
    await eventually(
        lambda: ready(hub, "hal"), f"hal's server after {scheduler.label} took a GPU back", 120
    )
    await scheduler.placed(kube, hub.namespace, "hal", "b")
    # the scheduler says why gus's server went
    await scheduler.after_reclaim(kube, hub.namespace, evidence)

    # gus's pod was evicted and the hub forgot the server; fay's runs on, untouched
    await eventually(lambda: no_server(hub, "gus"), "gus's server stopped", within=90)
    assert await ready(hub, "fay")
    still = await user_pod(kube, hub.namespace, "fay")
    assert still.metadata.uid == fay.metadata.uid
    assert still.status.phase == "Running"


# ---- Kueue's own ------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["kueue"], indirect=True)
async def test_kueue_queues_admits_and_counts_a_dra_servers_devices(
    scheduler, hub, kube, stopped_after
):
    """ivy's DRA server is admitted by Kueue, which counts the one device of its
    ResourceClaimTemplate against dralab's ClusterQueue; kube-scheduler then allocates
    the claim on the DRA node. jo's, which the hub admits over dralab's quota, waits in
    Kueue's queue for want of that device quota, and starts when ivy's stops."""
    custom = client.CustomObjectsApi(kube)
    status, body = await api(hub, "POST", "/users/ivy/server", {"profile": "dralab--dra"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ivy"), "ivy's server", within=120)
    ivy = await scheduler.placed(kube, hub.namespace, "ivy", "dralab")
    assert ivy.spec.node_name == "h200-dra-0"
    (workload,) = await scheduler.workloads_of(kube, ivy)
    (assigned,) = workload["status"]["admission"]["podSetAssignments"]
    assert assigned["resourceUsage"][DRA_DEVICES] == "1"
    assert "nvidia.com/gpu" not in assigned["resourceUsage"]
    (pod_claim,) = ivy.status.resource_claim_statuses
    claim = await custom.get_namespaced_custom_object(
        "resource.k8s.io", "v1", hub.namespace, "resourceclaims", pod_claim.resource_claim_name
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == "h200-dra-0"

    async def counted():
        queue = await custom.get_cluster_custom_object(*scheduler.api, "clusterqueues", "dralab")
        usage = queue.get("status", {}).get("flavorsUsage") or []
        return {
            r["name"]: r["total"] for f in usage for r in f["resources"] if r["name"] == DRA_DEVICES
        }

    assert await eventually(counted, "dralab's ClusterQueue counting the device") == {
        DRA_DEVICES: "1"
    }

    # jo: over dralab's quota, within its limit for the hub; Kueue has no device for it
    status, body = await api(hub, "POST", "/users/jo/server", {"profile": "dralab--dra"})
    assert status == 202, body
    await scheduler.held(kube, hub.namespace, "jo")
    jo = await user_pod(kube, hub.namespace, "jo")

    async def not_reserved():
        mine = await scheduler.workloads_of(kube, jo)
        reserved = mine and scheduler.condition(mine[0], "QuotaReserved")
        return reserved if reserved and reserved["status"] == "False" else None

    reserved = await eventually(not_reserved, "Kueue holding jo's server", within=60)
    assert DRA_DEVICES in reserved["message"], reserved
    messages = await asyncio.to_thread(
        progress_messages, hub, "jo", "Waiting in Kueue queue dralab: position 1", 60
    )
    assert "Kueue: couldn't assign flavors" in messages[-1], messages[-1]

    await api(hub, "DELETE", "/users/ivy/server")
    await eventually(lambda: ready(hub, "jo"), "jo's server after ivy's stopped", within=120)
    jo = await scheduler.placed(kube, hub.namespace, "jo", "dralab")
    assert jo.spec.node_name == "h200-dra-0"


@pytest.mark.parametrize("scheduler", ["kueue"], indirect=True)
async def test_start_timeout_still_bounds_a_start_that_kueue_admitted(
    scheduler, hub, kube, stopped_after
):
    """Kueue admits eve's server at once (its queue is empty), but no node has its GPU:
    the start fails start_timeout after Kueue's admission (the event the hub's bound
    follows), well before the backstop JupyterHub keeps for servers queued in Kueue
    (twice start_timeout, and queue_timeout, and 10 s, from the spawn's start)."""

    def failure() -> tuple[list[str], float]:
        messages = progress_messages(hub, "eve", "Spawn failed", START_TIMEOUT + 90)
        return messages, time.monotonic()

    status, body = await api(hub, "POST", "/users/eve/server", {"profile": "ops--b300"})
    assert status == 202, body
    # the page is read from the spawn's start, so the failure is seen when it comes
    failed = asyncio.ensure_future(asyncio.to_thread(failure))
    pod = await eventually(lambda: user_pod(kube, hub.namespace, "eve"), "eve's pod", within=60)

    async def admitted():
        mine = await scheduler.workloads_of(kube, pod)
        condition = mine and scheduler.condition(mine[0], "Admitted")
        return bool(condition) and condition["status"] == "True"

    await eventually(admitted, "Kueue admitting eve's server", within=60, interval=0.2)
    admitted_at = time.monotonic()
    messages, failed_at = await failed
    failed_after = failed_at - admitted_at
    # start_timeout from the admission (the hub sees it up to a poll later), not the
    # backstop, which would be at least 2 * START_TIMEOUT + QUEUE_TIMEOUT from it
    assert failed_after < 2 * START_TIMEOUT, failed_after
    assert f"did not start in {START_TIMEOUT} seconds" in messages[-1], messages
    await eventually(lambda: no_server(hub, "eve"), "eve's server gone", within=30)
    await eventually(lambda: _no_pod(kube, hub.namespace, "eve"), "eve's pod deleted", within=60)


@pytest.mark.parametrize("scheduler", ["kueue"], indirect=True)
async def test_the_spawn_page_shows_the_place_in_the_kueue_queue(
    scheduler, hub, kube, page, stopped_after
):
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "lab--gpu"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's server ready", within=120)

    await log_in(page, hub.url, "dee", hub.password)
    await page.click("button[type=submit]")  # the one profile, One H200
    await page.wait_for_url(f"{hub.url}/hub/spawn-pending/dee**", timeout=30_000)
    # the line under the progress bar says where dee waits and why
    message = page.locator("#progress-message")
    await message.get_by_text("Waiting in Kueue queue lab: position 1").wait_for(timeout=60_000)
    text = await message.inner_text()
    assert "Kueue: couldn't assign flavors" in text, text
    # still there after KubeSpawner's "please be patient" would have replaced it
    await asyncio.sleep(8)
    text = await message.inner_text()
    assert text.startswith("Waiting in Kueue queue lab: position 1"), text
    await page.click("#progress-details summary")  # the event log, for the screenshot
    await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / "spawn-kueue-queue.png"), full_page=True)
