"""GPU time where users work: the service's per-server answer and the JupyterLab extension.

A real hub with the service, real single-user servers in the local cluster running
JupyterLab from this environment with the built extension (jupyterlab-gpu/)
installed, the simulated DCGM exporter and a real Prometheus, and Debian's
Chromium. The group ``lab`` has a budget of its own and one per user, a
max_runtime, and reclaims GPUs idle for ``AFTER`` seconds; ``course`` has a tiny
budget that stops its servers after a grace; ``seminar``'s budget is mostly used by
a seeded earlier run; ``short`` stops its servers after ``SHORT_RUNTIME`` seconds,
and every server warns ``RUNTIME_WARNINGS`` seconds before that.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from hub_helpers import api, no_server, running_hub
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from kube_helpers import eventually
from test_service_hub import SCREENSHOTS, aget, login, start_server, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

AFTER = 20
NOTICE = 25
SHORT_RUNTIME = 90
#: the server extension's c.GPUStatus.runtime_warnings, short for the test (15 and 2
#: minutes by default)
RUNTIME_WARNINGS = (60, 20)
SERVER_ARGS = [f"--GPUStatus.runtime_warnings={w}" for w in RUNTIME_WARNINGS]
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
        "seminar": {
            "display_name": "Seminar",
            "quota": {"gpus": 2},
            "profiles": ["one"],
            "budget": {"gpu_hours": 1, "period": "1d"},
        },
        "short": {
            "display_name": "Short Runs",
            "quota": {"gpus": 2},
            "profiles": ["one"],
            "max_runtime": f"{SHORT_RUNTIME}s",
        },
    },
}
USERS = {
    "ann": ["lab"],
    "bob": ["lab"],
    "ida": ["lab"],
    "cid": ["course"],
    "eve": ["lab"],
    "fay": ["seminar"],
    "gus": ["short"],
    "hal": ["lab"],
}


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
            # the server extension's settings, as a site sets them in the server's config
            f"c.KubeSpawner.args = {SERVER_ARGS!r}\n"
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
    assert (budgets["group"]["limit_gpu_hours"], budgets["group"]["period"]) == (100, "7 days")
    assert (budgets["user"]["limit_gpu_hours"], budgets["user"]["period"]) == (10, "1 day")
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
        return text if "H200 \u00d71" in text and "left (you, 1 day)" in text else None

    text = await eventually(shows_gpu_and_budgets, "the status bar's GPU and budgets", within=30)
    # what is left of each budget (the lab's other servers used some), with its window
    assert re.match(
        r"GPU: Vision Lab · H200 \u00d71 · (99\.\d+|100) GPU-hours left \(group, 7 days\) · "
        r"(9\.\d+|10) GPU-hours left \(you, 1 day\) · ",
        text,
    ), text
    assert "maximum runtime in 7 hours" in text, text
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


async def test_a_stop_nobody_announced_is_explained_after_it(lab_hub, page):
    await start_server(lab_hub, "hal", "lab--one")
    await open_lab(page, lab_hub, "hal")

    async def shows_gpu():
        return "H200" in await status_text(page)

    await eventually(shows_gpu, "the status bar's GPU", within=30)
    # an admin stops it through the hub: no notice came before, so JupyterLab learns
    # why from the hub afterwards (the service recorded the stop)
    status, body = await api(lab_hub, "DELETE", "/users/hal/server")
    assert status in (202, 204), body
    dialog = await page.wait_for_selector("text=Your server was stopped", timeout=60_000)
    assert dialog is not None
    body_text = await page.inner_text(".jp-Dialog")
    assert "stopped through the hub (by you, an admin or a service)" in body_text, body_text
    assert "Server unavailable or unreachable" not in await page.inner_text("body")


# ---- the service unreachable, a budget running low, max_runtime approaching -----------


def service_process(hub) -> int:
    """The pid of this hub's GPU service: the hub's child whose command line names this
    hub's config (the hub restarts a service that dies, so tests pause it instead)."""
    config = str(hub.directory / "jupyterhub_config.py")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        words = [a.decode(errors="replace") for a in argv]
        if ppid == hub.process.pid and "jupyterhub_gpu.service" in words and config in words:
            found.append(int(entry.name))
    assert len(found) == 1, found
    return found[0]


async def test_the_service_unreachable_is_said_and_the_notebook_works_on(lab_hub, page):
    await start_server(lab_hub, "eve", "lab--one")
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": "print(sum(range(1000)))",
            }
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    status, body = await server_api(
        lab_hub, "PUT", "eve", "api/contents/work.ipynb", {"type": "notebook", "content": notebook}
    )
    assert status in (200, 201), body
    await open_lab(page, lab_hub, "eve", "lab/tree/work.ipynb")

    async def shows_the_group():
        return (await status_text(page)).startswith("GPU: Vision Lab · H200")

    await eventually(shows_the_group, "the status bar's group and GPU", within=30)
    pid = service_process(lab_hub)
    os.kill(pid, signal.SIGSTOP)
    try:

        async def unreachable():
            return await status_text(page) == "GPU: service unreachable"

        # the server extension gives up on the service after its timeout (5 s)
        await eventually(unreachable, "the status bar to say the service is unreachable", 30)
        await page.click(".jp-GPUStatus")
        details = await page.wait_for_selector(".jp-GPUStatus-details")
        text = await details.inner_text()
        assert text.startswith("The GPU service cannot be reached (the GPU service at"), text
        assert "Your notebook works on" in text, text
        await page.keyboard.press("Escape")
        # the notebook works on: a cell runs in a fresh kernel and shows its output
        await page.click(".jp-Notebook .jp-Cell .cm-content")
        await page.keyboard.press("Shift+Enter")
        output = await page.wait_for_selector(
            ".jp-OutputArea-output:has-text('499500')", timeout=60_000
        )
        assert (await output.inner_text()).strip() == "499500"
        assert await status_text(page) == "GPU: service unreachable"
    finally:
        os.kill(pid, signal.SIGCONT)
    await eventually(shows_the_group, "the status bar back once the service answers", within=30)
    await api(lab_hub, "DELETE", "/users/eve/server")


async def test_a_budget_running_low_is_a_notification_shown_once(lab_hub, page):
    # an earlier run of fay's used 0.85 of the seminar's 1 GPU-hour a day
    store = UsageStore(f"sqlite:///{lab_hub.directory / 'jupyterhub-gpu-usage.sqlite'}")
    ended = time.time() - 3600
    store.open(
        [
            UsageRecord(
                uid="earlier-fay",
                key="elsewhere/jupyter-fay",
                user="fay",
                group="seminar",
                profile="one",
                flavor="h200",
                gpus=1.0,
                started=ended - 0.85 * 3600,
                last_seen=ended,
                ended=ended,
            )
        ]
    )
    await start_server(lab_hub, "fay", "seminar--one")
    await open_lab(page, lab_hub, "fay")
    toast = await page.wait_for_selector("text=is running low", timeout=30_000)
    text = await toast.inner_text()
    assert re.fullmatch(
        r"The GPU budget of Seminar is running low: 0\.1\d* of 1 GPU-hour left in the last "
        r"day\.",
        text.strip(),
    ), text
    # once: not again at the next polls (the rule interval is 1 s), not after a reload
    await asyncio.sleep(3)
    assert await page.locator("text=is running low").count() == 1
    await page.reload()
    await page.wait_for_selector(".jp-GPUStatus")

    async def shows_the_budget():
        return "GPU-hours left (group, 1 day)" in await status_text(page)

    await eventually(shows_the_budget, "the seminar's budget in the status bar", within=30)
    await asyncio.sleep(3)
    assert await page.locator("text=is running low").count() == 0
    await api(lab_hub, "DELETE", "/users/fay/server")


async def test_max_runtime_approaching_is_told_with_the_stop_time_before_the_stop(lab_hub, page):
    await start_server(lab_hub, "gus", "short--one")
    status, reply = await server_api(lab_hub, "GET", "gus", "jupyterhub-gpu/status")
    assert status == 200, reply
    assert reply["settings"]["runtime_warnings"] == list(RUNTIME_WARNINGS)
    (stop,) = [s for s in reply["service"]["stops"] if s["kind"] == "max_runtime"]
    at = stop["at"]
    await open_lab(page, lab_hub, "gus")
    # the stop time as the user's clock shows it (the browser's time zone), to the minute
    clock = await page.evaluate(
        "at => { const d = new Date(at * 1000), two = n => String(n).padStart(2, '0');"
        " return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} `"
        " + `${two(d.getHours())}:${two(d.getMinutes())}`; }",
        at,
    )
    toasts = page.locator("text=reaches its maximum runtime")
    pattern = (
        rf"This server reaches its maximum runtime at {re.escape(clock)} \S+, "
        r"in (?:(\d+) minutes?)? ?(?:(\d+) seconds?)?, and "
        r"will be stopped\. Save your work\."
    )
    # each warning once, before the stop: the first within 60 s of it, then within 20 s
    for count, (longest, shortest) in enumerate(
        ((RUNTIME_WARNINGS[0], RUNTIME_WARNINGS[1]), (RUNTIME_WARNINGS[1], 0)), start=1
    ):
        await page.wait_for_selector(
            f"text=reaches its maximum runtime >> nth={count - 1}",
            timeout=int((at - time.time() + 10) * 1000),
        )
        assert time.time() < at
        texts = [t.strip() for t in await toasts.all_inner_texts()]
        assert len(texts) == count, texts
        matches = [re.fullmatch(pattern, t) for t in texts]
        assert all(matches), texts
        # the newest (toasts stack newest first): the one with the least time left
        left = min(int(m.group(1) or 0) * 60 + int(m.group(2) or 0) for m in matches)
        assert shortest <= left <= longest, texts
    # and the stop comes: why, instead of "Server unavailable or unreachable"
    await page.wait_for_selector("text=Your server was stopped", timeout=60_000)
    assert "maximum runtime" in await page.inner_text(".jp-GPUStatus-stopped")
