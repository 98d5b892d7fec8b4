"""GPU time where users work: the service's per-server answer and the JupyterLab extension.

A real hub with the service, real single-user servers in the local cluster running
JupyterLab from this environment with the built extension (jupyterlab-gpu/)
installed, the simulated DCGM exporter and a real Prometheus, and Debian's
Chromium. The group ``lab`` has a budget of its own and one per user, a
max_runtime, and reclaims GPUs idle for ``AFTER`` seconds; ``course`` has a tiny
budget that stops its servers after a grace.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from hub_helpers import running_hub
from kube_helpers import eventually
from test_service_hub import aget, start_server, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

AFTER = 20
NOTICE = 25
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {"one": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "lab": {
            "display_name": "Vision Lab",
            "quota": {"gpus": 4},
            "profiles": ["one"],
            "max_runtime": "8h",
            "budget": {"gpu_hours": 100, "period": "7d"},
            "per_user": {"budget": {"gpu_hours": 10, "period": "1d"}},
            "idle": {"after": f"{AFTER}s", "gpu_utilization_below": 5},
        },
        # 0.004 GPU-hours: 14.4 GPU-seconds, used up by one server within seconds
        "course": {
            "display_name": "Short Course",
            "quota": {"gpus": 2},
            "profiles": ["one"],
            "budget": {
                "gpu_hours": 0.004,
                "period": "1h",
                "when_exhausted": "stop",
                "grace": "40s",
            },
        },
    },
}
USERS = {"ann": ["lab"], "bob": ["lab"], "ida": ["lab"], "cid": ["course"]}


@pytest.fixture(scope="module")
async def lab_hub(local_cluster, core, priority_class_objects, gpu_metrics):
    async with running_hub(
        local_cluster,
        core,
        users=USERS,
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_settings={
            "prometheus_url": gpu_metrics.prometheus.url,
            "idle_notice": NOTICE,
            "rules_interval": 1,
            "usage_interval": 2,
            "hub_poll_interval": 1,
        },
        extra_config=(
            "c.KubeSpawner.http_timeout = 120\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        # every pod busy unless a test idles it (KubeSpawner's pod names)
        for user in USERS:
            gpu_metrics.exporter.set_utilization(hub.namespace, f"jupyter-{user}", 50)
        yield hub


async def server_token(core, hub, user: str) -> str:
    """The token the hub gave the user's server (``JUPYTERHUB_API_TOKEN`` in its pod)."""
    pod = await core.read_namespaced_pod(f"jupyter-{user}", hub.namespace)
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    return env["JUPYTERHUB_API_TOKEN"]


async def status_of(hub, token: str, user: str, name: str = "") -> tuple[int, dict]:
    status, _, body = await aget(f"{hub.service_url}api/servers/{user}/{name}", token)
    return status, json.loads(body)


async def test_a_servers_token_reads_its_own_server_and_nothing_else(lab_hub, core):
    await asyncio.gather(
        start_server(lab_hub, "ann", "lab--one"), start_server(lab_hub, "bob", "lab--one")
    )
    token = await server_token(core, lab_hub, "ann")

    async def known():
        status, body = await status_of(lab_hub, token, "ann")
        return body if status == 200 and body["group"] and body["running"] else None

    mine = await eventually(known, "ann's running server in the service's answer", within=60)
    assert mine["group"] == {"name": "lab", "display_name": "Vision Lab"}
    assert (mine["flavor"]["display_name"], mine["gpus_text"]) == ("H200", "1")
    budgets = {b["owner"]: b for b in mine["budgets"]}
    assert budgets["group"]["name"] == "Vision Lab"
    assert (budgets["group"]["limit_gpu_hours"], budgets["group"]["period"]) == (100, "7d")
    assert (budgets["user"]["limit_gpu_hours"], budgets["user"]["period"]) == (10, "1d")
    assert mine["quota"]["quota_gpus"] == 4
    assert mine["quota"]["gpus_used"] == 2
    (runtime,) = [s for s in mine["stops"] if s["kind"] == "max_runtime"]
    assert 8 * 3600 - 120 < runtime["at"] - mine["now"] <= 8 * 3600
    assert mine["dashboard_url"] == "/services/gpu/"
    assert mine["rule_interval"] == 1

    # another user's server, another server of the same user: refused, naming why
    for user, name in (("bob", ""), ("ann", "other")):
        status, body = await status_of(lab_hub, token, user, name)
        assert status == 403, body
        assert "reads its own server only" in body["message"]
    # bob's own server token reads bob's, not ann's
    bobs = await server_token(core, lab_hub, "bob")
    assert (await status_of(lab_hub, bobs, "bob"))[0] == 200
    assert (await status_of(lab_hub, bobs, "ann"))[0] == 403
    # a token of ann's with access to the service alone (no access to her servers): refused
    only_service = await user_token(lab_hub, "ann")
    assert (await status_of(lab_hub, only_service, "ann"))[0] == 403
    # no token, a forged one: refused
    assert (await status_of(lab_hub, "", "ann"))[0] == 403
    assert (await status_of(lab_hub, "0" * 32, "ann"))[0] == 403
