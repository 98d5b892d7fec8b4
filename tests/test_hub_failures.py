"""What a user gets when a spawn cannot go ahead, through a real hub: the failure paths.

Each case gives a one-line reason in the REST response or on the spawn page's
progress, releases the reservation (the next spawn of the same group fits), and
leaves no pod, PVC or secret behind.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from hub_helpers import HubFactory, Relay, api, progress_messages
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import eventually, pod_manifest

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
POLICY = {
    "flavors": {"a100": {"kind": "gpu", "display_name": "A100", "node_selector": A100}},
    "profiles": {
        "gpu": {
            "display_name": "One A100",
            "cpu": "100m",
            "memory": "128Mi",
            "gpu": {"flavor": "a100"},
        },
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {"lab": {"display_name": "Lab", "quota": {"gpus": 1}, "profiles": ["gpu"]}},
}
GPU = {"profile": "lab--gpu"}


#: the policy and users of these tests' hubs, unless a test says otherwise
LAB = {"policy": POLICY, "users": {"ann": ["lab"], "bob": ["lab"], "cat": ["lab"]}}


async def hub_behind_relay(hub_factory: HubFactory, **settings) -> tuple[Relay, LocalHub]:
    """A hub that reaches the API server through a relay the test can cut; its
    KubeSpawner retries an API call for 5 s, not 30."""
    return await hub_factory.behind_relay(
        **{**LAB, **settings},
        extra_config="c.KubeSpawner.k8s_api_request_retry_timeout = 5\n",
    )


async def nothing_left_for(core, namespace: str, user: str) -> None:
    """No pod, PVC or secret of ``user`` remains in ``namespace``."""
    selector = f"hub.jupyter.org/username={user}"
    for listing in (
        core.list_namespaced_pod,
        core.list_namespaced_persistent_volume_claim,
        core.list_namespaced_secret,
    ):
        assert (await listing(namespace, label_selector=selector)).items == []


async def test_a_broken_policy_stops_the_hub_at_start_up(local_cluster):
    hub = LocalHub(local_cluster, policy={"groups": {"students": {"quota": {"gpus": "ten"}}}})
    try:
        with pytest.raises(RuntimeError, match="the hub did not start") as caught:
            await asyncio.to_thread(hub.start)
    finally:
        # a hub that started after all must not outlive the test
        await asyncio.to_thread(hub.stop)
    assert "hub.config.GPUPolicy.groups.students.quota.gpus: expected a number, got 'ten'" in str(
        caught.value
    )
    assert hub.process.returncode == 1


async def test_a_resource_quota_403_is_one_line_and_releases_the_reservation(hub_factory, core):
    hub = await hub_factory(**LAB)
    quota = {
        "metadata": {"name": "no-gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
    }
    await core.create_namespaced_resource_quota(hub.namespace, quota)

    async def quota_counted():
        q = await core.read_namespaced_resource_quota("no-gpus", hub.namespace)
        return q.status and q.status.hard

    await eventually(quota_counted, "the ResourceQuota to be in force")

    # quota admission decides from the API server's cached copy of the quota, which can
    # lag behind the status read above: until it has the status, it refuses with
    # "status unknown" (and a refused spawn leaves nothing, so ann simply tries again)
    async def refused_by_the_quota():
        status, body = await api(hub, "POST", "/users/ann/server", GPU)
        return None if "status unknown for quota" in str(body) else (status, body)

    status, body = await eventually(refused_by_the_quota, "quota admission to see no-gpus")
    assert status == 403, body
    assert body["message"].startswith("Kubernetes refused the server: ")
    assert "exceeded quota: no-gpus" in body["message"]
    assert "\n" not in body["message"]
    await nothing_left_for(core, hub.namespace, "ann")
    # the reservation was released: with the namespace quota gone, the group's
    # single GPU is free for the next spawn
    await core.delete_namespaced_resource_quota("no-gpus", hub.namespace)

    # the admission plugin's copy may keep the deleted quota for a moment: a refusal
    # naming it is retried; one naming the group's GPUs (a reservation kept) fails here
    async def admitted():
        status, body = await api(hub, "POST", "/users/bob/server", GPU)
        return None if "exceeded quota: no-gpus" in str(body) else (status, body)

    status, body = await eventually(admitted, "quota admission to forget no-gpus")
    assert status in (201, 202), body


async def test_api_server_unreachable_mid_spawn_gives_a_reason_and_leaves_nothing(
    hub_factory, core
):
    relay, hub = await hub_behind_relay(hub_factory)
    # the hub has loaded its ledger and watches pods through the relay
    status, _ = await api(hub, "POST", "/users/cat/server", {"profile": "everyone--cpu"})
    assert status in (201, 202)
    await relay.cut()
    status, body = await api(hub, "POST", "/users/ann/server", GPU)
    await relay.restore()
    assert status == 503, body
    assert body["message"].startswith("the Kubernetes API server could not be reached")
    assert "nothing was started" in body["message"]

    async def no_server():
        _, model = await api(hub, "GET", "/users/ann")
        return model["servers"] == {}

    await eventually(no_server, "ann's failed server to be gone", within=60)
    await nothing_left_for(core, hub.namespace, "ann")
    # the reservation was released: the group's only GPU is free for bob
    status, body = await api(hub, "POST", "/users/bob/server", GPU)
    assert status in (201, 202), body


async def test_a_pod_pending_for_gpus_shows_a_plain_reason(hub_factory, core):
    hub = await hub_factory(
        **LAB,
        extra_config='c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}\n',
    )
    try:
        # every A100 in the cluster is taken by work the hub does not manage
        for i in range(2):
            body = pod_manifest(f"batch-{i}", {"nvidia.com/gpu": "2"}, nodeSelector=A100)
            await core.create_namespaced_pod(hub.namespace, body)
        status, body = await api(hub, "POST", "/users/ann/server", GPU)
        assert status in (201, 202), body
        messages = await asyncio.to_thread(progress_messages, hub, "ann", "Waiting for a free A100")
        reason = messages[-1]
        assert "all of them are in use" in reason
        assert "starts by itself as soon as there is room" in reason
        assert "nodes are available" not in "\n".join(messages)  # no raw scheduler dump
    finally:
        await core.delete_collection_namespaced_pod(
            hub.namespace, label_selector="!hub.jupyter.org/username", grace_period_seconds=0
        )


async def test_when_full_wait_queues_in_order_and_starts_when_a_server_stops(hub_factory):
    hub = await hub_factory(
        **{**LAB, "policy": {**POLICY, "when_full": "wait"}},
        extra_config='c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}\n',
    )
    status, body = await api(hub, "POST", "/users/ann/server", GPU)
    assert status in (201, 202), body

    async def running(user):
        _, model = await api(hub, "GET", f"/users/{user}")
        server = model["servers"].get("")
        return server and server["ready"]

    await eventually(lambda: running("ann"), "ann's server", within=120)
    status, _ = await api(hub, "POST", "/users/bob/server", GPU)
    assert status == 202  # queued, not refused
    messages = await asyncio.to_thread(progress_messages, hub, "bob", "position 1 of 1")
    assert messages[-1] == (
        "Waiting for Lab: position 1 of 1: Lab already uses 1 of its 1 GPU, and this server "
        "needs 1. The server starts by itself as soon as there is room; stop it to give up."
    )
    status, _ = await api(hub, "POST", "/users/cat/server", GPU)
    assert status == 202
    await asyncio.to_thread(progress_messages, hub, "cat", "position 2 of 2")
    # ann stops: bob, first in line, starts; cat keeps waiting, now first
    await api(hub, "DELETE", "/users/ann/server")
    await eventually(lambda: running("bob"), "bob's server after ann stopped", within=120)
    messages = await asyncio.to_thread(progress_messages, hub, "cat", "position 1 of 1")
    assert not await running("cat")


async def test_the_ledger_resyncs_with_pods_the_hub_did_not_see(hub_factory, core):
    hub = await hub_factory(**LAB, extra_config="c.GPUKubeSpawner.ledger_resync_interval = 1\n")
    try:
        # the hub has built its ledger (empty) before the other pod appears
        status, _ = await api(hub, "POST", "/users/cat/server", {"profile": "everyone--cpu"})
        assert status in (201, 202)
        # a server another hub replica started, charged to lab, unknown to this hub
        ghost = pod_manifest("ghost", {"nvidia.com/gpu": "1"}, nodeSelector=A100)
        ghost["metadata"]["labels"] = {"gpu.jupyterhub.org/group": "lab"}
        charge = {"gpus": "1", "cpu": 100, "memory": 2**27, "servers": 1, "devices": {"a100": 1}}
        ghost["metadata"]["annotations"] = {
            "gpu.jupyterhub.org/charge": json.dumps({"user": "ghost", "request": charge})
        }
        await core.create_namespaced_pod(hub.namespace, ghost)

        async def refused():
            status, body = await api(hub, "POST", "/users/ann/server", GPU)
            assert status in (403, 201, 202), body
            if status != 403:  # admitted before the resync ran: stop it and try again
                await api(hub, "DELETE", "/users/ann/server")
                await eventually(lambda: no_server("ann"), "ann's server to stop", within=60)
            return status == 403 and body["message"]

        async def no_server(user):
            _, model = await api(hub, "GET", f"/users/{user}")
            return model["servers"] == {}

        message = await eventually(refused, "the resync to count the other pod", within=30)
        assert message == (
            "Lab already uses 1 of its 1 GPU, and this server needs 1: try again when one of "
            "its servers stops"
        )
        await core.delete_namespaced_pod("ghost", hub.namespace, grace_period_seconds=0)

        async def admitted():
            status, _ = await api(hub, "POST", "/users/ann/server", GPU)
            return status in (201, 202)

        await eventually(admitted, "the resync to release the vanished pod", within=30)
    finally:
        await core.delete_collection_namespaced_pod(
            hub.namespace, label_selector="!hub.jupyter.org/username", grace_period_seconds=0
        )
