"""Free capacity per flavor from a live watch of the real cluster's nodes and pods."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from kubernetes_asyncio import client

from browser import log_in
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.kube.clusterview import ClusterView
from kube_helpers import eventually, pod_manifest

pytestmark = pytest.mark.k8s

#: reads a count from the API server
Counter = Callable[[], Awaitable[int]]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {
        "h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200},
        "h200-shared": {"kind": "timeslice", "replicas": 4, "resource": "nvidia.com/gpu.shared"},
        "mig-1g": {"kind": "mig", "profile": "1g.5gb", "strategy": "mixed"},
    },
    "profiles": {"h200": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"lab": {"quota": {"gpus": 4}, "profiles": ["h200"]}},
}


async def test_capacity_follows_pods_as_they_come_and_go(kube, core, namespace):
    policy = parse_policy(**POLICY)
    view = ClusterView(kube, logging.getLogger("test"), refresh=0).start()
    try:
        assert await view.wait_ready(30)
        # the local cluster's node pools: 3 nodes x 4 H200, 16 shared replicas, 7 x 1g.5gb
        before = view.capacity(policy)
        assert (before["h200"].allocatable, before["h200"].nodes) == (12, 3)
        assert before["h200-shared"].allocatable == 16
        assert before["mig-1g"].allocatable == 7
        busy = pod_manifest("busy", {"nvidia.com/gpu": "3"}, nodeSelector=H200)
        await core.create_namespaced_pod(namespace, busy)

        async def free_h200():
            return view.capacity(policy)["h200"].free

        await eventually(lambda: _equals(free_h200, before["h200"].free - 3), "3 H200 in use")
        await core.delete_namespaced_pod("busy", namespace, grace_period_seconds=0)
        await eventually(lambda: _equals(free_h200, before["h200"].free), "the H200s freed")
    finally:
        await view.stop()


async def _equals(probe, expected) -> bool:
    return await probe() == expected


@contextlib.asynccontextmanager
async def node_lists_counted(kube, namespace: str, account: str) -> AsyncIterator[Counter]:
    """Has the API server file ``account``'s node lists under a FlowSchema of their own,
    and yields a function that reads how many it has answered from the server's metrics
    (``apiserver_flowcontrol_dispatched_requests_total``), refused ones included."""
    flowcontrol = client.FlowcontrolApiserverV1Api(kube)
    name = f"node-lists-{namespace}"
    account_ref = {"name": account, "namespace": namespace}
    subject = {"kind": "ServiceAccount", "serviceAccount": account_ref}
    rule = {"verbs": ["list"], "apiGroups": [""], "resources": ["nodes"], "clusterScope": True}
    await flowcontrol.create_flow_schema(
        {
            "metadata": {"name": name},
            "spec": {
                "matchingPrecedence": 200,  # before the built-in service-accounts schema
                "priorityLevelConfiguration": {"name": "workload-low"},
                "rules": [{"subjects": [subject], "resourceRules": [rule]}],
            },
        }
    )
    metric = re.compile(
        rf'^apiserver_flowcontrol_dispatched_requests_total{{flow_schema="{name}",[^}}]*}} (\d+)$',
        re.MULTILINE,
    )

    async def count() -> int:
        response = await kube.call_api(
            "/metrics", "GET", _preload_content=False, auth_settings=["BearerToken"]
        )
        return sum(int(n) for n in metric.findall(await response.text()))

    try:
        yield count
    finally:
        await flowcontrol.delete_flow_schema(name)


async def test_without_rbac_capacity_is_unknown_and_warned_once(
    local_cluster, kube, core, namespace, caplog
):
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "hub"}})
    token = await core.create_namespaced_service_account_token(
        "hub", namespace, {"spec": {"expirationSeconds": 600}}
    )
    configuration = client.Configuration(host=local_cluster.state.server)
    configuration.api_key = {"BearerToken": token.status.token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.ssl_ca_cert = str(local_cluster.state.kubeconfig.parent / "ca.crt")
    async with (
        node_lists_counted(kube, namespace, "hub") as node_lists,
        client.ApiClient(configuration) as unprivileged,
    ):
        # a short retry, so that the window below holds many refused lists
        view = ClusterView(unprivileged, logging.getLogger("test.rbac"), forbidden_retry=0.2)
        view.start()
        try:
            with caplog.at_level(logging.WARNING, logger="test.rbac"):
                assert not await view.wait_ready(1)
                # the API server answered the view's node list again and again
                await eventually(lambda: _at_least(node_lists, 5), "five refused node lists")
            assert view.capacity(parse_policy(**POLICY)) is None
            assert view.problem.startswith("listing nodes: ")
            assert "forbidden" in view.problem
            assert "system:serviceaccount:" in view.problem  # the account's, not anonymous
            warnings = [r.getMessage() for r in caplog.records if r.name == "test.rbac"]
            unknown = [w for w in warnings if w.startswith("GPU capacity unknown: listing nodes")]
            assert len(unknown) == 1  # warned once, not at every retry
            assert "jupyterhub-gpu manifests" in unknown[0]
        finally:
            await view.stop()


async def _at_least(probe: Counter, expected: int) -> bool:
    return await probe() >= expected


@pytest.mark.hub
async def test_the_spawn_page_shows_free_capacity_of_each_gpu_profile(hub_factory, page):
    hub = await hub_factory(users={"ann": ["lab"]}, policy=POLICY)
    await log_in(page, hub.url, "ann", hub.password)
    text = await page.inner_text("form")
    # other tests' pods may still hold some H200s: the total is the cluster's
    assert re.search(r"cluster: \d+ of 12 GPUs free", text), text
    assert "lab: 4 of 4 GPUs free" in text
