"""GPUKubeSpawner in a real hub, spawning real pods into the local cluster.

One hub per scheduler (the fixture is parametrised across them, as
traefik-proxy's tests are across backends); every GPU kind is spawned through
the hub's REST API and the created pod is checked against the same expectations
the offline tests use.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import matrix
from hub_helpers import api, pod_json, running_hub, stop_server, wait_no_pods
from jupyterhub_gpu.core.model import PolicyError, parse_policy
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]


@pytest.fixture(scope="module", params=matrix.SCHEDULERS)
async def scheduler_hub(request, local_cluster, core, priority_class_objects):
    scheduler = request.param
    async with running_hub(
        local_cluster,
        core,
        users={"ann": ["lab"]},
        policy=matrix.policy(scheduler),
        # most of these pods never start here (no KAI, Volcano, HAMi or DRA driver):
        # answer the POST at once instead of waiting 10 s for each
        extra_config='c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}\n',
    ) as hub:
        yield scheduler, hub


@pytest.mark.parametrize("kind", list(matrix.FLAVORS))
async def test_spawned_pod_has_the_shape_the_policy_implies(scheduler_hub, core, kind):
    scheduler, hub = scheduler_hub
    if kind not in matrix.kinds(scheduler):
        # fraction flavors are KAI's: with another scheduler the policy itself is refused
        with pytest.raises(PolicyError, match="fraction flavors need the KAI scheduler"):
            parse_policy(**{**matrix.policy(scheduler), "flavors": matrix.FLAVORS})
        return
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": f"lab--p-{kind}"})
    assert status in (201, 202), body

    async def created():
        pods = (await core.list_namespaced_pod(hub.namespace)).items
        return pods[0].metadata.name if pods else None

    name = await eventually(created, "the pod to be created")
    matrix.assert_pod_matches(await pod_json(core, hub.namespace, name), kind, scheduler)
    # the spawn may still be pending (the POST was answered at once): Stop again while
    # the hub answers 500, as a user would, so the next kind does not find this pod
    assert await stop_server(hub, "ann") in (202, 204)
    await wait_no_pods(core, hub.namespace)


POLICY = {
    "flavors": {
        "h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}}
    },
    "profiles": {
        "small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {
        "lab": {"quota": {"gpus": 10}, "profiles": ["small"]},
        "other": {"quota": {"gpus": 2}, "profiles": ["small"]},
    },
}


@pytest.fixture
async def gpu_hub(hub_factory):
    users = {f"u{i:03d}": ["lab"] for i in range(200)}
    users["mallory"] = ["other"]
    return await hub_factory(
        users=users,
        policy=POLICY,
        cleanup_servers=False,
        # ten notebook servers start at once on two cores: give each time to come up,
        # and the API server time to answer (KubeSpawner's default 3 s request
        # timeout makes it retry a create that did succeed, then delete its own pod)
        extra_config=(
            "c.JupyterHub.concurrent_spawn_limit = 0\n"
            "c.KubeSpawner.k8s_api_request_timeout = 30\n"
            "c.KubeSpawner.http_timeout = 240\n"
            "c.KubeSpawner.start_timeout = 300\n"
        ),
    )


async def test_forged_rest_spawn_with_another_groups_profile_creates_no_pod(gpu_hub, core):
    status, body = await api(gpu_hub, "POST", "/users/mallory/server", {"profile": "lab--small"})
    assert status == 403
    assert body["message"] == (
        "profile 'lab--small' is not offered to you: choose one the spawn form shows"
    )
    status, body = await api(
        gpu_hub, "POST", "/users/mallory/server", {"profile": "other--small", "cpu_limit": "64"}
    )
    assert status == 403
    assert "unknown option 'cpu_limit'" in body["message"]
    await asyncio.sleep(1)
    assert (await core.list_namespaced_pod(gpu_hub.namespace)).items == []
    _, model = await api(gpu_hub, "GET", "/users/mallory")
    assert model["servers"] == {}


async def test_200_concurrent_spawns_admit_exactly_the_quota(gpu_hub, core):
    users = [f"u{i:03d}" for i in range(200)]

    def spawn(user: str):
        started = time.monotonic()
        # answer times are benchmarks/spawn_storm.py's; here the ten JupyterLabs start
        # on the hub's own two cores and can hold an answer past 30 s: wait for it
        status, body = gpu_hub.api(
            "POST", f"/users/{user}/server", {"profile": "lab--small"}, timeout=120
        )
        return user, status, body, time.monotonic() - started

    with ThreadPoolExecutor(50) as pool:
        results = await asyncio.to_thread(lambda: list(pool.map(spawn, users)))
    # 403: refused at once; 201/202: started, or still being decided when the hub's
    # slow_spawn_timeout answered 202 (a loaded machine) -- judged by the end state
    unexpected = [r[1:3] for r in results if r[1] not in (201, 202, 403)]
    assert unexpected == []
    refused = [r for r in results if r[1] == 403]
    reason = (
        "lab already uses 10 of its 10 GPUs, and this server needs 1: try again when one of "
        "its servers stops"
    )
    assert all(r[2]["message"] == reason for r in refused)

    async def settled():
        """Every user either has a ready server or none; never more than 10 pods."""
        pods = (await core.list_namespaced_pod(gpu_hub.namespace)).items
        assert len(pods) <= 10, "an 11th server was created"
        _, listed = await api(gpu_hub, "GET", "/users?state=active")
        pending = [u for u in listed if any(not s["ready"] for s in u["servers"].values())]
        running = [p for p in pods if p.status.phase == "Running"]
        return (listed, running) if not pending and len(running) == len(listed) else None

    active, running = await eventually(settled, "every spawn to be decided", within=320)
    if len(active) != 10:  # show why a spawn failed before the fixture removes the log
        print(gpu_hub.log_path.read_text(errors="replace")[-20000:])
    assert len(active) == 10
    assert len(running) == 10
    assert {p.metadata.labels["gpu.jupyterhub.org/group"] for p in running} == {"lab"}


async def test_hub_restart_with_servers_running_changes_nothing(gpu_hub, core):
    for user in ("u000", "u001"):
        status, _ = await api(gpu_hub, "POST", f"/users/{user}/server", {"profile": "lab--small"})
        assert status in (201, 202)
    _, before = await api(gpu_hub, "GET", "/groups/lab")
    await asyncio.to_thread(gpu_hub.restart)
    pods = (await core.list_namespaced_pod(gpu_hub.namespace)).items
    assert len(pods) == 2  # the servers outlived the hub
    # eight more fit, the ninth does not: the ledger was rebuilt from the two pods
    for i in range(2, 10):
        status, body = await api(
            gpu_hub, "POST", f"/users/u{i:03d}/server", {"profile": "lab--small"}
        )
        assert status in (201, 202), body
    status, body = await api(gpu_hub, "POST", "/users/u010/server", {"profile": "lab--small"})
    assert status == 403
    assert body["message"] == (
        "lab already uses 10 of its 10 GPUs, and this server needs 1: try again when one of "
        "its servers stops"
    )
    assert before["name"] == "lab"
