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

from hub_helpers import no_server, running_hub
from kube_helpers import eventually
from test_service_hub import SCREENSHOTS, aget, login, start_server, user_token, wait_for_service

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
        # 0.01 GPU-hours: 36 GPU-seconds, used up by one server within a minute (a spawn
        # needs room for its grace)
        "course": {
            "display_name": "Short Course",
            "quota": {"gpus": 2},
            "profiles": ["one"],
            "budget": {
                "gpu_hours": 0.01,
                "period": "1h",
                "when_exhausted": "stop",
                "grace": "20s",
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


# ---- the extension in JupyterLab, in Chromium ------------------------------------------


async def server_api(hub, method: str, user: str, path: str, body=None):
    """The user's server's own REST API through the proxy, with the admin token."""
    return await asyncio.to_thread(hub.request, method, f"/user/{user}/{path}", body)


async def open_lab(page, hub, user: str, path: str = "lab") -> None:
    await login(page, hub, user)
    await page.goto(f"{hub.url}/user/{user}/{path}")
    await page.wait_for_selector(".jp-GPUStatus", timeout=60_000)


async def status_text(page) -> str:
    return await page.inner_text(".jp-GPUStatus")


async def test_status_bar_idle_notice_save_before_the_stop_and_why_it_stopped(
    lab_hub, core, page, gpu_metrics, local_cluster
):
    await start_server(lab_hub, "ida", "lab--one")
    # JupyterLab's autosave off, so only the extension saves the edit left unsaved
    status, body = await server_api(
        lab_hub,
        "PUT",
        "ida",
        "lab/api/settings/@jupyterlab/docmanager-extension:plugin",
        {"raw": json.dumps({"autosave": False})},
    )
    assert status == 204, body
    status, body = await server_api(
        lab_hub,
        "PUT",
        "ida",
        "api/contents/notes.txt",
        {"type": "file", "format": "text", "content": "first line\n"},
    )
    assert status in (200, 201), body
    await open_lab(page, lab_hub, "ida", "lab/tree/notes.txt")

    async def shows_gpu_and_budgets():
        text = await status_text(page)
        return text if "H200 \u00d71" in text and "GPU-h left (you, 1d)" in text else None

    text = await eventually(shows_gpu_and_budgets, "the status bar's GPU and budgets", within=30)
    assert text.startswith("GPU: Vision Lab · H200 \u00d71 · 100 GPU-h left (group, 7d)"), text
    assert "max runtime in 7h" in text, text
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / "jupyterlab-status-bar.png"))
    # the details panel: the group's use against its quota, and the dashboard
    await page.click(".jp-GPUStatus")
    details = await page.wait_for_selector(".jp-GPUStatus-details")
    assert "GPUs in use of a 4 GPU quota" in await details.inner_text()
    link = await details.query_selector("a")
    assert await link.get_attribute("href") == "/services/gpu/"
    await page.screenshot(path=str(SCREENSHOTS / "jupyterlab-gpu-details.png"))
    await page.keyboard.press("Escape")

    # an edit left unsaved
    await page.click(".jp-FileEditor .cm-content")
    await page.keyboard.press("Control+End")
    await page.keyboard.type("unsaved line")
    # the GPU goes idle: the notice comes as a JupyterLab notification, with the stop time
    gpu_metrics.exporter.set_utilization(lab_hub.namespace, "jupyter-ida", 0)
    await page.wait_for_selector("text=Your GPU is idle", timeout=(AFTER + 30) * 1000)
    assert "stops at" in await page.inner_text("body")
    # shortly before the stop (here at once: the notice is shorter than save_before)
    await page.wait_for_selector("text=Saved notes.txt before this server stops", timeout=30_000)
    await page.screenshot(path=str(SCREENSHOTS / "jupyterlab-idle-notice.png"))
    # after the stop: why, and what to do, instead of "Server unavailable or unreachable"
    dialog = await page.wait_for_selector(
        "text=Your server was stopped", timeout=(NOTICE + 30) * 1000
    )
    assert dialog is not None
    body_text = await page.inner_text("body")
    assert "idle" in body_text
    assert "Server unavailable or unreachable" not in body_text
    await page.screenshot(path=str(SCREENSHOTS / "jupyterlab-after-stop.png"))

    # the hub's home and spawn pages say why too, read from the usage database
    async def hub_page_says_why(path: str):
        await page.goto(f"{lab_hub.url}/hub/{path}")
        found = await page.query_selector(".jupyterhub-gpu-last-stop")
        return await found.inner_text() if found else None

    home = await eventually(lambda: hub_page_says_why("home"), "the reason on the home page")
    assert "Your server stopped at" in home, home
    assert "its GPU was idle" in home, home
    spawn = await eventually(lambda: hub_page_says_why("spawn"), "the reason on the spawn page")
    assert "its GPU was idle" in spawn, spawn

    # the edit is on disk (the user's home outlives the pod) and there after a restart
    (home,) = (local_cluster.state.path / "pods" / "homes").glob(f"{lab_hub.namespace}_ida")
    assert (home / "notes.txt").read_text().startswith("first line\nunsaved line")
    gpu_metrics.exporter.set_utilization(lab_hub.namespace, "jupyter-ida", 50)
    await eventually(lambda: no_server(lab_hub, "ida"), "ida's server gone", within=30)
    await start_server(lab_hub, "ida", "lab--one")
    status, model = await server_api(lab_hub, "GET", "ida", "api/contents/notes.txt")
    assert status == 200, model
    assert "unsaved line" in model["content"]


async def test_a_used_up_budget_is_a_notification_shown_once(lab_hub, page):
    await start_server(lab_hub, "cid", "course--one")
    await open_lab(page, lab_hub, "cid")
    # 36 GPU-seconds: used up within the first minute
    toast = await page.wait_for_selector(
        "text=The GPU budget of Short Course is used up", timeout=90_000
    )
    assert "This server stops at" in await toast.inner_text()
    # the same event is not told again: not on the next polls, not after a reload
    await page.reload()
    await page.wait_for_selector(".jp-GPUStatus")

    async def budget_stop_shown():
        return "budget stop in" in await status_text(page)

    await eventually(budget_stop_shown, "the budget stop in the status bar", within=20)
    await asyncio.sleep(3)  # several polls (the rule interval is 1 s)
    assert await page.locator("text=is used up").count() == 0
