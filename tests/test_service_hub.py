"""jupyterhub-gpu-service running hub-managed at /services/gpu/, against a real hub.

One hub (GPUKubeSpawner + the service, configured as docs/service.md tells a
z2jh admin) for the module; real servers spawned through the REST API into the
local cluster. Users: ann (alpha), bob (beta), carl (brief, max_runtime 25s),
dave (beta), root (hub admin).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hub_helpers import running_hub
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

SCREENSHOTS = Path(os.environ.get("JUPYTERHUB_GPU_SCREENSHOTS", "/tmp/jupyterhub-gpu-screenshots"))

POLICY = {
    "flavors": {
        "h200": {
            "kind": "gpu",
            "display_name": "H200",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
        }
    },
    "profiles": {
        "small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {
        "alpha": {
            "display_name": "Alpha Lab",
            "quota": {"gpus": 4},
            "limit": {"gpus": 6},
            "profiles": ["small"],
        },
        "beta": {"display_name": "Beta Lab", "quota": {"gpus": 1}, "profiles": ["small"]},
        "brief": {
            "display_name": "Brief Course",
            "quota": {"gpus": 2},
            "max_runtime": "25s",
            "profiles": ["small"],
        },
    },
}


@pytest.fixture(scope="module")
async def service_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        users={"ann": ["alpha"], "bob": ["beta"], "carl": ["brief"], "dave": ["beta"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.rules_interval = 2\n"
            "c.GPUService.auth_cache_max_age = 3\n"
            "c.GPUService.hub_poll_interval = 1\n"
            # the hub notices a dead managed service when it polls it
            "c.Spawner.poll_interval = 5\n"
            "c.KubeSpawner.http_timeout = 120\n"
            # the test's admin token also issues users' own tokens
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        for user, profile in (("ann", "alpha--small"), ("bob", "beta--small")):
            await start_server(hub, user, profile)
        yield hub


async def start_server(hub: LocalHub, user: str, profile: str) -> None:
    status, body = await asyncio.to_thread(
        hub.api, "POST", f"/users/{user}/server", {"profile": profile}
    )
    assert status in (201, 202), body

    async def ready():
        _, model = await asyncio.to_thread(hub.api, "GET", f"/users/{user}")
        server = model["servers"].get("")
        return server and server["ready"]

    await eventually(ready, f"{user}'s server to be ready", within=180)


def fetch(url: str, token: str | None = None) -> tuple[int, dict, str]:
    """GET without following redirects: (status, lower-cased headers, body)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
    except urllib.error.HTTPError as e:
        headers = {k.lower(): v for k, v in e.headers.items()}
        return e.code, headers, e.read().decode(errors="replace")


async def aget(url: str, token: str | None = None) -> tuple[int, dict, str]:
    return await asyncio.to_thread(fetch, url, token)


async def user_token(hub: LocalHub, user: str) -> str:
    status, body = await asyncio.to_thread(
        hub.api, "POST", f"/users/{user}/tokens", {"scopes": ["access:services!service=gpu"]}
    )
    assert status == 201, body
    return body["token"]


async def wait_for_service(hub: LocalHub) -> None:
    """Until the service answers and has read pods and the hub's servers once."""
    token = await user_token(hub, "root")

    async def up():
        status, _, body = await aget(hub.service_url + "api/usage", token)
        if status != 200:
            return None
        tasks = {t["name"]: t for t in json.loads(body)["tasks"]}
        needed = ("watch server pods", "hub servers")
        return all(tasks.get(n, {}).get("ok") for n in needed)

    await eventually(up, "the service to be up", within=90, interval=0.5)


async def usage(hub: LocalHub, token: str) -> tuple[dict, str]:
    status, _, body = await aget(hub.service_url + "api/usage", token)
    assert status == 200, body
    return json.loads(body), body


async def test_anonymous_page_redirects_to_hub_login_and_api_refuses(service_hub):
    status, headers, _ = await aget(service_hub.service_url)
    assert status == 302
    assert "/hub/api/oauth2/authorize" in headers["location"]
    status, _, body = await aget(service_hub.service_url + "api/usage")
    assert status == 403
    assert "log in" in json.loads(body)["message"]
    assert "alpha" not in body


async def test_paging_arguments_that_are_not_small_whole_numbers_are_a_400(service_hub):
    token = await user_token(service_hub, "root")
    for value in ("²", "1" * 40, "-1", "", "1e3", "١٢", "1000001"):
        url = service_hub.service_url + "api/usage?servers_limit=" + urllib.parse.quote(value)
        status, _, body = await aget(url, token)
        assert status == 400, (value, status, body)
        assert "servers_limit: expected a whole number from 0 to 1000000" in body
    url = service_hub.service_url + "api/usage?servers_offset=" + urllib.parse.quote("9" * 5000)
    status, _, body = await aget(url, token)
    assert status == 400, (status, body)
    message = json.loads(body)["message"]
    assert message.startswith("servers_offset: expected a whole number from 0 to 1000000, got '99")
    assert len(message) < 200, message
    status, _, body = await aget(service_hub.service_url + "api/usage?servers_offset=0", token)
    assert status == 200, body


async def test_a_member_sees_only_their_groups_and_servers_an_admin_sees_all(service_hub):
    async def counted():
        view, _ = await usage(service_hub, await user_token(service_hub, "root"))
        groups = {g["name"]: g for g in view["groups"]}
        return view if groups["alpha"]["gpus"]["used"] == 1 else None

    admin_view = await eventually(counted, "alpha's server to be counted")
    groups = {g["name"]: g for g in admin_view["groups"]}
    assert set(groups) == {"alpha", "beta", "brief", "everyone"}
    assert groups["beta"]["gpus"]["used"] == 1
    assert groups["alpha"]["gpus"]["text"] == "1 of 6"
    assert {s["user"] for s in admin_view["servers"]} >= {"ann", "bob"}
    assert admin_view["admin"] is True

    view, raw = await usage(service_hub, await user_token(service_hub, "ann"))
    assert [g["name"] for g in view["groups"]] == ["alpha", "everyone"]
    assert [(s["user"], s["group"]) for s in view["servers"]] == [("ann", "alpha")]
    # nothing of beta: not its name, its display name, its member or its server
    for leaked in ("beta", "Beta Lab", "bob", "brief"):
        assert leaked not in raw
    assert view["tasks"] == []  # service health (namespaces, errors) is for admins
    assert view["capacity"]["known"] is True
    h200 = view["capacity"]["flavors"][0]
    assert (h200["flavor"], h200["allocatable"]) == ("h200", 12)
    assert h200["allocated"] >= 2


async def test_capacity_api_reports_free_devices(service_hub):
    token = await user_token(service_hub, "bob")
    status, _, body = await aget(service_hub.service_url + "api/capacity", token)
    assert status == 200
    capacity = json.loads(body)
    (h200,) = capacity["flavors"]
    assert h200["free"] == h200["allocatable"] - h200["allocated"]
    assert h200["nodes"] == 3


async def test_metrics_need_read_metrics_and_expose_the_numbers(service_hub):
    status, _, body = await aget(service_hub.service_url + "metrics")
    assert status == 403
    # a user's token without read:metrics is not enough either
    status, _, _ = await aget(
        service_hub.service_url + "metrics", await user_token(service_hub, "ann")
    )
    assert status == 403
    # the hub's demo-admin service token has read:metrics (as a Prometheus service would)
    status, _, body = await aget(service_hub.service_url + "metrics", service_hub.api_token)
    assert status == 200, body
    lines = set(body.splitlines())
    assert 'jupyterhub_gpu_group_gpus_allocated{group="alpha"} 1.0' in lines
    assert 'jupyterhub_gpu_group_gpus_quota{group="alpha"} 4.0' in lines
    assert 'jupyterhub_gpu_group_gpus_limit{group="alpha"} 6.0' in lines
    assert 'jupyterhub_gpu_group_flavor_allocated{flavor="h200",group="beta"} 1.0' in lines
    assert 'jupyterhub_gpu_flavor_capacity_allocatable{flavor="h200"} 12.0' in lines
    assert 'jupyterhub_gpu_group_waiting{group="beta"} 0.0' in lines


async def test_server_past_max_runtime_is_stopped_others_untouched(service_hub, core):
    await start_server(service_hub, "carl", "brief--small")

    async def carl_stopped():
        _, model = await asyncio.to_thread(service_hub.api, "GET", "/users/carl")
        return model["servers"] == {}

    # 25 s max_runtime, rules every 2 s, plus the stop itself
    await eventually(carl_stopped, "carl's server to be stopped", within=90, interval=1)
    for user in ("ann", "bob"):
        _, model = await asyncio.to_thread(service_hub.api, "GET", f"/users/{user}")
        assert model["servers"][""]["ready"], f"{user}'s server was touched"
    root = await user_token(service_hub, "root")

    async def announced():
        view, _ = await usage(service_hub, root)
        return [n["text"] for n in view["notices"] if n["user"] == "carl"]

    (notice,) = await eventually(announced, "the notice about carl's server")
    assert notice == (
        "Stopping carl's server in Brief Course: it has run for 25 seconds, the longest Brief "
        "Course allows; start a new server to go on"
    ), notice
    # ann sees no notice about carl
    _, raw = await usage(service_hub, await user_token(service_hub, "ann"))
    assert "carl" not in raw
    log = service_hub.log_path.read_text(errors="replace")
    assert "Stopping carl's server in Brief Course" in log


def service_pids(hub: LocalHub) -> list[int]:
    """The service process(es) this hub started (matched by its own config path)."""
    marker = str(hub.directory / "jupyterhub_config.py")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in cmdline]
        if "jupyterhub_gpu.service" in args and marker in args:
            pids.append(int(entry.name))
    return pids


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_service_down_keeps_quota_enforced_and_restart_catches_up(service_hub):
    root = await user_token(service_hub, "root")

    async def settled():
        # the service polls the hub every second: wait until it no longer lists a
        # server an earlier test stopped
        view, _ = await usage(service_hub, root)
        return {s["user"] for s in view["servers"]} == {"ann", "bob"} and view

    before = await eventually(settled, "the service's server list to settle")
    (pid,) = service_pids(service_hub)
    os.kill(pid, signal.SIGKILL)

    async def down():
        return not port_open(service_hub.service_port)

    await eventually(down, "the service to be down")
    # beta is full (1 of 1): the hub's spawner still refuses dave, service or not
    status, body = await asyncio.to_thread(
        service_hub.api, "POST", "/users/dave/server", {"profile": "beta--small"}
    )
    assert not port_open(service_hub.service_port), "the hub restarted the service too soon"
    assert status == 403
    assert body["message"] == (
        "Beta Lab already uses 1 of its 1 GPU, and this server needs 1: try again when one "
        "of its servers stops"
    )

    # the hub restarts its managed service; it rebuilds everything from Kubernetes + the hub
    await wait_for_service(service_hub)
    assert service_pids(service_hub) != [pid]
    after, _ = await usage(service_hub, root)
    assert after["groups"] == before["groups"]
    assert {(s["user"], s["group"]) for s in after["servers"]} == {
        (s["user"], s["group"]) for s in before["servers"]
    }


async def login(page, hub: LocalHub, user: str) -> None:
    await page.goto(f"{hub.url}/hub/login")
    await page.fill("input[name=username]", user)
    await page.fill("input[name=password]", hub.password)
    await page.click("input[type=submit], button[type=submit]")
    await page.wait_for_url(lambda url: "/hub/login" not in url)


async def test_dashboard_in_chromium_shows_the_bars(service_hub, page):
    await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
    await login(page, service_hub, "ann")
    await page.goto(service_hub.service_url)  # through the hub's OAuth and back
    await page.wait_for_selector(".card[data-group=alpha] .bar")
    text = await page.inner_text("body")
    shot = SCREENSHOTS / "dashboard-ann.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert "Signed in as ann" in text
    assert "Alpha Lab" in text
    assert "1 of 6 GPUs" in text
    assert "Beta" not in text
    assert "bob" not in text
    assert "2 of 12 GPUs in use" in text  # cluster capacity: ann's and bob's servers
    # the bar is drawn: alpha uses 1 of 6, a sixth of the width
    width = await page.eval_on_selector(
        ".card[data-group=alpha] .fill", "e => e.getBoundingClientRect().width"
    )
    total = await page.eval_on_selector(
        ".card[data-group=alpha] .bar", "e => e.getBoundingClientRect().width"
    )
    assert abs(width / total - 1 / 6) < 0.02


async def test_admin_dashboard_shows_every_group_and_service_health(service_hub, browser):
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await login(page, service_hub, "root")
        await page.goto(service_hub.service_url)
        await page.wait_for_selector(".card[data-group=beta]")
        await page.screenshot(path=str(SCREENSHOTS / "dashboard-admin.png"), full_page=True)
        text = await page.inner_text("body")
        for expected in ("Alpha Lab", "Beta Lab", "Brief Course", "1 of 1 GPUs", "Service health"):
            assert expected in text
    finally:
        await context.close()


async def test_the_service_keeps_the_policys_objects_in_the_cluster(service_hub, kube):
    """The reconcile task ran: the PriorityClasses carry this hub's ownership labels."""
    from kubernetes_asyncio import client

    scheduling = client.SchedulingV1Api(kube)

    async def owned():
        pc = await scheduling.read_priority_class("jupyterhub-gpu-in-quota")
        labels = pc.metadata.labels or {}
        return labels.get("gpu.jupyterhub.org/hub-namespace") == service_hub.namespace

    await eventually(owned, "the service's reconcile pass", within=60)
    token = await user_token(service_hub, "root")
    status, _, body = await aget(service_hub.service_url, token)
    assert status == 200
    assert "reconcile" in body


async def test_a_user_removed_from_a_group_stops_seeing_it_within_the_cache_age(service_hub):
    from jupyterhub_gpu.service.app import GPUService

    assert GPUService().auth_cache_max_age == 30  # the default; this hub sets 3 s
    token = await user_token(service_hub, "dave")
    view, _ = await usage(service_hub, token)
    assert [g["name"] for g in view["groups"]] == ["beta", "everyone"]
    status, body = await asyncio.to_thread(
        service_hub.api, "DELETE", "/groups/beta/users", {"users": ["dave"]}
    )
    assert status == 200, body
    try:

        async def beta_gone():
            view, _ = await usage(service_hub, token)
            return "beta" not in [g["name"] for g in view["groups"]] or None

        await eventually(beta_gone, "dave's view without beta", within=15, interval=0.5)
    finally:
        await asyncio.to_thread(service_hub.api, "POST", "/groups/beta/users", {"users": ["dave"]})
