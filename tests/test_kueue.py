"""A real Kueue in the local cluster: the reconciler's queues, the hub's pods in them.

One cluster for the module runs Kueue's manager (``schedulers=("kueue",)``). The
policy runs every server in the hub's namespace (no namespace per group). Kueue
and a hub together (servers queued, preempted, a pod created past the hub held)
are tests/test_scheduler_spawn.py, for Volcano alike.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from jupyterhub_gpu.config.values import policy_from_values
from jupyterhub_gpu.hub.offline import render_pod
from jupyterhub_gpu.kube.reconciler import Reconciler
from kube_helpers import eventually

pytestmark = pytest.mark.k8s

KUEUE = ("kueue.x-k8s.io", "v1beta2")
GATE = "kueue.x-k8s.io/admission"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
H200 = "NVIDIA-H200-NVL"


@pytest.fixture(scope="module")
async def kube(kueue_cluster):
    async with kueue_cluster.api() as api:
        yield api


@pytest.fixture(scope="module")
def hub_namespace() -> str:
    return f"kq-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def values_file(tmp_path_factory, hub_namespace) -> Path:
    """A kueue policy: group ``lab`` with one GPU, its servers in the hub's namespace."""
    values = {
        "hub": {
            "config": {
                "KubeSpawner": {"namespace": hub_namespace},
                "GPUPolicy": {
                    "scheduler": {"name": "kueue"},
                    "flavors": {
                        "h200": {
                            "kind": "gpu",
                            "node_selector": {"nvidia.com/gpu.product": H200},
                        }
                    },
                    "profiles": {"gpu": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}},
                    "groups": {"lab": {"quota": {"gpus": 1}, "profiles": ["gpu"]}},
                },
            }
        }
    }
    path = tmp_path_factory.mktemp("kueue-values") / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module")
async def reconciled(kube, hub_namespace, values_file):
    """The hub's namespace and the reconciler's objects for the policy; the report."""
    core = client.CoreV1Api(kube)
    await core.create_namespace({"metadata": {"name": hub_namespace}})
    await eventually(
        lambda: _has_default_service_account(core, hub_namespace),
        f"service account {hub_namespace}/default",
    )
    report = await Reconciler(kube, hub_namespace).reconcile(policy_from_values([values_file]))
    return report


@pytest.fixture
async def created_pods(kube, hub_namespace):
    """Names of pods a test creates in the hub's namespace; gone (and their GPU given
    back to the queue) before the next test starts."""
    names: list[str] = []
    yield names
    core = client.CoreV1Api(kube)
    for name in names:
        try:
            await core.delete_namespaced_pod(name, hub_namespace, grace_period_seconds=0)
        except client.ApiException as e:
            if e.status != 404:
                raise

    async def all_gone():
        listed = await core.list_namespaced_pod(hub_namespace)
        return not {p.metadata.name for p in listed.items} & set(names)

    await eventually(all_gone, f"pods {names} deleted", within=60)


async def _has_default_service_account(core, namespace: str) -> bool:
    accounts = await core.list_namespaced_service_account(namespace)
    return any(a.metadata.name == "default" for a in accounts.items)


async def spawner_pod(values_file: Path, user: str) -> dict:
    """The pod the hub's spawner creates for ``user`` in group ``lab`` (1 GPU)."""
    pod = await render_pod([str(values_file)], user, ["lab"], None, {})
    # without a hub to reach, a hub token would make the pod runner start a server that
    # exits at once; without one the pod stays simulated (Running, nothing started)
    for container in pod["spec"]["containers"]:
        container["env"] = [
            e for e in container.get("env", []) if e["name"] not in ("JUPYTERHUB_API_TOKEN",)
        ]
    return pod


def condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


async def workload_of(kube, pod: client.V1Pod) -> dict | None:
    """The Kueue Workload Kueue made for a pod (owned by it), if any."""
    listed = await client.CustomObjectsApi(kube).list_namespaced_custom_object(
        *KUEUE, pod.metadata.namespace, "workloads"
    )
    for workload in listed["items"]:
        owners = workload["metadata"].get("ownerReferences", [])
        if any(o["uid"] == pod.metadata.uid for o in owners):
            return workload
    return None


async def test_the_reconciled_queues_are_accepted_and_the_cluster_queue_becomes_active(
    kube, reconciled, hub_namespace
):
    assert reconciled.ok, reconciled.summary()
    custom = client.CustomObjectsApi(kube)

    async def active_cluster_queue():
        queue = await custom.get_cluster_custom_object(*KUEUE, "clusterqueues", "lab")
        active = condition(queue, "Active")
        return queue if active and active["status"] == "True" else None

    queue = await eventually(active_cluster_queue, "ClusterQueue lab Active", within=60)
    quota = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert {"name": "nvidia.com/gpu", "nominalQuota": "1"} in quota

    async def active_local_queue():
        queue = await custom.get_namespaced_custom_object(
            *KUEUE, hub_namespace, "localqueues", "lab"
        )
        active = condition(queue, "Active")
        return active and active["status"] == "True"

    await eventually(active_local_queue, f"LocalQueue {hub_namespace}/lab Active", within=60)


async def admitted_and_running(kube, namespace: str, name: str) -> tuple[client.V1Pod, dict]:
    core = client.CoreV1Api(kube)

    async def probe():
        pod = await core.read_namespaced_pod(name, namespace)
        workload = await workload_of(kube, pod)
        admitted = workload and condition(workload, "Admitted")
        if admitted and admitted["status"] == "True" and pod.status.phase == "Running":
            return pod, workload
        return None

    return await eventually(probe, f"pod {namespace}/{name} admitted by Kueue and Running", 60)


async def test_a_spawned_pod_is_admitted_by_kueue_and_runs_on_a_gpu_node(
    kube, reconciled, hub_namespace, values_file, created_pods
):
    assert reconciled.ok, reconciled.summary()
    core = client.CoreV1Api(kube)
    manifest = await spawner_pod(values_file, "ann")
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == "lab"
    assert manifest["metadata"]["namespace"] == hub_namespace
    await core.create_namespaced_pod(hub_namespace, manifest)
    created_pods.append(manifest["metadata"]["name"])

    pod, workload = await admitted_and_running(kube, hub_namespace, manifest["metadata"]["name"])
    # Kueue took the pod on (its webhook labels and gates it) and let it go
    assert pod.metadata.labels.get("kueue.x-k8s.io/managed") == "true"
    assert not any(g.name == GATE for g in pod.spec.scheduling_gates or [])
    assert workload["status"]["admission"]["clusterQueue"] == "lab"
    node = await core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == H200
