"""The schedulers' own fair sharing follows the policy's shares, with a real Kueue.

Two sibling groups under a parent whose quota is all they can borrow: with fair
share on, the reconciler gives their ClusterQueues Kueue fair-sharing weights from
their shares, and Kueue (its fair sharing on, as a site sets it) divides the
parent's GPUs between them in that ratio, whatever the order their servers came in.
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
from jupyterhub_gpu.kube.reconciler import Reconciler
from jupyterhub_gpu.offline import render_pod
from kube_helpers import eventually, module_cluster

pytestmark = pytest.mark.k8s

KUEUE = ("kueue.x-k8s.io", "v1beta2")
H200 = "NVIDIA-H200-NVL"


@pytest.fixture(scope="module")
def fair_kueue_cluster(request, tmp_path_factory):
    cluster = module_cluster(request, tmp_path_factory, "kueue", kueue_fair_sharing=True)
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
async def kube(fair_kueue_cluster):
    async with fair_kueue_cluster.api() as api:
        yield api


@pytest.fixture(scope="module")
async def hub_namespace(kube) -> str:
    core = client.CoreV1Api(kube)
    name = f"fs-{uuid.uuid4().hex[:6]}"
    await core.create_namespace({"metadata": {"name": name}})

    async def default_account():
        accounts = await core.list_namespaced_service_account(name)
        return any(a.metadata.name == "default" for a in accounts.items)

    await eventually(default_account, f"service account {name}/default")
    return name


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
    core = client.CoreV1Api(kube)
    for i in range(4):
        for side in ("a", "b"):
            pod = await render_pod([str(path)], f"{side}{i}", [f"{prefix}{side}"], None, {})
            pod["metadata"]["name"] = f"{prefix}{side}{i}"
            # no hub to reach: the pod stays simulated (Running, nothing started)
            for container in pod["spec"]["containers"]:
                container["env"] = [
                    e for e in container.get("env", []) if e["name"] != "JUPYTERHUB_API_TOKEN"
                ]
            await core.create_namespaced_pod(hub_namespace, pod)

    want = {f"{prefix}a": expected[0], f"{prefix}b": expected[1]}

    seen: list[dict] = []

    async def divided():
        admitted = await admitted_per_queue(kube, hub_namespace)
        seen.append({q: admitted[q] for q in want})
        return seen[-1] == want

    try:
        await eventually(divided, f"Kueue to admit {want}", within=90)
    except AssertionError as e:
        raise AssertionError(f"{e}; admitted at the last look: {seen[-1:]}") from None
    await asyncio.sleep(5)  # and it stays so: nothing is preempted back and forth
    admitted = await admitted_per_queue(kube, hub_namespace)
    assert {q: admitted[q] for q in want} == want
    await core.delete_collection_namespaced_pod(hub_namespace, grace_period_seconds=0)
