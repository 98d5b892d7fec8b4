"""The schedulers' own fair sharing follows the policy's shares, with a real Kueue and
a real Volcano.

Kueue: two sibling groups under a parent whose quota is all they can borrow; with
fair share on, the reconciler gives their ClusterQueues Kueue fair-sharing weights
from their shares, and Kueue (its fair sharing on, as a site sets it) divides the
parent's GPUs between them in that ratio, whatever the order their servers came in.
Volcano: two groups without quotas on a cluster of 4 GPUs; their Queues' weights
come from their shares, and Volcano's ``proportion`` plugin (a site's choice over
``capacity``) divides the GPUs in that ratio.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from jupyterhub_gpu.config.values import policy_from_values
from jupyterhub_gpu.core.manifests import priority_classes
from jupyterhub_gpu.hub.offline import render_pod
from jupyterhub_gpu.kube.reconciler import Reconciler
from kube_helpers import eventually, module_cluster

pytestmark = pytest.mark.k8s

KUEUE = ("kueue.x-k8s.io", "v1beta2")
H200 = "NVIDIA-H200-NVL"


@pytest.fixture(scope="module")
def fair_kueue_cluster(request, tmp_path_factory):
    cluster = module_cluster(request, tmp_path_factory, "kueue", kueue_fair_sharing=True)
    yield cluster
    cluster.down()


#: one node of 4 GPUs: what Volcano's queues divide
FOUR_GPUS = {
    "node_pools": {
        "a100": {
            "count": 1,
            "cpu": 32,
            "memory": "128Gi",
            "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "count": 4},
        }
    }
}


@pytest.fixture(scope="module")
def proportion_volcano_cluster(request, tmp_path_factory):
    cluster = module_cluster(
        request, tmp_path_factory, "volcano", volcano_proportion=True, node_pools=FOUR_GPUS
    )
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
async def kube(fair_kueue_cluster):
    async with fair_kueue_cluster.api() as api:
        yield api


@pytest.fixture(scope="module")
async def volcano_kube(proportion_volcano_cluster):
    async with proportion_volcano_cluster.api() as api:
        yield api


async def fresh_namespace(kube) -> str:
    core = client.CoreV1Api(kube)
    name = f"fs-{uuid.uuid4().hex[:6]}"
    await core.create_namespace({"metadata": {"name": name}})

    async def default_account():
        accounts = await core.list_namespaced_service_account(name)
        return any(a.metadata.name == "default" for a in accounts.items)

    await eventually(default_account, f"service account {name}/default")
    return name


@pytest.fixture(scope="module")
async def hub_namespace(kube) -> str:
    return await fresh_namespace(kube)


async def create_servers(kube, path: Path, namespace: str, prefix: str) -> None:
    """Four servers each of groups ``<prefix>a`` and ``<prefix>b``, alternating, as the
    spawner makes them (no hub to reach: each pod stays simulated, nothing started)."""
    core = client.CoreV1Api(kube)
    for i in range(4):
        for side in ("a", "b"):
            pod = await render_pod([str(path)], f"{side}{i}", [f"{prefix}{side}"], None, {})
            pod["metadata"]["name"] = f"{prefix}{side}{i}"
            for container in pod["spec"]["containers"]:
                container["env"] = [
                    e for e in container.get("env", []) if e["name"] != "JUPYTERHUB_API_TOKEN"
                ]
            await core.create_namespaced_pod(namespace, pod)


async def settled(count, want: dict[str, int], what: str) -> None:
    """``count()`` reaches ``want`` and stays there (nothing taken back and forth)."""
    seen: list[dict] = []

    async def divided():
        counted = await count()
        seen.append({q: counted[q] for q in want})
        return seen[-1] == want

    try:
        await eventually(divided, what, within=90)
    except AssertionError as e:
        raise AssertionError(f"{e}; at the last look: {seen[-1:]}") from None
    await asyncio.sleep(5)
    counted = await count()
    assert {q: counted[q] for q in want} == want


def values(hub_namespace: str, prefix: str, shares: tuple[float, float]) -> dict:
    """Parent ``<prefix>lab`` with 4 GPUs, children ``<prefix>a`` and ``<prefix>b`` with
    none of their own, each allowed to borrow all 4, at ``shares``."""
    child = {"quota": {"gpus": 0}, "limit": {"gpus": 4}, "profiles": ["gpu"]}
    return {
        "hub": {
            "config": {
                "KubeSpawner": {"namespace": hub_namespace},
                "GPUPolicy": {
                    "scheduler": {"name": "kueue"},
                    "fair_share": {"half_life": "7d"},
                    "flavors": {
                        "h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": H200}}
                    },
                    "profiles": {
                        "gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}
                    },
                    "groups": {
                        f"{prefix}lab": {"quota": {"gpus": 4}},
                        f"{prefix}a": {**child, "parent": f"{prefix}lab", "share": shares[0]},
                        f"{prefix}b": {**child, "parent": f"{prefix}lab", "share": shares[1]},
                    },
                },
            }
        }
    }


async def admitted_per_queue(kube, namespace: str) -> Counter:
    listed = await client.CustomObjectsApi(kube).list_namespaced_custom_object(
        *KUEUE, namespace, "workloads"
    )
    admitted = Counter()
    for workload in listed["items"]:
        status = workload.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if conditions.get("Admitted") == "True":
            admitted[status["admission"]["clusterQueue"]] += 1
    return admitted


@pytest.mark.parametrize(
    ("shares", "expected"), [((3, 1), (3, 1)), ((1, 1), (2, 2))], ids=["shares-3-1", "equal"]
)
async def test_kueue_divides_a_parents_gpus_between_siblings_by_their_shares(
    kube, hub_namespace, tmp_path, shares, expected
):
    prefix = f"s{shares[0]}{shares[1]}-"
    path = Path(tmp_path) / "values.yaml"
    path.write_text(yaml.safe_dump(values(hub_namespace, prefix, shares)))
    report = await Reconciler(kube, hub_namespace).reconcile(policy_from_values([path]))
    assert report.ok, report.summary()
    custom = client.CustomObjectsApi(kube)
    queue = await custom.get_cluster_custom_object(*KUEUE, "clusterqueues", f"{prefix}a")
    assert queue["spec"]["fairSharing"] == {"weight": str(shares[0])}

    # four servers each, the groups' alternating: more than the parent's 4 GPUs
    await create_servers(kube, path, hub_namespace, prefix)
    want = {f"{prefix}a": expected[0], f"{prefix}b": expected[1]}
    await settled(lambda: admitted_per_queue(kube, hub_namespace), want, f"Kueue to admit {want}")
    core = client.CoreV1Api(kube)
    await core.delete_collection_namespaced_pod(hub_namespace, grace_period_seconds=0)


def top_level_values(prefix: str, shares: tuple[float, float]) -> dict:
    """Groups ``<prefix>a`` and ``<prefix>b`` without quotas, each allowed all 4 GPUs."""
    group = {"limit": {"gpus": 4}, "profiles": ["gpu"]}
    return {
        "hub": {
            "config": {
                "GPUPolicy": {
                    "scheduler": {"name": "volcano"},
                    "fair_share": {"half_life": "7d"},
                    "flavors": {"a100": {"kind": "gpu"}},
                    "profiles": {
                        "gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "a100"}}
                    },
                    "groups": {
                        f"{prefix}a": {**group, "share": shares[0]},
                        f"{prefix}b": {**group, "share": shares[1]},
                    },
                }
            }
        }
    }


@pytest.mark.parametrize(
    ("shares", "expected"), [((3, 1), (3, 1)), ((1, 1), (2, 2))], ids=["shares-3-1", "equal"]
)
async def test_volcano_divides_the_gpus_between_queues_by_the_groups_shares(
    volcano_kube, tmp_path, shares, expected
):
    kube = volcano_kube
    namespace = await fresh_namespace(kube)
    core = client.CoreV1Api(kube)
    try:
        prefix = f"v{shares[0]}{shares[1]}-"
        values = top_level_values(prefix, shares)
        values["hub"]["config"]["KubeSpawner"] = {"namespace": namespace}
        path = Path(tmp_path) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        # every server waits before its queue exists, so that Volcano divides them all
        # at once (one arriving alone would be placed before the others exist, and
        # servers within their quota are not taken back)
        policy = policy_from_values([path])
        scheduling = client.SchedulingV1Api(kube)
        for priority_class in priority_classes(policy, namespace):
            try:
                await scheduling.create_priority_class(priority_class)
            except client.ApiException as e:
                if e.status != 409:  # 409: the other case made it
                    raise
        # ... and no node takes any of them until both queues and every server's
        # PodGroup exist: the queues are created one after the other, and a scheduling
        # session between the two would give the first all the GPUs
        nodes = [n.metadata.name for n in (await core.list_node()).items]
        for node in nodes:
            await core.patch_node(node, {"spec": {"unschedulable": True}})
        try:
            await create_servers(kube, path, namespace, prefix)
            report = await Reconciler(kube, namespace).reconcile(policy)
            assert report.ok, report.summary()
            custom = client.CustomObjectsApi(kube)
            queue = await custom.get_cluster_custom_object(
                "scheduling.volcano.sh", "v1beta1", "queues", f"{prefix}a"
            )
            assert queue["spec"]["weight"] == shares[0]

            async def every_podgroup():
                listed = await custom.list_namespaced_custom_object(
                    "scheduling.volcano.sh", "v1beta1", namespace, "podgroups"
                )
                return len(listed["items"]) == 8

            await eventually(every_podgroup, "Volcano's PodGroups for the 8 servers", within=60)
        finally:
            for node in nodes:
                await core.patch_node(node, {"spec": {"unschedulable": False}})

        async def placed_per_group() -> Counter:
            pods = (await core.list_namespaced_pod(namespace)).items
            return Counter(
                p.metadata.labels["gpu.jupyterhub.org/group"] for p in pods if p.spec.node_name
            )

        want = {f"{prefix}a": expected[0], f"{prefix}b": expected[1]}
        await settled(placed_per_group, want, f"Volcano to place {want}")
    finally:
        # the node's GPUs free for the next case, whatever this one found
        await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        await core.delete_namespace(namespace)
