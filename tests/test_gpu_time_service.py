"""GPU time in the service, through a real hub and cluster: recorded from the pods when
the hub did not, ends the service missed bounded by the intervals, usage kept across
restarts, and each viewer's history and showback limited to their own groups."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hub_helpers import running_hub
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from kube_helpers import eventually, pod_manifest
from test_service_hub import (
    SCREENSHOTS,
    aget,
    login,
    service_pids,
    start_server,
    user_token,
    wait_for_service,
)

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "alpha": {
            "display_name": "Alpha Lab",
            "quota": {"gpus": 4},
            "profiles": ["small"],
            "budget": {"gpu_hours": 100, "period": "7d"},
        },
        "beta": {"display_name": "Beta Lab", "quota": {"gpus": 2}, "profiles": ["small"]},
        # 0.002 GPU-hours: 7.2 GPU-seconds, used up by one server within seconds
        "course": {
            "display_name": "Short Course",
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "budget": {"gpu_hours": 0.002, "period": "1h", "when_exhausted": "stop", "grace": "6s"},
        },
        "trial": {
            "display_name": "Trial",
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "per_user": {"budget": {"gpu_hours": 0.002, "period": "1h"}},
        },
    },
}
#: the longest time an unwitnessed end can be off: the hub's poll and resync, the
#: service's pass, and a second of slack
END_ERROR = 5 + 2 + 1


@pytest.fixture(scope="module")
async def time_hub(local_cluster, core, priority_class_objects, gpu_metrics):
    async with running_hub(
        local_cluster,
        core,
        users={
            "ann": ["alpha"],
            "amy": ["alpha"],
            "bob": ["beta"],
            "cid": ["course"],
            "tia": ["trial"],
        },
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.usage_interval = 2\n"
            "c.GPUService.utilisation_refresh = 2\n"
            "c.GPUService.emissions_factor = 400\n"
            f"c.GPUService.prometheus_url = {gpu_metrics.prometheus.url!r}\n"
            "c.GPUService.hub_poll_interval = 1\n"
            "c.GPUService.auth_cache_max_age = 3\n"
            "c.GPUKubeSpawner.ledger_resync_interval = 3\n"
            "c.Spawner.poll_interval = 5\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        yield hub


def store_of(hub) -> UsageStore:
    # the default accounting_url, relative to the hub's (and its service's) directory
    return UsageStore(f"sqlite:///{hub.directory / 'jupyterhub-gpu-usage.sqlite'}")


async def rows(hub, **match) -> list:
    records = await asyncio.to_thread(store_of(hub).overlapping, 0, time.time() + 3600)
    return [r for r in records if all(getattr(r, k) == v for k, v in match.items())]


async def get_json(hub, token: str, path: str) -> tuple[int, dict | str]:
    status, _, body = await aget(hub.service_url + path, token)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


async def test_a_pod_the_hub_never_started_is_recorded_from_its_own_start_and_ended_unseen(
    time_hub, core
):
    """The hub was down when this server started: the service writes it down from the
    pod, and ends it at its last sighting when it goes while nobody looks."""
    charge = {"user": "bob", "request": {"gpus": "1", "cpu": 100, "memory": 1, "servers": 1}}
    body = pod_manifest("jupyter-bob-restored", {"nvidia.com/gpu": "1"}, nodeSelector=H200)
    body["metadata"]["labels"] = {
        # as KubeSpawner labels every server pod (its own watch selects them by it)
        "component": "singleuser-server",
        "gpu.jupyterhub.org/group": "beta",
        "gpu.jupyterhub.org/profile": "small",
        "gpu.jupyterhub.org/flavor": "h200",
        "hub.jupyter.org/username": "bob",
    }
    body["metadata"]["annotations"] = {"gpu.jupyterhub.org/charge": json.dumps(charge)}
    await core.create_namespaced_pod(time_hub.namespace, body)

    async def recorded():
        return await rows(time_hub, key=f"{time_hub.namespace}/jupyter-bob-restored")

    (record,) = await eventually(recorded, "the service to record the pod", within=30)
    pod = await core.read_namespaced_pod("jupyter-bob-restored", time_hub.namespace)
    assert record.started == pod.status.start_time.timestamp()
    assert (record.user, record.group, record.flavor, record.gpus) == ("bob", "beta", "h200", 1.0)
    await asyncio.sleep(4)
    await core.delete_namespaced_pod(
        "jupyter-bob-restored", time_hub.namespace, grace_period_seconds=0
    )
    deleted = time.time()

    async def ended():
        (record,) = await recorded()
        return record.ended

    end = await eventually(ended, "the row to be ended", within=30)
    assert deleted - END_ERROR <= end <= deleted + 1, (end, deleted)


async def test_gpu_time_survives_a_service_restart_and_a_server_ended_while_it_was_down(
    time_hub, core
):
    await start_server(time_hub, "ann", "alpha--small")
    root = await user_token(time_hub, "root")

    async def counted():
        status, view = await get_json(time_hub, root, "api/usage")
        used = view["gpu_hours"]["groups"]["alpha"]["used"] if status == 200 else 0
        return used > 0 and used

    await eventually(counted, "alpha's GPU-hours to count ann's server", within=30)
    (pid,) = service_pids(time_hub)
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(3)
    # ann's server goes while the service is down, not through the hub
    (pod,) = (
        await core.list_namespaced_pod(
            time_hub.namespace, label_selector="hub.jupyter.org/username=ann"
        )
    ).items
    await core.delete_namespaced_pod(pod.metadata.name, time_hub.namespace, grace_period_seconds=0)
    deleted = time.time()

    async def ann_ended():
        records = await rows(time_hub, user="ann")
        return records and all(r.ended for r in records) and records

    (record,) = await eventually(ann_ended, "ann's row to be ended", within=60)
    assert deleted - END_ERROR <= record.ended <= deleted + END_ERROR, (record.ended, deleted)
    # the hub restarts its service; what it shows still counts ann's use
    await wait_for_service(time_hub)
    assert service_pids(time_hub) != [pid]
    expected = (record.ended - record.started) / 3600

    async def restored():
        status, view = await get_json(time_hub, root, "api/usage")
        hours = view["gpu_hours"]["groups"].get("alpha") if status == 200 else None
        return hours and abs(hours["used"] - expected) < 1e-3 and hours

    hours = await eventually(restored, "the restarted service to count ann's use", within=30)
    assert (hours["budget"], hours["period_seconds"], hours["exhausted"]) == (100, 7 * 86400, False)


async def test_members_see_their_own_groups_history_and_showback_only(time_hub, gpu_metrics):
    # amy's GPU is busy 60% of the time (the simulated DCGM exporter), bob's idle
    gpu_metrics.exporter.set_utilization(time_hub.namespace, "jupyter-amy", 60)
    await start_server(time_hub, "amy", "alpha--small")
    await start_server(time_hub, "bob", "beta--small")
    await asyncio.sleep(3)
    amy, root = await user_token(time_hub, "amy"), await user_token(time_hub, "root")
    month = datetime.now(UTC).strftime("%Y-%m")

    # history: amy's group, by flavor; beta is not hers to see
    status, history = await get_json(time_hub, amy, "api/history?group=alpha&step=1m")
    assert status == 200, history
    assert history["group"] == "alpha"
    assert len(history["times"]) == len(history["flavors"]["h200"]) == 1440
    assert history["flavors"]["h200"][-1] > 0  # amy's server holds one now
    assert history["quota_gpus"] == 4
    status, refused = await get_json(time_hub, amy, "api/history?group=beta")
    assert status == 404
    assert refused["message"] == "group: no group named 'beta' that you can see"
    status, bad = await get_json(time_hub, amy, "api/history?group=alpha&step=often")
    assert (status, bad["message"]) == (
        400,
        "step: expected a duration such as 5m, 1h or 1d, got 'often'",
    )
    # all of history at once is refused before anything is read
    status, whole = await get_json(time_hub, amy, "api/history?group=alpha&from=0&step=30d")
    assert (status, whole["message"]) == (
        400,
        "at most 366 days of history at once: ask for a later from, or several ranges",
    )

    async def showback(token: str) -> dict:
        status, body = await get_json(time_hub, token, f"api/showback?month={month}")
        assert status == 200, body
        return body

    async def with_bob_and_amy():
        body = await showback(root)
        users = {(u["group"], u["user"]) for u in body["users"]}
        return {("alpha", "amy"), ("beta", "bob")} <= users and body

    everything = await eventually(with_bob_and_amy, "showback to list amy and bob", within=30)
    assert {g["group"] for g in everything["groups"]} >= {"alpha", "beta"}

    # allocated versus utilised, where DCGM measured the GPU: amy's at 60%, bob's idle
    async def measured():
        body = await showback(root)
        users = {(u["group"], u["user"]): u for u in body["users"]}
        amy_row, bob_row = users[("alpha", "amy")], users[("beta", "bob")]
        return amy_row["measured_gpu_hours"] and bob_row["measured_gpu_hours"] and body

    everything = await eventually(measured, "Prometheus to have amy's and bob's GPUs", within=40)
    users = {(u["group"], u["user"]): u for u in everything["users"]}
    amy_row, bob_row = users[("alpha", "amy")], users[("beta", "bob")]
    assert amy_row["utilised_gpu_hours"] == pytest.approx(
        0.6 * amy_row["measured_gpu_hours"], rel=0.05
    )
    assert bob_row["utilised_gpu_hours"] == 0
    # the energy of amy's whole GPU at what the exporter says it draws at 60 % (the
    # JSON's kWh are rounded to 4 places), and its emissions at the site's 400 g/kWh
    drawn = gpu_metrics.exporter.pod_power(time_hub.namespace, "jupyter-amy")
    assert amy_row["energy_kwh"] == pytest.approx(
        drawn / 1000 * amy_row["energy_measured_gpu_hours"], rel=0.05, abs=1e-4
    )
    assert amy_row["emissions_kg"] == pytest.approx(0.4 * amy_row["energy_kwh"], abs=1e-4)
    assert everything["emissions_factor_g_per_kwh"] == 400
    assert everything["energy_coverage"]["measured_gpu_hours"] > 0
    mine = await showback(amy)
    assert {g["group"] for g in mine["groups"]} == {"alpha"}
    # ann's earlier use is in alpha's total, but under no name amy may read
    assert {u["user"] for u in mine["users"]} == {"amy", "(others)"}
    status, _, text = await aget(
        time_hub.service_url + f"api/showback?month={month}&format=csv", amy
    )
    assert status == 200
    table = list(csv.DictReader(io.StringIO(text)))
    assert {(r["group"], r["user"]) for r in table} == {("alpha", "amy"), ("alpha", "(others)")}
    assert list(table[0]) == [
        "month",
        "group",
        "user",
        "flavor",
        "gpu_hours",
        "measured_gpu_hours",
        "utilised_gpu_hours",
        "utilised_coverage",
        "account",
        "billed_units",
        "cost",
        "currency",
        "energy_kwh",
        "emissions_kg",
    ]
    assert sum(float(r["gpu_hours"]) for r in table) == pytest.approx(
        mine["groups"][0]["gpu_hours"], abs=1e-3
    )
    # a site that bills nothing: a unit per GPU-hour, no price, no account
    for row in table:
        assert (row["billed_units"], row["cost"], row["account"]) == (row["gpu_hours"], "", "")
    assert mine["currency"] is None
    assert mine["groups"][0]["billed_units"] == mine["groups"][0]["gpu_hours"]
    assert mine["groups"][0]["cost"] is None
    status, bad = await get_json(time_hub, amy, "api/showback?month=November")
    assert (status, bad["message"]) == (
        400,
        "month: expected YYYY-MM, such as 2026-11, got 'November'",
    )


async def notices_for(hub, user: str) -> list[str]:
    status, view = await get_json(hub, await user_token(hub, user), "api/usage")
    assert status == 200, view
    return [n["text"] for n in view["notices"]]


async def test_a_used_up_stop_budget_stops_the_server_after_a_notice_and_its_grace(time_hub):
    started = time.monotonic()
    await start_server(time_hub, "cid", "course--small")

    async def told():
        texts = [t for t in await notices_for(time_hub, "cid") if "budget used up" in t]
        return texts

    (notice,) = await eventually(told, "cid to be told the budget is used up", within=40)
    assert re.fullmatch(
        r"GPU budget used up: Short Course used 0\.00\d+ of 0\.002 GPU-hours in the last "
        r"hour; cid's server stops at \d{4}-\d\d-\d\d \d\d:\d\d UTC, in 6 seconds: save "
        r"your work",
        notice,
    ), notice
    _, model = await asyncio.to_thread(time_hub.api, "GET", "/users/cid")
    assert model["servers"][""]["ready"], "stopped before its grace was over"

    async def stopped():
        _, model = await asyncio.to_thread(time_hub.api, "GET", "/users/cid")
        return model["servers"] == {}

    await eventually(stopped, "cid's server to be stopped", within=40)
    # 7.2 GPU-seconds to use the budget up, then the 6 s grace
    assert time.monotonic() - started >= 7.2 + 6
    texts = await notices_for(time_hub, "cid")
    assert any(t.startswith("Stopping cid's server: Short Course used") for t in texts), texts
    # and a new GPU server is refused at the hub, with the numbers
    status, body = await asyncio.to_thread(
        time_hub.api, "POST", "/users/cid/server", {"profile": "course--small"}
    )
    assert status == 403, body
    assert body["message"].startswith("Short Course used 0.00")


async def test_a_used_up_warn_budget_tells_the_user_and_leaves_the_server_running(time_hub):
    await start_server(time_hub, "tia", "trial--small")

    async def told():
        return [t for t in await notices_for(time_hub, "tia") if "budget used up" in t]

    (notice,) = await eventually(told, "tia to be told the budget is used up", within=40)
    assert notice.startswith("GPU budget used up: tia in Trial used 0.00")
    assert notice.endswith(
        "; new GPU servers are refused until some of it is free again; tia's server keeps running"
    )
    await asyncio.sleep(5)
    _, model = await asyncio.to_thread(time_hub.api, "GET", "/users/tia")
    assert model["servers"][""]["ready"]
    # nobody else is told about tia
    assert not [t for t in await notices_for(time_hub, "bob") if "tia" in t]


async def test_the_dashboard_draws_gpu_use_over_time_and_offers_the_showback_csv(time_hub, browser):
    # a day of alpha's earlier use, so the chart has a shape to draw
    now = time.time()
    earlier = [(2, now - 20 * 3600, now - 14 * 3600), (1, now - 16 * 3600, now - 13 * 3600)]
    earlier.append((3, now - 8 * 3600, now - 6 * 3600))
    await asyncio.to_thread(
        store_of(time_hub).open,
        [
            UsageRecord(
                f"earlier-{i}", f"x/earlier-{i}", "amy", "alpha", "small", "h200", g, s, e, e
            )
            for i, (g, s, e) in enumerate(earlier)
        ],
    )
    root = await user_token(time_hub, "root")

    async def counted():
        status, view = await get_json(time_hub, root, "api/usage")
        hours = view["gpu_hours"]["groups"].get("alpha") if status == 200 else None
        return hours and hours["used"] > 12 + 3 + 6

    await eventually(counted, "the service to read the earlier use", within=30)
    context = await browser.new_context(accept_downloads=True)
    try:
        page = await context.new_page()
        await login(page, time_hub, "root")
        await page.goto(time_hub.service_url)
        await page.wait_for_selector("[data-chart=alpha] svg polygon")
        await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
        shot = SCREENSHOTS / "dashboard-gpu-time.png"
        await page.screenshot(path=str(shot), full_page=True)
        chart = page.locator("[data-chart=alpha]")
        legend = await chart.locator(".legend").inner_text()
        assert "H200" in legend
        assert "quota 4" in legend
        # 100 GPU-hours a week allow 0.595 GPUs used evenly
        assert "budget (sustained GPUs it allows) 0.595" in legend
        # the stacked area is drawn higher where more GPUs were in use
        box = await chart.locator("svg polygon").first.bounding_box()
        assert box["height"] > 20
        text = await page.inner_text("body")
        assert "Showback for " in text
        assert "of 100 GPU-hours used in the last 7 days" in text
        # alpha's energy this month, where its GPUs' power was measured, and its emissions
        heads = await page.locator("table.showback th").all_inner_texts()
        assert heads[heads.index("kWh") + 1] == "kg CO₂e", heads
        row = page.locator("table.showback tr", has_text="alpha")
        cells = await row.locator("td").all_inner_texts()
        assert float(cells[heads.index("kWh")]) > 0, (heads, cells)
        async with page.expect_download() as download_info:
            await page.click("text=Download CSV")
        download = await download_info.value
        path = await download.path()
        content = await asyncio.to_thread(Path(path).read_text)
        assert content.splitlines()[0].startswith("month,group,user,flavor,gpu_hours,")
        assert any(line.split(",")[1:3] == ["alpha", "amy"] for line in content.splitlines())
        # the week's view draws the same group over seven days
        await page.click("text=week")
        await page.wait_for_selector("[data-chart=alpha] svg polygon")
        assert "range=week" in page.url
    finally:
        await context.close()


async def test_metrics_expose_each_groups_gpu_hours_and_budget(time_hub):
    async def scraped():
        status, _, body = await aget(time_hub.service_url + "metrics", time_hub.api_token)
        assert status == 200, body
        values = {}
        for line in body.splitlines():
            if line.startswith("jupyterhub_gpu_group_gpu_hours"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values.get('jupyterhub_gpu_group_gpu_hours_used{group="alpha"}') and values

    values = await eventually(scraped, "alpha's GPU-hours in the metrics")
    assert values['jupyterhub_gpu_group_gpu_hours_budget{group="alpha"}'] == 100
    assert values['jupyterhub_gpu_group_gpu_hours_window_seconds{group="alpha"}'] == 7 * 86400
    # a group without a budget: its use over 30 days, and no budget series
    assert values['jupyterhub_gpu_group_gpu_hours_window_seconds{group="beta"}'] == 30 * 86400
    assert 'jupyterhub_gpu_group_gpu_hours_budget{group="beta"}' not in values
