"""After a policy change leaves a group over its limit: reported, and stopped only if asked.

A real hub with the service, two servers in ``alpha`` (limit 2); the admin
lowers the limit to 1 and restarts the hub (servers outlive it). By default
the service only reports the group; with ``GPUService.stop_over_limit_after``
it stops the youngest server after the grace period, and leaves the other.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import eventually
from test_service_hub import aget, start_server, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "flavors": {"h200": {"kind": "gpu"}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"alpha": {"display_name": "Alpha", "quota": {"gpus": 2}, "profiles": ["small"]}},
}
CONFIG = (
    "c.GPUService.rules_interval = 1\n"
    "c.GPUService.hub_poll_interval = 1\n"
    "c.KubeSpawner.http_timeout = 120\n"
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    '"services": ["demo-admin"]})\n'
)


@pytest.fixture
async def hub(hub_factory):
    hub = await hub_factory(
        users={"ann": ["alpha"], "amy": ["alpha"]},
        admin_users=("root",),
        policy=copy.deepcopy(POLICY),
        gpu_service=True,
        cleanup_servers=False,
        extra_config=CONFIG,
    )
    await wait_for_service(hub)
    return hub


async def running(hub: LocalHub, user: str) -> bool:
    _, model = await asyncio.to_thread(hub.api, "GET", f"/users/{user}")
    return bool(model["servers"].get("", {}).get("ready"))


def rules_task(view: dict) -> dict:
    return next(t for t in view["tasks"] if t["name"] == "runtime rules")


async def rules_ran(hub: LocalHub, token: str, runs: int) -> dict | None:
    """The usage view once the runtime rules have finished ``runs`` runs without error."""
    view, _ = await usage(hub, token)
    task = rules_task(view)
    # a run is counted when it starts: the next one started, so this one is done
    return view if task["runs"] > runs and task["ok"] else None


async def restart_with(hub: LocalHub, quota: int, extra: str = "") -> str:
    hub.policy["groups"]["alpha"]["quota"]["gpus"] = quota
    hub.extra_config = CONFIG + extra
    await asyncio.to_thread(hub.restart)
    await wait_for_service(hub)
    return await user_token(hub, "root")


async def test_over_limit_is_reported_and_stopped_only_when_configured(hub):
    await start_server(hub, "ann", "alpha--small")
    await start_server(hub, "amy", "alpha--small")  # the younger one

    # the admin lowers alpha to 1 GPU: report only (the default)
    root = await restart_with(hub, 1)

    async def reported():
        view, _ = await usage(hub, root)
        return view["groups"][0]["over_limit"]

    reason = await eventually(reported, "alpha reported over its limit", within=30)
    assert reason == "Alpha uses 2 GPUs, over its limit of 1 GPU"
    view, _ = await usage(hub, root)
    assert "Over limit: Alpha uses 2 GPUs, over its limit of 1 GPU" in [
        n["text"] for n in view["notices"]
    ]
    # three more runs of the rules with alpha over its limit: nothing is stopped
    runs = rules_task(view)["runs"]
    view = await eventually(lambda: rules_ran(hub, root, runs + 3), "three more rule runs")
    assert rules_task(view)["last_result"] == "0 stopped, 1 group(s) over limit"
    assert await running(hub, "ann")
    assert await running(hub, "amy")

    # with a 2 s grace period the youngest server goes, until alpha fits
    root = await restart_with(hub, 1, "c.GPUService.stop_over_limit_after = 2\n")

    async def amy_stopped():
        return not await running(hub, "amy")

    await eventually(amy_stopped, "amy's server to be stopped", within=60, interval=1)
    assert await running(hub, "ann")
    view, _ = await usage(hub, root)
    assert any(n["text"].startswith("Stopping amy's server in Alpha") for n in view["notices"])

    async def fits():
        view, _ = await usage(hub, root)
        return view["groups"][0]["over_limit"] is None

    await eventually(fits, "alpha back within its limit", within=30)


async def test_a_server_whose_profile_a_policy_change_removed_is_told_it_runs_on(hub, core):
    await start_server(hub, "ann", "alpha--small")
    pod = await core.read_namespaced_pod("jupyter-ann", hub.namespace)
    token = {e.name: e.value for e in pod.spec.containers[0].env}["JUPYTERHUB_API_TOKEN"]

    async def answer() -> dict:
        status, _, body = await aget(f"{hub.service_url}api/servers/ann/", token)
        assert status == 200, body
        return json.loads(body)

    assert (await answer())["policy_change"] is None
    # the admin replaces alpha's profile with another: the server runs on
    hub.policy["profiles"]["large"] = {**POLICY["profiles"]["small"], "cpu": "200m"}
    hub.policy["groups"]["alpha"]["profiles"] = ["large"]
    await asyncio.to_thread(hub.restart)
    await wait_for_service(hub)

    async def told():
        return (await answer())["policy_change"]

    text = await eventually(told, "the server told of the policy change", within=30)
    assert text == (
        "The GPU policy no longer offers this server's profile (small) to Alpha: the server "
        "runs on, but next time choose another profile"
    )
    assert await running(hub, "ann")
