"""The local cluster behaves like a real GPU cluster.

Everything here runs against the real control plane: scheduling, quota
admission, namespace deletion, kwok's simulated GPU nodes, the pod runner.
"""

from __future__ import annotations

import ipaddress

import pytest
from kubernetes_asyncio.client import ApiException

from kube_helpers import created_once_quota_admits, eventually, failed_scheduling, pod_manifest

pytestmark = pytest.mark.k8s


async def _pod(core, ns, name):
    return await core.read_namespaced_pod(name, ns)


async def test_gpu_pod_lands_on_gpu_node_with_loopback_ip(core, namespace):
    await core.create_namespaced_pod(namespace, pod_manifest("one-gpu", {"nvidia.com/gpu": "1"}))

    async def running():
        pod = await _pod(core, namespace, "one-gpu")
        return pod if pod.status.phase == "Running" and pod.status.pod_ip else None

    pod = await eventually(running, "the one-GPU pod to be Running")
    node = await core.read_node(pod.spec.node_name)
    assert int(node.status.allocatable["nvidia.com/gpu"]) >= 1
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network("127.0.0.0/8")


async def test_gpu_pod_without_toleration_is_not_placed_on_tainted_gpu_node(core, namespace):
    manifest = pod_manifest("no-toleration", {"nvidia.com/gpu": "1"}, tolerations=[])
    await core.create_namespaced_pod(namespace, manifest)
    events = await failed_scheduling(core, namespace, "no-toleration")
    assert "nvidia.com/gpu" in events[0].message
    assert (await _pod(core, namespace, "no-toleration")).status.phase == "Pending"


async def test_pod_asking_more_gpus_than_any_node_stays_pending(core, namespace):
    await core.create_namespaced_pod(namespace, pod_manifest("too-big", {"nvidia.com/gpu": "64"}))
    events = await failed_scheduling(core, namespace, "too-big")
    assert "Insufficient nvidia.com/gpu" in events[0].message
    pod = await _pod(core, namespace, "too-big")
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name


async def test_resource_quota_rejects_third_gpu_pod_and_frees_on_delete(core, namespace):
    await core.create_namespaced_resource_quota(
        namespace,
        {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}},
    )

    async def quota_tracked():
        quota = await core.read_namespaced_resource_quota("gpus", namespace)
        return (quota.status.hard or {}).get("requests.nvidia.com/gpu") == "2"

    # the quota controller must have computed status before admission counts against it
    await eventually(quota_tracked, "the quota's status to be computed")

    def create(name: str):
        return lambda: core.create_namespaced_pod(
            namespace, pod_manifest(name, {"nvidia.com/gpu": "1"})
        )

    for i in range(2):
        await created_once_quota_admits(create(f"gpu-{i}"), f"gpu-{i}")
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(namespace, pod_manifest("gpu-2", {"nvidia.com/gpu": "1"}))
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.body

    async def used(expected):
        quota = await core.read_namespaced_resource_quota("gpus", namespace)
        return quota.status.used.get("requests.nvidia.com/gpu") == expected

    await eventually(lambda: used("2"), "quota used to be 2")
    await core.delete_namespaced_pod("gpu-0", namespace, grace_period_seconds=0)
    await eventually(lambda: used("1"), "quota used to drop to 1 after the delete")

    # the status says 1 used; the plugin's own copy may still count gpu-0 for a moment
    await created_once_quota_admits(create("gpu-3"), "gpu-3", lagging="exceeded quota")


async def test_mig_pod_lands_only_on_mig_node_and_namespace_deletion_completes(core, namespace):
    for i in range(3):
        await core.create_namespaced_pod(
            namespace, pod_manifest(f"mig-{i}", {"nvidia.com/mig-1g.5gb": "1"})
        )

    async def all_running():
        pods = (await core.list_namespaced_pod(namespace)).items
        return pods if len(pods) == 3 and all(p.status.phase == "Running" for p in pods) else None

    pods = await eventually(all_running, "three MIG pods to be Running")
    for pod in pods:
        node = await core.read_node(pod.spec.node_name)
        assert node.metadata.labels["nvidia.com/mig.strategy"] == "mixed"
        assert node.status.allocatable["nvidia.com/mig-1g.5gb"] == "7"

    await core.delete_namespace(namespace)

    async def namespace_gone():
        try:
            await core.read_namespace(namespace)
        except ApiException as e:
            return e.status == 404
        return False

    await eventually(namespace_gone, "the namespace to be deleted", within=60)
    # the fixture's own delete of an already-deleted namespace must not fail the test
    await core.create_namespace({"metadata": {"name": namespace}})


async def test_time_sliced_pod_lands_on_shared_node(core, namespace):
    await core.create_namespaced_pod(
        namespace, pod_manifest("shared", {"nvidia.com/gpu.shared": "1"})
    )

    async def placed():
        pod = await _pod(core, namespace, "shared")
        return pod if pod.spec.node_name and pod.status.phase == "Running" else None

    pod = await eventually(placed, "the shared-GPU pod to be Running")
    node = await core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert node.metadata.labels["nvidia.com/gpu.replicas"] == "4"


async def test_rbac_is_enforced(local_cluster, core, namespace):
    """RBAC authorization is on: a service account with no role binding is refused."""
    from kubernetes_asyncio import client

    token = await core.create_namespaced_service_account_token(
        "default", namespace, {"spec": {"expirationSeconds": 600}}
    )
    configuration = client.Configuration()
    configuration.host = local_cluster.state.server
    configuration.ssl_ca_cert = str(local_cluster.state.path / "pki" / "ca.crt")
    configuration.api_key = {"BearerToken": token.status.token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    async with client.ApiClient(configuration) as api:
        with pytest.raises(ApiException) as refused:
            await client.CoreV1Api(api).list_node()
    assert refused.value.status == 403
