"""`jupyterhub-gpu demo` as a newcomer runs it: start it, open the URL, log in as
each demo user in headless Chromium, spawn, hit the quota, press Ctrl-C.

The demo runs as a subprocess exactly as the README's command starts it; the
only things the test takes from it are what it prints (the URL, the kubeconfig
and hub log paths) and what a user could see in /proc (its processes and their
listening sockets).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.async_api import TimeoutError as PlaywrightTimeout

from browser import log_in
from demo_helpers import Demo, api, cmdline, processes_under, still_running
from hub_helpers import logged_in_opener
from jupyterhub_gpu_dev.demo import DEMO_VALUES, plan_demo
from jupyterhub_gpu_dev.localcluster import sockets
from jupyterhub_gpu_dev.localcluster.cluster import DEFAULT_NODE_POOLS, free_port
from jupyterhub_gpu_dev.localcluster.kubeconfig import load_configuration
from jupyterhub_gpu_dev.localcluster.nodepools import read_node_pools, render_nodes
from kube_helpers import eventually

PASSWORD = "jupyterhub-gpu"
SCREENSHOTS = Path(os.environ.get("JUPYTERHUB_GPU_SCREENSHOTS", "/tmp/jupyterhub-gpu-screenshots"))
#: a loaded two-core machine: JupyterLab's first start and page load can be slow
SPAWN_TIMEOUT_MS = 240_000
PAGE_TIMEOUT_MS = 60_000
REFUSAL = (
    "Students already uses 0.25 of its 0.25 GPUs, and this server needs 0.25: try again "
    "when one of its servers stops"
)
#: the built-in demo's users and their groups
DEMO_USERS = plan_demo().users


@pytest.fixture(scope="module")
def demo(built):
    running = Demo(free_port())
    try:
        yield running.wait_until_up()
    finally:
        running.make_sure_it_is_gone()


@pytest.mark.k8s
@pytest.mark.hub
def test_progress_then_the_url_and_the_logins(demo):
    banner_at = next(i for i, line in enumerate(demo.lines) if "is running at" in line)
    before, after = "\n".join(demo.lines[:banner_at]), "\n".join(demo.lines[banner_at:])
    # progress while it starts: the cluster, its objects, the hub
    nodes = len(render_nodes(read_node_pools(DEFAULT_NODE_POOLS)))  # the built-in example's
    for step in (
        "starting etcd",
        f"registering {nodes} simulated nodes",
        "PriorityClass",
        "JupyterHub",
    ):
        assert step in before, before
    assert f"password for all: {PASSWORD}" in after
    for user in DEMO_USERS:
        assert re.search(rf"^\s+{user}\s", after, re.MULTILINE), after
    assert "Press Ctrl-C to stop everything." in after
    assert f"usage dashboard: {demo.url}/services/gpu/" in after


@pytest.mark.k8s
@pytest.mark.hub
def test_the_printed_admin_token_reads_every_groups_usage_and_showback(demo):
    token = printed(demo, r"^\s+export JUPYTERHUB_API_TOKEN=(\w+)$")
    command = printed(demo, r"^\s+(curl -H .*api/showback\?format=csv')$")
    url = command.rsplit(" ", 1)[1].strip("'")
    assert url == f"{demo.url}/services/gpu/api/showback?format=csv", command

    def get(url: str) -> tuple[int, str]:
        request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    status, text = get(url)
    assert status == 200, text
    assert text.startswith("month,group,user,flavor,gpu_hours"), text
    status, body = get(f"{demo.url}/services/gpu/api/usage")
    assert status == 200, body
    view = json.loads(body)
    assert {g["name"] for g in view["groups"]} == {g.name for g in plan_demo().policy.all_groups}, (
        view["groups"]
    )
    # the same token is the hub REST API's admin token it is printed as
    status, body = get(f"{demo.url}/hub/api/users")
    assert status == 200, body


# ---- GPU time: budgets, the usage database, Prometheus and the DCGM exporter -------


def fetch(url: str, method: str = "GET", body: dict | None = None):
    """(status, parsed JSON body or None) of an HTTP request to the demo's addresses."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode() if body is not None else None, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def printed(demo: Demo, pattern: str) -> str:
    return demo.wait_for(pattern, timeout=5).group(1)


@pytest.mark.k8s
@pytest.mark.hub
async def test_the_banner_names_prometheus_and_the_exporter_and_prometheus_scrapes_it(demo):
    prometheus = printed(demo, r"^\s+prometheus: (http://127\.0\.0\.1:\d+) ")
    exporter = printed(demo, r"^\s+dcgm-exporter: (http://127\.0\.0\.1:\d+)/metrics")
    assert "starting Prometheus" in demo.output  # progress while it starts
    # the walkthrough's GPU time steps (wrapped): the budget line, the refusal, the dashboard
    words = " ".join(demo.output.split())
    assert '"Students: 0.025 of 0.025 GPU-hours left in the last hour"' in words
    assert "refused with the numbers" in words
    assert "showback table" in words
    # JupyterLab's GPU time: the extension is installed (scripts/test, or the demo itself)
    assert 'GPU time in JupyterLab: as students-1, start "' in words
    assert "Leave an edit unsaved" in words

    async def scraped():
        status, body = await asyncio.to_thread(fetch, f"{prometheus}/api/v1/targets")
        assert status == 200, body
        targets = body["data"]["activeTargets"]
        return [t for t in targets if t["scrapeUrl"] == f"{exporter}/metrics"] and all(
            t["health"] == "up" for t in targets
        )

    await eventually(scraped, "Prometheus to scrape the exporter", within=30)

    # the walkthrough's command makes a server's GPU busy, as the exporter reports it
    command = printed(demo, r"^\s+(curl -X PUT http://127\.0\.0\.1:\S+ -d .*)$")
    url = command.split()[3]
    assert url == f"{exporter}/utilization/default/jupyter-research-1", command
    body = json.loads(command.split(" -d ", 1)[1].strip("'"))
    assert fetch(url, "PUT", body)[0] == 204
    assert fetch(f"{exporter}/utilization") == (200, {"default/jupyter-research-1": 80.0})
    assert fetch(url, "PUT", {"percent": None})[0] == 204


@pytest.mark.k8s
@pytest.mark.hub
async def test_the_service_shows_the_course_groups_gpu_hours_and_budget(demo):
    """GPU time is recorded in the demo's state folder, and the service reads it back."""
    # the hub admin, logged in; the dashboard's OAuth login gives the service's cookie
    session = await asyncio.to_thread(logged_in_opener, demo.url, "admin", PASSWORD)
    await asyncio.to_thread(session.open, f"{demo.url}/services/gpu/", timeout=60)

    async def students_hours():
        response = await asyncio.to_thread(
            session.open, f"{demo.url}/services/gpu/api/usage", timeout=30
        )
        view = json.loads(response.read())
        return view["gpu_hours"]["groups"].get("students")

    hours = await eventually(students_hours, "the service's GPU time", within=60)
    assert (demo.cluster_dir / "jupyterhub-gpu-usage.sqlite").is_file()
    assert hours["budget"] == 0.025
    assert hours["period_seconds"] == 3600
    assert hours["used"] >= 0


@pytest.mark.k8s
@pytest.mark.hub
async def test_the_demo_bills_its_priced_flavors_and_prints_the_admins_invoice(browser, demo):
    """The demo's flavors are priced (an H200 above an A100 and its MIG slices) and its
    groups name accounts: the admin's showback bills each row at its flavor's rate, the
    dashboard gives each group's account, billed units and cost, and the invoice prints
    one page per account."""
    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.core.usage import UsageRecord

    policy = plan_demo().policy
    rates = {name: f.billing[-1] for name, f in policy.flavors.items()}
    assert rates["h200"].price > rates["a100"].price > rates["mig-1g5"].price
    assert rates["h200"].weight > rates["a100"].weight > rates["mig-1g5"].weight
    words = " ".join(demo.output.split())
    assert "Chargeback: an hour of one GPU-equivalent is billed NVIDIA H200 NVL 2.5" in words
    # an hour on an A100 this month, written as the hub would have, of a research member
    # no other test logs in as: research-2's own hour would use up its per-user budget
    # and outweigh its standing in the line the A100 test shows
    now = time.time()
    month_start = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0).timestamp()
    started = max(month_start, now - 3600)
    store = UsageStore(f"sqlite:///{demo.cluster_dir / 'jupyterhub-gpu-usage.sqlite'}")
    record = UsageRecord(
        "demo-billing-test", "demo-billing/jupyter-research-9", "research-9", "research",
        "research", "a100", 1.0, started, now - 60, now - 60,
    )  # fmt: skip
    await asyncio.to_thread(store.open, [record])
    store.dispose()
    token = printed(demo, r"^\s+export JUPYTERHUB_API_TOKEN=(\w+)$")

    async def billed_rows():
        request = urllib.request.Request(
            f"{demo.url}/services/gpu/api/showback?format=csv",
            headers={"Authorization": f"token {token}"},
        )
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=30).read())
        rows = list(csv.DictReader(io.StringIO(text.decode())))
        mine = [r for r in rows if (r["user"], r["flavor"]) == ("research-9", "a100")]
        return mine and rows

    rows = await eventually(billed_rows, "research-9's A100 hour in the showback", within=60)
    for row in rows:  # every row at its flavor's rate (one rate each, in the demo)
        rate, hours = rates[row["flavor"]], float(row["gpu_hours"])
        assert float(row["billed_units"]) == pytest.approx(hours * rate.weight, abs=2e-4), row
        assert float(row["cost"]) == pytest.approx(hours * rate.price, abs=0.01), row
        assert row["currency"] == "EUR"
        assert row["account"] == (policy.account_of(row["group"]) or "")
    async with logged_in(browser, demo, "admin") as page:
        await page.goto(f"{demo.url}/services/gpu/")
        research = page.locator("table.showback tr", has_text="CC-4410")
        await research.wait_for(timeout=PAGE_TIMEOUT_MS)
        cells = (await research.inner_text()).split()
        assert cells[0] == "research"
        assert cells[-1] == "EUR"
        await page.click("a[href^='invoice?']")
        section = page.locator("section[data-account=CC-4410]")
        await section.wait_for(timeout=PAGE_TIMEOUT_MS)
        assert "Account CC-4410" in await section.inner_text()
        assert "NVIDIA A100 40GB" in await section.inner_text()
        total = (await section.locator("tr.total").inner_text()).split()
        assert (total[0], total[-1]) == ("Total", "EUR")
        await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
        await page.screenshot(path=str(SCREENSHOTS / "demo-invoice.png"), full_page=True)


@asynccontextmanager
async def logged_in(browser, demo: Demo, user: str):
    """A fresh browser context logged in as ``user`` through the hub's login page."""
    context = await browser.new_context()
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = await context.new_page()
    try:
        await log_in(page, demo.url, user, PASSWORD)
        yield page
    finally:
        await context.close()


async def offered(page) -> tuple[list[str], str]:
    """The profile slugs on the spawn form, in order, and the form's visible text."""
    slugs = await page.eval_on_selector_all(
        "#spawn_form input[name=profile]", "inputs => inputs.map(i => i.value)"
    )
    return slugs, await page.inner_text("#spawn_form")


GROUP_NAMES = {"research": "Research", "students": "Students", "test": "Test (admins)"}
RESEARCH = ["research--research", "research--research-dra", "research--cpu", "everyone--cpu"]
TEST = ["test--research", "test--research-dra", "test--student", "test--cpu", "everyone--cpu"]
EXPECTED = {
    "research-1": RESEARCH,
    "research-2": RESEARCH,
    # one GPU profile, the students'; plus the CPU profile everyone gets
    "students-1": ["students--student", "everyone--cpu"],
    "students-2": ["students--student", "everyone--cpu"],
    "test-1": TEST,
    "test-2": TEST,
    # the hub admin, in the policy's admin group
    "admin": TEST,
    "nogroup": ["everyone--cpu"],
}


def test_every_demo_user_has_expected_profiles():
    # the table below is the demo's own user list: a user added there needs a row here
    assert set(EXPECTED) == set(DEMO_USERS)


def test_the_demo_policy_passes_check():
    result = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.cli", "check", str(DEMO_VALUES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # the local cluster runs plain kube-scheduler: a KAI policy could not place pods there
    assert "scheduler default" in result.stdout
    # every quota and limit is reachable (no CPU or memory quota keeps GPUs out of reach);
    # the one warning left is the idle rule's Prometheus, which the demo starts itself
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert [w for w in warnings if "GPUService.prometheus_url is not set" not in w] == []


def test_a_port_in_use_is_a_clear_error_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "jupyterhub_gpu.cli", "demo", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert "pass another with --port" in result.stderr
    assert "Traceback" not in result.stderr
    assert "starting etcd" not in result.stderr  # refused before the cluster starts


@pytest.mark.k8s
@pytest.mark.hub
@pytest.mark.parametrize("user", list(EXPECTED))
async def test_each_user_sees_their_groups_profiles_and_nothing_else(browser, demo, user):
    async with logged_in(browser, demo, user) as page:
        slugs, text = await offered(page)
        gpu_choices = await page.eval_on_selector_all(
            "select[name='profile-option-research--research--gpus'] option",
            "options => options.map(o => o.value)",
        )
    assert slugs == EXPECTED[user]
    own = DEMO_USERS[user]
    # labelled by group ("<group>: <profile>"); no other group's name leaks
    for group, name in GROUP_NAMES.items():
        if group in own:
            assert f"{name}: " in text
        else:
            assert f"{name}:" not in text, f"{user} sees {name}'s profiles:\n{text}"
    assert "Everyone: CPU only" in text
    if user.startswith("research-"):
        assert "Research: Research" in text
        # the burst limit, live, as far as the member's own cap lets them use it
        assert (
            "Research: 4 of 24 GPUs usable now, as your own GPU limit in Research leaves 4 GPUs"
            in text
        )
        assert "cluster: 12 of 12 GPUs free" in text  # the local H200 nodes
        assert gpu_choices == ["1", "2", "4"]
    else:
        assert gpu_choices == []
    if user.startswith("students-"):
        assert "Students: Student GPU" in text
        assert "1 x H200 (time-sliced, 1/4)" in text
        # nobody has started a server yet: the group's quota and the time-sliced node
        assert "Students: 0.25 of 0.25 GPUs free" in text
        assert "cluster: 16 of 16 shared GPUs free" in text


async def shown_after_reloads(page, text: str, within: float = 60) -> None:
    """The spawn form shows ``text``, at once or after reloads (capacity is watched)."""
    deadline = time.monotonic() + within
    while text not in (form := await page.inner_text("#spawn_form")):
        assert time.monotonic() < deadline, f"{text!r} not shown in {within}s:\n{form}"
        await asyncio.sleep(1)
        await page.reload()


async def what_went_wrong(page, demo: Demo) -> str:
    """The page, the pods and the hub's log, for a spawn that did not get there."""
    from kubernetes_asyncio import client

    async with client.ApiClient(await load_configuration(demo.kubeconfig)) as api:
        pods = await client.CoreV1Api(api).list_namespaced_pod("default")
    log = (demo.hub_dir / "jupyterhub.log").read_text(errors="replace")[-6000:]
    return (
        f"the page is {page.url}:\n{await page.inner_text('body')}\n\n"
        f"pods: {[(p.metadata.name, p.status.phase, p.status.pod_ip) for p in pods.items]}\n\n"
        f"the hub log ends:\n{log}"
    )


async def user_pods(demo: Demo) -> list[str]:
    from kubernetes_asyncio import client

    async with client.ApiClient(await load_configuration(demo.kubeconfig)) as api:
        pods = await client.CoreV1Api(api).list_namespaced_pod("default")
    return sorted(p.metadata.name for p in pods.items)


@pytest.mark.k8s
@pytest.mark.hub
async def test_student_reaches_jupyterlab_and_the_second_student_is_refused(browser, demo):
    async with logged_in(browser, demo, "students-1") as page:
        await page.check("#profile-item-students--student")
        await page.click("#spawn_form button[type=submit]")
        # through spawn-pending to the single-user server, behind the hub's proxy
        try:
            await page.wait_for_url(f"{demo.url}/user/students-1/lab**", timeout=SPAWN_TIMEOUT_MS)
            await page.wait_for_selector("#jp-main-dock-panel", timeout=SPAWN_TIMEOUT_MS)
        except PlaywrightTimeout:
            raise AssertionError(await what_went_wrong(page, demo)) from None
        assert "JupyterLab" in await page.title()
    assert await user_pods(demo) == ["jupyter-students-1"]
    # the server is a real process the demo's cluster started: jupyterhub-singleuser
    commands = [cmdline(pid) for pid in processes_under(demo.process.pid)]
    assert any("jupyterhub-singleuser" in c for c in commands), commands

    async with logged_in(browser, demo, "students-2") as page:
        # live: students-1's server holds the quota and one of the 16 replicas
        await shown_after_reloads(page, "Students: 0 of 0.25 GPUs free")
        await shown_after_reloads(page, "cluster: 15 of 16 shared GPUs free")
        await page.check("#profile-item-students--student")
        await page.click("#spawn_form button[type=submit]")
        # the spawn page shows the one-line refusal (or spawn-pending does, when slow)
        await page.get_by_text(REFUSAL).wait_for(timeout=SPAWN_TIMEOUT_MS)
        assert "/user/students-2" not in page.url
        # coming back later, the pending page still says why the last attempt failed
        await page.goto(f"{demo.url}/hub/spawn-pending/students-2")
        await page.get_by_text(REFUSAL).wait_for()
    assert await user_pods(demo) == ["jupyter-students-1"]  # no pod was created
    # the usage dashboard shows students-2 their group's use, and nothing of research
    async with logged_in(browser, demo, "students-2") as page:
        await page.goto(f"{demo.url}/services/gpu/")
        await page.wait_for_selector(".card[data-group=students]")
        text = await page.inner_text("body")
        assert "Students" in text
        assert "research" not in text.lower()


async def server_state(demo: Demo, token: str, user: str, name: str = "") -> str:
    """``running``, ``waiting`` (a spawn still pending) or ``none``, as the hub says."""
    status, model = await asyncio.to_thread(api, demo, token, "GET", f"/users/{user}")
    assert status == 200, model
    server = model["servers"].get(name)
    if server is None:
        return "none"
    return "running" if server["ready"] else "waiting" if server["pending"] == "spawn" else "?"


async def becomes(demo: Demo, token: str, user: str, state: str, name: str = "") -> None:
    async def there():
        return await server_state(demo, token, user, name) == state

    await eventually(
        there, f"{user}'s server {name!r} to be {state}", within=SPAWN_TIMEOUT_MS / 1000
    )


@pytest.mark.k8s
@pytest.mark.hub
async def test_research_members_wait_for_the_a100_and_who_used_less_goes_first(browser, demo):
    """The walkthrough's line: research-1 (2 GPU-hours yesterday) holds research's one
    A100 and asks for it again; research-2 (0.25) asks after, and starts first."""
    words = " ".join(demo.output.split())
    assert "The line: Research may hold one NVIDIA A100 40GB at a time" in words
    token = printed(demo, r"^\s+export JUPYTERHUB_API_TOKEN=(\w+)$")
    a100 = {"profile": "research--research", "flavor": "a100"}
    second = None
    try:
        status, body = await asyncio.to_thread(
            api, demo, token, "POST", "/users/research-1/server", a100
        )
        assert status in (201, 202), body
        await becomes(demo, token, "research-1", "running")
        # a named server asks for the A100 again: it waits, first in line
        second = asyncio.create_task(
            asyncio.to_thread(api, demo, token, "POST", "/users/research-1/servers/second", a100)
        )
        await becomes(demo, token, "research-1", "waiting", "second")
        async with logged_in(browser, demo, "research-2") as page:
            assert "Research fair share: you used" in await page.inner_text("#spawn_form")
            await page.check("#profile-item-research--research")
            await page.select_option(
                "select[name='profile-option-research--research--flavor']", "a100"
            )
            await page.click("#spawn_form button[type=submit]")
            # asked second, first in line: the spawn page says so and why
            await page.locator(
                "#progress-message",
                has_text="position 1 of 2: you used less GPU time recently than others waiting",
            ).wait_for(timeout=SPAWN_TIMEOUT_MS)
            status, body = await asyncio.to_thread(
                api, demo, token, "DELETE", "/users/research-1/server"
            )
            assert status in (202, 204), body
            try:
                await page.wait_for_url(
                    f"{demo.url}/user/research-2/lab**", timeout=SPAWN_TIMEOUT_MS
                )
            except PlaywrightTimeout:
                raise AssertionError(await what_went_wrong(page, demo)) from None
        assert await server_state(demo, token, "research-1", "second") == "waiting"
        status, body = await asyncio.to_thread(
            api, demo, token, "DELETE", "/users/research-2/server"
        )
        assert status in (202, 204), body
        await becomes(demo, token, "research-1", "running", "second")  # its turn now
        status, body = await second
        assert status in (201, 202), body
    finally:
        if second is not None:
            await asyncio.wait({second})  # its request answered, whatever became of it
        for path, body in (
            ("/users/research-1/server", None),
            ("/users/research-2/server", None),
            ("/users/research-1/servers/second", {"remove": True}),
        ):
            await asyncio.to_thread(api, demo, token, "DELETE", path, body)

        async def no_research_pods():
            return [p for p in await user_pods(demo) if "research" in p] == []

        await eventually(no_research_pods, "research's pods to go", within=120)


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_dra_server_starts_and_its_device_is_named(browser, demo):
    """test-1 starts "H200 via DRA": the spawn form names the device and the free count
    the DRA driver's ResourceSlices give; kube-scheduler allocates one of the DRA node's
    whole H200s to the server's claim, and the dashboard names that device."""
    # the walkthrough's step (wrapped), and how to see the slices and claims
    words = " ".join(demo.output.split())
    assert 'DRA: as research-1, start "H200 via DRA".' in words
    assert "kubectl get resourceslices -o yaml; kubectl get resourceclaims -A" in words
    token = printed(demo, r"^\s+export JUPYTERHUB_API_TOKEN=(\w+)$")
    try:
        async with logged_in(browser, demo, "test-1") as page:
            text = await page.inner_text("#spawn_form")
            assert "Test (admins): H200 via DRA" in text
            assert "1 x H200 via DRA" in text
            # GPUs 1-3 of h200-dra-0 (GPU 0 is in MIG mode: mig.nvidia.com's)
            assert "cluster: 3 of 3 devices free" in text
            await page.check("#profile-item-test--research-dra")
            await page.click("#spawn_form button[type=submit]")
            try:
                await page.wait_for_url(f"{demo.url}/user/test-1/lab**", timeout=SPAWN_TIMEOUT_MS)
            except PlaywrightTimeout:
                raise AssertionError(await what_went_wrong(page, demo)) from None
            await page.goto(f"{demo.url}/services/gpu/")
            device = page.locator("span.device")
            await device.wait_for(timeout=PAGE_TIMEOUT_MS)
            shown = await device.inner_text()
            assert re.fullmatch(r"gpu-[123] \(NVIDIA H200 NVL\) on h200-dra-0", shown), shown
            await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
            await page.screenshot(path=str(SCREENSHOTS / "dashboard-dra.png"), full_page=True)
        async with logged_in(browser, demo, "test-2") as page:
            await shown_after_reloads(page, "cluster: 2 of 3 devices free")
    finally:
        await asyncio.to_thread(api, demo, token, "DELETE", "/users/test-1/server")

        async def gone():
            return "jupyter-test-1" not in await user_pods(demo)

        await eventually(gone, "test-1's pod to go", within=120)


# ---- what runs: processes and their listening sockets, from /proc ----------------


def accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


@pytest.mark.k8s
@pytest.mark.hub
def test_ctrl_c_stops_everything_and_leaves_nothing_behind(demo):
    processes = processes_under(demo.process.pid)
    addresses = [
        a for found in sockets.listening_addresses([demo.process.pid]).values() for a in found
    ]
    # what is about to be stopped is really there, and loopback only
    assert f"127.0.0.1:{demo.port}" in addresses, addresses
    assert [a for a in addresses if not sockets.is_loopback(a)] == []
    assert demo.cluster_dir.is_dir()
    assert demo.hub_dir.is_dir()
    # Prometheus runs as a process of its own; the simulated exporter serves from the demo's
    prometheus = [pid for pid in processes if Path(cmdline(pid).split(" ")[0]).name == "prometheus"]
    assert len(prometheus) == 1, [cmdline(pid) for pid in processes]
    exporter = printed(demo, r"dcgm-exporter: http://(127\.0\.0\.1:\d+)/metrics")
    assert exporter in addresses

    assert demo.interrupt() == 0, demo.output
    assert "stopped; nothing is left running" in demo.output
    assert "Traceback" not in demo.output
    assert still_running(processes) == []
    assert still_running({pid: processes[pid] for pid in prometheus}) == []
    assert [a for a in addresses if accepts(a)] == []
    assert not accepts(exporter)
    assert not demo.cluster_dir.exists()
    assert not demo.hub_dir.exists()


@pytest.mark.k8s
@pytest.mark.hub
def test_the_next_demo_removes_what_a_killed_demo_left_running(built):
    killed = Demo(free_port())
    try:
        killed.wait_until_up()
        processes = processes_under(killed.process.pid)
        killed.process.kill()  # kill -9, or a closed terminal: no chance to clean up
        killed.process.wait(30)
        # the cluster and the hub run in sessions of their own: they outlive it
        assert still_running(processes)
        assert killed.cluster_dir.is_dir()

        following = Demo(free_port())
        try:
            following.wait_until_up()
            assert f"earlier demo (pid {killed.process.pid})" in following.output
            assert still_running(processes) == []
            assert not killed.cluster_dir.exists()
            assert not killed.hub_dir.exists()
            # and a closed terminal (SIGHUP) cleans up like Ctrl-C
            assert following.interrupt(sig=signal.SIGHUP) == 0, following.output
            assert "stopped; nothing is left running" in following.output
            assert not following.cluster_dir.exists()
            assert not following.hub_dir.exists()
        finally:
            following.make_sure_it_is_gone()
    finally:
        killed.make_sure_it_is_gone()
