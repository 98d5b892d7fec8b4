"""DRA for real in the local cluster: nodes of a ``dra: true`` pool publish
ResourceSlices as NVIDIA's DRA driver does, the real kube-scheduler allocates a
server's claim (rendered as the policy's dra flavor renders it) to a device on
the node the pod lands on, the claim goes with the pod, and the group
namespace's ResourceQuota makes the API server refuse a claim beyond the quota."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from jupyterhub_gpu.core.manifests import claim_template, resource_quota
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.rbac import cluster_read_rules
from jupyterhub_gpu.core.shaping import PodShape, apply_to_pod
from jupyterhub_gpu.kube.clusterview import ClusterView
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from jupyterhub_gpu_dev.localcluster.dra import DEVICE_CLASSES
from kube_helpers import eventually, failed_scheduling, pod_manifest

pytestmark = pytest.mark.k8s

#: two DRA nodes of two H200s each, one DRA node with a MIG-mode A100, and a plain
#: device-plugin node beside them
DRA_POOLS = {
    "node_pools": {
        "h200dra": {
            "count": 2,
            "cpu": 64,
            "memory": "512Gi",
            "dra": True,
            "gpu": {"product": "NVIDIA-H200-NVL", "memory": 143771, "count": 2},
        },
        "migdra": {
            "count": 1,
            "cpu": 32,
            "memory": "256Gi",
            "dra": True,
            "gpu": {
                "product": "NVIDIA-A100-SXM4-40GB",
                "memory": 40960,
                "count": 2,
                "mig": {"strategy": "mixed", "devices": {"1g.5gb": 7}},
            },
        },
        "a100": {
            "count": 1,
            "cpu": 32,
            "memory": "128Gi",
            "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "count": 2},
        },
    }
}

POLICY = parse_policy(
    flavors={
        "h200": {
            "kind": "dra",
            "device_class": "gpu.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"],
        },
    },
    profiles={"h200": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}},
    everyone={"profiles": []},
    groups={"lab": {"quota": {"gpus": 1}, "profiles": ["h200"]}},
)


@pytest.fixture(scope="module")
def dra_cluster(tmp_path_factory):
    cluster = LocalCluster.create(
        name=f"pytest-dra-{os.getpid()}",
        directory=Path(tmp_path_factory.mktemp("dra-cluster")),
        node_pools=DRA_POOLS,
    )
    yield cluster
    cluster.down()


@pytest.fixture
async def kube(dra_cluster):
    async with dra_cluster.api() as api:
        yield api


async def test_dra_nodes_publish_slices_and_classes_as_nvidias_driver(kube):
    resource = client.ResourceV1Api(kube)
    core = client.CoreV1Api(kube)
    slices = (await resource.list_resource_slice()).items
    by_node = {s.spec.node_name: s for s in slices}
    assert sorted(by_node) == ["h200dra-0", "h200dra-1", "migdra-0"]  # not the a100 node
    h200 = by_node["h200dra-0"].spec
    assert h200.driver == "gpu.nvidia.com"
    assert [d.name for d in h200.devices] == ["gpu-0", "gpu-1"]
    gpu = h200.devices[1]
    assert gpu.attributes["productName"].string == "NVIDIA H200 NVL"
    assert gpu.attributes["index"].int == 1
    assert gpu.attributes["uuid"].string.startswith("GPU-")
    assert gpu.capacity["memory"].value == "143771Mi"
    # the MIG-mode A100: one GPU as seven 1g.5gb partitions, the other whole
    mig = by_node["migdra-0"].spec.devices
    types = [d.attributes["type"].string for d in mig]
    assert types.count("mig") == 7
    assert types.count("gpu") == 1
    assert {
        d.attributes["profile"].string for d in mig if d.attributes["type"].string == "mig"
    } == {"1g.5gb"}
    # a DRA node advertises no device-plugin GPUs; the plain node still does
    dra_node = await core.read_node("h200dra-0")
    assert "nvidia.com/gpu" not in dra_node.status.allocatable
    assert dra_node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200-NVL"
    assert (await core.read_node("a100-0")).status.allocatable["nvidia.com/gpu"] == "2"
    classes = {c.metadata.name for c in (await resource.list_device_class()).items}
    assert classes >= {c["metadata"]["name"] for c in DEVICE_CLASSES}


MIG = parse_policy(
    flavors={
        "mig-1g": {
            "kind": "dra",
            "device_class": "mig.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"],
        }
    }
).flavors["mig-1g"]


async def _ready_namespace(core: client.CoreV1Api, ns: str) -> None:
    await core.create_namespace({"metadata": {"name": ns}})

    async def account():
        accounts = await core.list_namespaced_service_account(ns)
        return any(a.metadata.name == "default" for a in accounts.items)

    await eventually(account, "the namespace's default service account")


def _server_pod(name: str, count: int = 1, flavor=None) -> dict:
    flavor = flavor or POLICY.flavors["h200"]
    pod = pod_manifest(name, {"cpu": "100m"})
    return apply_to_pod(
        pod,
        PodShape(
            resource_claims=[
                {"name": "gpu", "resourceClaimTemplateName": flavor.claim_template_name(count)}
            ]
        ),
    )


async def test_kube_scheduler_allocates_the_claim_on_the_node_the_pod_lands_on(kube):
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    ns = "dra-alloc"
    await core.create_namespace({"metadata": {"name": ns}})
    flavor = POLICY.flavors["h200"]
    await resource.create_namespaced_resource_claim_template(
        ns, claim_template(flavor, 1, ns, "hub")
    )

    async def account():
        accounts = await core.list_namespaced_service_account(ns)
        return any(a.metadata.name == "default" for a in accounts.items)

    await eventually(account, "the namespace's default service account")
    await core.create_namespaced_pod(ns, _server_pod("server"))

    async def running():
        pod = await core.read_namespaced_pod("server", ns)
        return pod if pod.status.phase == "Running" else None

    pod = await eventually(running, "the DRA server pod Running", within=60)
    node = pod.spec.node_name
    assert node.startswith("h200dra-")  # not the MIG node, not the device-plugin node
    (status,) = pod.status.resource_claim_statuses
    claim = await resource.read_namespaced_resource_claim(status.resource_claim_name, ns)
    (result,) = claim.status.allocation.devices.results
    assert (result.driver, result.pool) == ("gpu.nvidia.com", node)
    assert result.device in ("gpu-0", "gpu-1")
    # the allocation is pinned to the node the pod runs on
    (term,) = claim.status.allocation.node_selector.node_selector_terms
    assert [f.values for f in term.match_fields] == [[node]]
    # kube-scheduler reserves the claim for the pod (kwok prepares nothing)
    assert [r.name for r in claim.status.reserved_for] == ["server"]

    await core.delete_namespaced_pod("server", ns, grace_period_seconds=0)

    async def claim_gone():
        claims = await resource.list_namespaced_resource_claim(ns)
        return not claims.items

    await eventually(claim_gone, "the pod's claim deleted with the pod", within=60)


async def test_past_the_last_free_device_the_pod_waits_with_the_schedulers_reason(kube):
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    ns = "dra-full"
    await _ready_namespace(core, ns)
    flavor = POLICY.flavors["h200"]
    await resource.create_namespaced_resource_claim_template(
        ns, claim_template(flavor, 2, ns, "hub")
    )
    await resource.create_namespaced_resource_claim_template(
        ns, claim_template(flavor, 1, ns, "hub")
    )
    # two servers of two H200s each take all four devices of the two DRA nodes
    for name in ("big-a", "big-b"):
        await core.create_namespaced_pod(ns, _server_pod(name, count=2))

    async def both_running():
        pods = (await core.list_namespaced_pod(ns)).items
        return sorted(p.spec.node_name for p in pods if p.status.phase == "Running")

    assert await eventually(lambda: _two(both_running), "both 2-GPU servers Running") == [
        "h200dra-0",
        "h200dra-1",
    ]
    await core.create_namespaced_pod(ns, _server_pod("late"))
    events = await failed_scheduling(core, ns, "late")
    assert "cannot allocate all claims" in events[-1].message, events[-1].message
    late = await core.read_namespaced_pod("late", ns)
    assert late.status.phase == "Pending"
    assert not late.spec.node_name
    # a device freed: the waiting pod gets it
    await core.delete_namespaced_pod("big-a", ns, grace_period_seconds=0)

    async def late_running():
        pod = await core.read_namespaced_pod("late", ns)
        return pod.status.phase == "Running"

    await eventually(late_running, "the waiting pod Running on the freed device", within=90)
    await core.delete_namespace(ns)


async def _two(probe):
    found = await probe()
    return found if len(found) == 2 else None


async def test_a_mig_partition_is_claimed_through_the_mig_device_class(kube):
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    ns = "dra-mig"
    await _ready_namespace(core, ns)
    await resource.create_namespaced_resource_claim_template(ns, claim_template(MIG, 1, ns, "hub"))
    await core.create_namespaced_pod(ns, _server_pod("mig", flavor=MIG))

    async def running():
        pod = await core.read_namespaced_pod("mig", ns)
        return pod if pod.status.phase == "Running" else None

    pod = await eventually(running, "the MIG server pod Running", within=60)
    assert pod.spec.node_name == "migdra-0"
    (status,) = pod.status.resource_claim_statuses
    claim = await resource.read_namespaced_resource_claim(status.resource_claim_name, ns)
    (result,) = claim.status.allocation.devices.results
    assert result.device.startswith("gpu-0-mig-1g5gb-")
    await core.delete_namespace(ns)


async def test_a_claim_beyond_the_groups_quota_is_refused_by_the_api_server(kube):
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    ns = "dra-quota"
    await core.create_namespace({"metadata": {"name": ns}})
    quota = resource_quota(POLICY, POLICY.group("lab"), ns, "hub")
    assert quota["spec"]["hard"]["gpu.nvidia.com.deviceclass.resource.k8s.io/devices"] == "1"
    await core.create_namespaced_resource_quota(ns, quota)

    async def counted():
        found = await core.read_namespaced_resource_quota(quota["metadata"]["name"], ns)
        return found.status is not None and found.status.hard

    await eventually(counted, "the quota controller to count the quota")
    flavor = POLICY.flavors["h200"]
    one = claim_template(flavor, 1, ns, "hub")["spec"]
    two = claim_template(flavor, 2, ns, "hub")["spec"]

    def claim(name: str, spec: dict) -> dict:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec["spec"],
        }

    with pytest.raises(ApiException) as refused:
        await resource.create_namespaced_resource_claim(ns, claim("two", two))
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.body
    await resource.create_namespaced_resource_claim(ns, claim("one", one))
    with pytest.raises(ApiException) as refused:
        await resource.create_namespaced_resource_claim(ns, claim("another", one))
    assert refused.value.status == 403
    assert "gpu.nvidia.com.deviceclass.resource.k8s.io/devices" in refused.value.body


async def test_without_rbac_for_dra_objects_only_the_dra_flavors_are_unknown(dra_cluster, kube):
    """An account that reads nodes and pods but not the DRA kinds (a hub whose RBAC
    predates them): device-plugin flavors are counted, dra flavors say why they are
    not; once the rendered RBAC is applied they are counted too."""
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    ns = "dra-rbac"
    await _ready_namespace(core, ns)
    await core.create_namespaced_service_account(ns, {"metadata": {"name": "hub"}})
    role = {
        "metadata": {"name": "dra-test-read"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]}],
    }
    await rbac.create_cluster_role(role)
    await rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "dra-test-read"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "dra-test-read",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": ns}],
        }
    )
    token = await core.create_namespaced_service_account_token(
        "hub", ns, {"spec": {"expirationSeconds": 600}}
    )
    configuration = client.Configuration(host=dra_cluster.state.server)
    configuration.api_key = {"BearerToken": token.status.token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.ssl_ca_cert = str(dra_cluster.state.kubeconfig.parent / "ca.crt")
    policy = parse_policy(
        flavors={
            "h200": {
                "kind": "dra",
                "selectors": [
                    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"
                ],
            },
            "a100": {"kind": "gpu"},
        }
    )
    try:
        async with client.ApiClient(configuration) as account:
            view = ClusterView(account, logging.getLogger("test.dra"), forbidden_retry=0.2)
            view.start()
            try:
                assert await view.wait_ready(30)  # nodes and pods: capacity is known
                capacity = view.capacity(policy)
                assert capacity["a100"].free == 2
                assert capacity["h200"].free is None
                assert "resourceslices" in capacity["h200"].note
                assert "forbidden" in capacity["h200"].note
                role["rules"] = cluster_read_rules()
                await rbac.replace_cluster_role("dra-test-read", role)

                resource = client.ResourceV1Api(kube)

                async def counted():
                    # other tests' claims may still be going: free is 4 minus what the
                    # API server's claims hold on the H200 nodes
                    claims = (await resource.list_resource_claim_for_all_namespaces()).items
                    held = [
                        r
                        for c in claims
                        if c.status and c.status.allocation
                        for r in c.status.allocation.devices.results
                        if r.pool.startswith("h200dra-")
                    ]
                    return view.capacity(policy)["h200"].free == 4 - len(held)

                await eventually(counted, "the H200 devices counted")
                assert view.capacity(policy)["h200"].allocatable == 4
            finally:
                await view.stop()
    finally:
        await rbac.delete_cluster_role_binding("dra-test-read")
        await rbac.delete_cluster_role("dra-test-read")
        await core.delete_namespace(ns)
