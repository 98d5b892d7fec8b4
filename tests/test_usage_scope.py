"""A billing job's token: ``custom:gpu-usage:read`` reads every group's numbers from
the GPU service's API, and nothing else, against a real hub and the local cluster.

One hub for the module: ann (alpha) and bob (beta) run GPU servers; root is a hub
admin. Three token-only services: ``billing`` (the usage scope and access to the
service, as docs/service.md sets it up), ``no-scope`` (access to the service only)
and ``scope-only`` (the usage scope without access to the service).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import secrets
from datetime import UTC, datetime

import pytest

from hub_helpers import running_hub
from jupyterhub_gpu.service.views import USAGE_READ_SCOPE
from jupyterhub_gpu_dev.localcluster.hub import ADMIN_SERVICE
from kube_helpers import eventually
from test_service_hub import aget, start_server, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {
        "small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {
        "alpha": {"display_name": "Alpha Lab", "quota": {"gpus": 4}, "profiles": ["small"]},
        "beta": {"display_name": "Beta Lab", "quota": {"gpus": 2}, "profiles": ["small"]},
    },
}
TOKENS = {name: secrets.token_hex(16) for name in ("billing", "no-scope", "scope-only")}
SCOPES = {
    "billing": [USAGE_READ_SCOPE, "access:services!service=gpu"],
    "no-scope": ["access:services!service=gpu"],
    "scope-only": [USAGE_READ_SCOPE],
}


def services_config() -> str:
    lines = [
        # the tests' admin token also issues users' own tokens
        'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
        f'"services": [{ADMIN_SERVICE!r}]}})\n'
    ]
    for name, token in TOKENS.items():
        lines.append(
            f"c.JupyterHub.services.append({{'name': {name!r}, 'api_token': {token!r}}})\n"
        )
        role = {"name": name, "services": [name], "scopes": SCOPES[name]}
        lines.append(f"c.JupyterHub.load_roles.append({role!r})\n")
    return "".join(lines)


@pytest.fixture(scope="module")
async def scope_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        users={"ann": ["alpha"], "bob": ["beta"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.usage_interval = 2\n"
            "c.GPUService.hub_poll_interval = 1\n"
            "c.KubeSpawner.http_timeout = 120\n" + services_config()
        ),
    ) as hub:
        await wait_for_service(hub)
        for user, profile in (("ann", "alpha--small"), ("bob", "beta--small")):
            await start_server(hub, user, profile)
        yield hub


async def get(hub, token: str, path: str) -> tuple[int, str]:
    status, _, body = await aget(hub.service_url + path, token)
    return status, body


def this_month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


async def both_servers_recorded(hub, token: str) -> dict:
    """The showback of this month once it names ann and bob (the service writes GPU
    time every usage_interval)."""

    async def named():
        status, body = await get(hub, token, f"api/showback?month={this_month()}")
        assert status == 200, body
        view = json.loads(body)
        users = {(u["group"], u["user"]) for u in view["users"]}
        return {("alpha", "ann"), ("beta", "bob")} <= users and view

    return await eventually(named, "showback to name ann and bob", within=60)


async def test_the_usage_scope_reads_every_groups_usage_history_and_showback(scope_hub):
    billing = TOKENS["billing"]
    root = await user_token(scope_hub, "root")
    await both_servers_recorded(scope_hub, root)

    async def both_running():
        status, body = await get(scope_hub, billing, "api/usage")
        assert status == 200, body
        view = json.loads(body)
        return {s["user"] for s in view["servers"]} >= {"ann", "bob"} and view

    usage = await eventually(both_running, "the billing token to see both servers")
    assert {g["name"] for g in usage["groups"]} == {"alpha", "beta", "everyone"}
    assert {(s["user"], s["group"]) for s in usage["servers"]} == {
        ("ann", "alpha"),
        ("bob", "beta"),
    }
    assert usage["admin"] is True

    for group in ("alpha", "beta"):
        status, body = await get(scope_hub, billing, f"api/history?group={group}&step=1m")
        assert status == 200, body
        assert json.loads(body)["group"] == group

    # the month's showback as a hub admin reads it, every user by name, JSON and CSV
    month = this_month()
    status, body = await get(scope_hub, billing, f"api/showback?month={month}")
    assert status == 200, body
    showback = json.loads(body)
    assert {(u["group"], u["user"]) for u in showback["users"]} == {
        ("alpha", "ann"),
        ("beta", "bob"),
    }
    assert {g["group"] for g in showback["groups"]} == {"alpha", "beta"}
    status, text = await get(scope_hub, billing, f"api/showback?month={month}&format=csv")
    assert status == 200, text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {(r["group"], r["user"]) for r in rows} == {("alpha", "ann"), ("beta", "bob")}
    # ann, a member, reads her own group only: the scope is what makes the difference
    status, text = await get(
        scope_hub, await user_token(scope_hub, "ann"), f"api/showback?month={month}&format=csv"
    )
    assert status == 200, text
    assert {(r["group"], r["user"]) for r in csv.DictReader(io.StringIO(text))} == {
        ("alpha", "ann")
    }


async def test_the_demo_admin_token_reads_usage_and_showback(scope_hub):
    # the token the demo prints (and the tests use) is the demo-admin service's
    view = await both_servers_recorded(scope_hub, scope_hub.api_token)
    assert {g["group"] for g in view["groups"]} == {"alpha", "beta"}
    status, body = await get(scope_hub, scope_hub.api_token, "api/usage")
    assert status == 200, body
    assert {g["name"] for g in json.loads(body)["groups"]} == {"alpha", "beta", "everyone"}


async def test_a_token_without_the_scope_reads_what_its_owner_may(scope_hub):
    token = TOKENS["no-scope"]
    status, body = await get(scope_hub, token, "api/usage")
    assert status == 200, body
    view = json.loads(body)
    # a service is in no group: everyone's totals, no server, no name
    assert [g["name"] for g in view["groups"]] == ["everyone"]
    assert view["servers"] == []
    assert view["admin"] is False
    for leaked in ("Alpha Lab", "Beta Lab", "ann", "bob"):
        assert leaked not in body
    status, body = await get(scope_hub, token, "api/history?group=alpha")
    assert status == 404, body
    status, body = await get(scope_hub, token, f"api/showback?month={this_month()}")
    assert status == 200, body
    assert json.loads(body)["users"] == []
    status, text = await get(scope_hub, token, f"api/showback?month={this_month()}&format=csv")
    assert status == 200
    assert list(csv.DictReader(io.StringIO(text))) == []
    # the scope without access to the service: HubAuth refuses it before the service
    for path in ("api/usage", "api/showback?format=csv"):
        status, body = await get(scope_hub, TOKENS["scope-only"], path)
        assert status == 403, body
        assert "alpha" not in body


async def test_the_usage_scope_gains_nothing_at_the_hub_or_elsewhere(scope_hub):
    billing = TOKENS["billing"]
    for method, path in (
        ("GET", "/users"),
        ("GET", "/users/ann"),
        ("POST", "/users/ann/server"),
        ("DELETE", "/users/bob/server"),
        ("GET", "/groups"),
    ):
        status, body = await asyncio.to_thread(scope_hub.api, method, path, None, billing)
        assert status in (403, 404), (method, path, status, body)
    for user in ("ann", "bob"):
        _, model = await asyncio.to_thread(scope_hub.api, "GET", f"/users/{user}")
        assert model["servers"][""]["ready"], f"{user}'s server was touched"
    # metrics answer the hub's own read:metrics, not the usage scope
    status, body = await get(scope_hub, billing, "metrics")
    assert status == 403, body
    # the dashboard page is a browser's: the scope does not open every group there
    status, page = await get(scope_hub, billing, "")
    assert status == 200, page
    assert "Beta Lab" not in page
    assert "Alpha Lab" not in page
