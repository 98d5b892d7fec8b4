"""The service cut off from the API server, against a real hub and cluster: the service
reaches Kubernetes through a relay the test cuts (``Relay``), the hub keeps its own access,
so servers start and stop and pods go while the service's watch fails.

- No sighting moves a row's ``last_seen`` while the watch fails (the pods the service
  still holds may be gone); a pod deleted meanwhile ends near its real end, not when the
  service can look again; the others are seen again once the pods are listed.
- A rule that judged a pod the service still holds, whose server was started again
  meanwhile (a new pod, seconds after the old one was made), does not stop the new
  server: the service asks the hub for the server right before the stop, and the hub's
  server is another start than the one the judged pod says made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from kubernetes_asyncio.client import ApiException
from test_gpu_time_service import END_ERROR, rows

from hub_helpers import Relay, api, no_server, running_hub, server
from jupyterhub_gpu.core.shaping import SPAWN_ANNOTATION
from kube_helpers import eventually, gpu_server_pod
from test_service_hub import start_server, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
MAX_RUNTIME = 60
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "beta": {"display_name": "Beta Lab", "quota": {"gpus": 4}, "profiles": ["small"]},
        "brief": {
            "display_name": "Brief Course",
            "quota": {"gpus": 2},
            "max_runtime": f"{MAX_RUNTIME}s",
            "profiles": ["small"],
        },
    },
}
USAGE_INTERVAL = 2


@pytest.fixture(scope="module")
async def relay(local_cluster):
    relay = await Relay(local_cluster.state.ports["apiserver"]).start()
    yield relay
    await relay.ensure_serving()
    await relay.cut()


@pytest.fixture(scope="module")
async def cut_hub(local_cluster, core, priority_class_objects, relay, tmp_path_factory):
    """A hub whose service reaches the API server through ``relay``."""
    kubeconfig = relay.kubeconfig(
        local_cluster.state.kubeconfig, tmp_path_factory.mktemp("service-relay")
    )
    async with running_hub(
        local_cluster,
        core,
        users={"bob": ["beta"], "carl": ["brief"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_kubeconfig=kubeconfig,
        extra_config=(
            f"c.GPUService.usage_interval = {USAGE_INTERVAL}\n"
            "c.GPUService.rules_interval = 1\n"
            "c.GPUService.hub_poll_interval = 1\n"
            # the watch lists again within seconds of the relay's return
            "c.GPUService.max_backoff = 2\n"
            "c.GPUService.auth_cache_max_age = 3\n"
            "c.GPUKubeSpawner.ledger_resync_interval = 3\n"
            "c.Spawner.poll_interval = 5\n"
            "c.KubeSpawner.http_timeout = 120\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        yield hub


def raw_server_pod(name: str, user: str) -> dict:
    """A server pod of ``beta`` the hub did not start (as after a hub restart)."""
    return gpu_server_pod(name, user, "beta", H200)


async def tasks(hub, token: str) -> dict[str, dict]:
    view, _ = await usage(hub, token)
    return {t["name"]: t for t in view["tasks"]}


async def runs_of(hub, token: str, task: str, count: int, within: float = 30) -> dict:
    """Until the service's ``task`` has run ``count`` more times; its status then."""
    start = (await tasks(hub, token))[task]["runs"]

    async def ran():
        status = (await tasks(hub, token))[task]
        return status["runs"] >= start + count and status

    return await eventually(ran, f"{count} more runs of {task}", within=within)


async def test_no_sighting_while_the_watch_fails_and_a_pod_gone_meanwhile_ends_near_its_end(
    cut_hub, core, relay
):
    hub = cut_hub
    keys = {name: f"{hub.namespace}/{name}" for name in ("jupyter-bob-gone", "jupyter-bob-stays")}
    for name in keys:
        await core.create_namespaced_pod(hub.namespace, raw_server_pod(name, "bob"))
    try:
        await _sightings_through_an_outage(hub, core, relay, keys)
    finally:
        for name in keys:  # the hub's clean-up waits for every pod of its namespace
            with contextlib.suppress(ApiException):
                await core.delete_namespaced_pod(name, hub.namespace, grace_period_seconds=0)


async def _sightings_through_an_outage(hub, core, relay, keys: dict[str, str]) -> None:
    root = await user_token(hub, "root")
    asked = time.time()

    async def seen_since(moment: float):
        found = {r.key: r for r in await rows(hub, user="bob")}
        seen = all(k in found and found[k].last_seen >= moment for k in keys.values())
        return seen and found

    await eventually(lambda: seen_since(asked), "both pods to be seen", within=60)
    cut = time.time()
    await relay.cut()
    try:

        async def watch_failing():
            task = (await tasks(hub, root))["watch server pods"]
            return not task["ok"] and task

        await eventually(watch_failing, "the service's pod watch to fail", within=30)
        await runs_of(hub, root, "GPU time", 2)
        before = {r.key: r for r in await rows(hub, user="bob")}
        for key in keys.values():
            assert before[key].last_seen <= cut + 1, (before[key], cut)
            assert before[key].ended is None
        # one pod goes while the service cannot look
        await core.delete_namespaced_pod("jupyter-bob-gone", hub.namespace, grace_period_seconds=0)
        deleted = time.time()

        async def gone():
            names = [p.metadata.name for p in (await core.list_namespaced_pod(hub.namespace)).items]
            return "jupyter-bob-gone" not in names

        await eventually(gone, "the pod to be gone", within=30)
        passes = await runs_of(hub, root, "GPU time", 4)
        during = {r.key: r for r in await rows(hub, user="bob")}
        # no pass moved a sighting: the pod the service still holds is gone
        for key in keys.values():
            assert during[key].last_seen == before[key].last_seen, (during[key], before[key])
        assert during[keys["jupyter-bob-stays"]].ended is None
        # the hub (which still sees the pods) may have ended the gone one, never later
        ended = during[keys["jupyter-bob-gone"]].ended
        assert ended is None or ended <= deleted + 1, (ended, deleted)
        # each pass says why it saw nothing
        assert passes["consecutive_failures"] >= 4, passes
        assert "no server pod seen since" in passes["last_error"], passes
    finally:
        await relay.restore()
    restored = time.time()
    # the pods are listed again: the one still there is seen, the other stays ended
    after = await eventually(
        lambda: _resumed(hub, keys, restored), "sightings to resume", within=60
    )
    stays, went = after[keys["jupyter-bob-stays"]], after[keys["jupyter-bob-gone"]]
    assert stays.ended is None
    assert went.ended is not None
    # near its real end: never after it, and not before the service last saw it
    assert cut - END_ERROR <= went.ended <= deleted + 1, (went, cut, deleted, restored)
    assert went.last_seen <= deleted + 1, went


async def _resumed(hub, keys: dict[str, str], moment: float):
    found = {r.key: r for r in await rows(hub, user="bob")}
    stays, went = found[keys["jupyter-bob-stays"]], found[keys["jupyter-bob-gone"]]
    return stays.last_seen >= moment and went.ended is not None and found


async def test_a_stop_judged_on_a_pod_no_longer_seen_spares_the_server_started_since(
    cut_hub, core, relay
):
    """carl's server (pod A) runs; the service loses the API server; carl restarts his
    server through the hub (pod B). The service still holds pod A, so its max_runtime
    rule judges carl's server by A's start and finds it past max_runtime: the hub's
    answer right before the stop shows another start than the one that made A, and B
    is not stopped. Once the service sees the pods again, B is stopped at its own
    max_runtime."""
    hub = cut_hub
    root = await user_token(hub, "root")

    async def carls_pods():
        listed = await core.list_namespaced_pod(
            hub.namespace, label_selector="hub.jupyter.org/username=carl"
        )
        return [p for p in listed.items if not p.metadata.deletion_timestamp]

    await start_server(hub, "carl", "brief--small")
    (first,) = await carls_pods()
    # the pod says which start of carl's server made it, as the hub's API says it
    started = first.metadata.annotations[SPAWN_ANNOTATION]
    assert started == (await server(hub, "carl"))["started"]

    async def counted():
        view, _ = await usage(hub, root)
        (brief,) = [g for g in view["groups"] if g["name"] == "brief"]
        return brief["gpus"]["used"] == 1

    await eventually(counted, "the service to count carl's server", within=30)
    await relay.cut()
    try:

        async def watch_failing():
            task = (await tasks(hub, root))["watch server pods"]
            return not task["ok"] and task

        await eventually(watch_failing, "the service's pod watch to fail", within=30)
        # carl starts his server again; the hub reaches the API server itself
        status, body = await api(hub, "DELETE", "/users/carl/server")
        assert status in (202, 204), body
        await eventually(lambda: no_server(hub, "carl"), "carl's server to stop", within=60)
        await start_server(hub, "carl", "brief--small")
        (second,) = await carls_pods()
        assert second.metadata.uid != first.metadata.uid
        restarted = await server(hub, "carl")
        # A's max_runtime passes while the service still holds A as carl's server's pod
        # (on a loaded machine the restart itself may take longer: then it has passed);
        # B's own max_runtime counts from B's start, checked below
        due = first.status.start_time.timestamp() + MAX_RUNTIME
        await asyncio.sleep(max(0.0, due - time.time()))
        # the rule runs, judging A past its max_runtime each time
        await runs_of(hub, root, "runtime rules", 3)
        # B is still the server, not stopped and not stopping, if it is not yet due itself
        # (on a loaded machine the restart and three runs may outlast B's own
        # max_runtime: B may then be stopped for its own, which the end of this test
        # holds to never come before B's own due time)
        b_due = second.status.start_time.timestamp() + MAX_RUNTIME
        now = await server(hub, "carl")
        if time.time() < b_due:
            assert now is not None, "carl's new server was stopped for the old one's runtime:\n" + (
                "\n".join(line for line in hub.log_path.read_text().splitlines() if "carl" in line)
            )
            assert now["started"] == restarted["started"]
            assert now["pending"] is None
            (still,) = await carls_pods()
            assert still.metadata.uid == second.metadata.uid
        said = (
            "Not stopping carl's server (max_runtime): the hub's server started at "
            f"{restarted['started'][11:19]} UTC, the judged pod "
            f"{hub.namespace}/{first.metadata.name} was made by its start at "
            f"{started[11:19]} UTC: it was started again since"
        )
        assert said in hub.log_path.read_text(errors="replace")
    finally:
        await relay.restore()
    # seen again: B runs until its own max_runtime, and is stopped then
    await eventually(
        lambda: no_server(hub, "carl"), "B's own max_runtime stop", within=MAX_RUNTIME + 60
    )
    assert time.time() >= second.status.start_time.timestamp() + MAX_RUNTIME - 1
