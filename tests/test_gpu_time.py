"""GPU time through a real hub: budgets refuse with the numbers, usage outlives restarts."""

from __future__ import annotations

import asyncio
import html
import re
import time

import pytest

from hub_helpers import api, page_as
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from kube_helpers import eventually
from test_service_hub import aget, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}


def lab_policy(budget: dict) -> dict:
    return {
        "flavors": {"a100": {"kind": "gpu", "display_name": "A100", "node_selector": A100}},
        "profiles": {
            "gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "a100"}},
            "cpu": {"cpu": "100m", "memory": "128Mi"},
        },
        "everyone": {"profiles": ["cpu"]},
        "groups": {
            "lab": {
                "display_name": "Lab",
                "quota": {"gpus": 4},
                "profiles": ["gpu"],
                "budget": budget,
            }
        },
    }


GPU = {"profile": "lab--gpu"}
USERS = {"ann": ["lab"], "bob": ["lab"]}


def store_for(tmp_path) -> tuple[UsageStore, str]:
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    return UsageStore(url), f"c.GPUPolicy.accounting_url = {url!r}\n"


async def running(hub, user: str) -> None:
    async def ready():
        _, model = await api(hub, "GET", f"/users/{user}")
        server = model["servers"].get("")
        return server is not None and server["ready"]

    await eventually(ready, f"{user}'s server to be ready", within=90)


async def stopped(hub, user: str) -> None:
    status, body = await api(hub, "DELETE", f"/users/{user}/server")
    assert status in (202, 204), body

    async def gone():
        _, model = await api(hub, "GET", f"/users/{user}")
        return model["servers"] == {}

    await eventually(gone, f"{user}'s server to stop", within=60)


def seed(store: UsageStore, *, gpus: float, started: float, ended: float) -> None:
    store.open(
        [
            UsageRecord(
                uid="earlier-pod",
                key="elsewhere/jupyter-bob",
                user="bob",
                group="lab",
                profile="gpu",
                flavor="a100",
                gpus=gpus,
                started=started,
                last_seen=ended,
                ended=ended,
            )
        ]
    )


async def test_an_exhausted_budget_refuses_gpu_spawns_with_the_numbers_until_the_window_moves(
    hub_factory, core, tmp_path
):
    store, config = store_for(tmp_path)
    # 0.005 GPU-hours (18 GPU-seconds) per 2 minutes; 20 GPU-seconds were used just now,
    # which keep the budget used up for about 95 s: long enough for a hub to start on a
    # loaded machine (with 40 s a start of 15 s let the first spawns in)
    now = time.time()
    seed(store, gpus=1, started=now - 25, ended=now - 5)
    hub = await hub_factory(
        policy=lab_policy({"gpu_hours": 0.005, "period": "2m"}), users=USERS, extra_config=config
    )
    # concurrent GPU spawns: every one is refused, none creates a pod
    results = await asyncio.gather(*(api(hub, "POST", f"/users/{u}/server", GPU) for u in USERS))
    for status, body in results:
        assert status == 403, body
        assert body["message"].startswith(
            "Lab used 0.00556 of 0.005 GPU-hours in the last 2 minutes: GPU servers can "
            "start again at "
        ), body
        assert re.search(r" at \d{4}-\d\d-\d\d \d\d:\d\d UTC, when ", body["message"]), body
        assert body["message"].endswith(
            "start one without GPUs, or ask an admin to raise the budget"
        )
    assert (await core.list_namespaced_pod(hub.namespace)).items == []
    # the spawn form says so beside the group's quota
    form = await asyncio.to_thread(page_as, hub.url, "ann", hub.password)
    assert "Lab: all 0.005 GPU-hours of the last 2 minutes used" in html.unescape(form)
    # a server without GPUs is not affected
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "everyone--cpu"})
    assert status in (201, 202), body
    await running(hub, "ann")
    await stopped(hub, "ann")

    # the window moves past the earlier use: GPU servers start again
    async def admitted():
        status, body = await api(hub, "POST", "/users/ann/server", GPU)
        assert status in (201, 202, 403), body
        return status != 403

    await eventually(admitted, "the budget to free up", within=120)
    await running(hub, "ann")
    # the hub wrote the server's start down, and its end when it stopped
    (record,) = [r for r in store.overlapping(now, time.time()) if r.user == "ann"]
    assert (record.group, record.profile, record.gpus, record.ended) == ("lab", "gpu", 1.0, None)
    await stopped(hub, "ann")
    stop_seen = time.time()

    async def ended():
        (record,) = [r for r in store.overlapping(now, time.time()) if r.user == "ann"]
        return record.ended

    end = await eventually(ended, "the hub to record the stop")
    assert stop_seen - 30 < end <= stop_seen


async def test_gpu_time_used_before_a_hub_restart_still_counts_after_it(
    hub_factory, core, tmp_path
):
    _, config = store_for(tmp_path)
    # 0.002 GPU-hours: 7.2 GPU-seconds in the last hour
    hub = await hub_factory(
        policy=lab_policy({"gpu_hours": 0.002, "period": "1h"}), users=USERS, extra_config=config
    )
    status, body = await api(hub, "POST", "/users/ann/server", GPU)
    assert status in (201, 202), body
    await running(hub, "ann")
    await asyncio.sleep(9)
    await stopped(hub, "ann")
    await asyncio.to_thread(hub.restart)
    status, body = await api(hub, "POST", "/users/bob/server", GPU)
    assert status == 403, body
    assert body["message"].startswith("Lab used 0.00"), body
    assert "of 0.002 GPU-hours in the last hour" in body["message"]


async def test_an_unreadable_usage_database_refuses_budgeted_gpu_spawns_unless_fail_open(
    hub_factory, core, tmp_path
):
    # a directory that cannot exist: the database can be neither created nor read
    unreadable = "c.GPUPolicy.accounting_url = 'sqlite:////proc/no-such-folder/usage.sqlite'\n"
    hub = await hub_factory(
        policy=lab_policy({"gpu_hours": 10, "period": "1d"}),
        users={**USERS, "root": []},
        admin_users=("root",),
        gpu_service=True,
        extra_config=unreadable
        + "c.GPUService.usage_interval = 1\n"
        + 'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
        '"services": ["demo-admin"]})\n',
    )
    status, body = await api(hub, "POST", "/users/ann/server", GPU)
    assert (status, body["message"]) == (
        403,
        "GPU-hour budgets cannot be checked now, as the usage database is unavailable, so "
        "GPU servers of groups with a budget cannot start: try again in a few minutes, or "
        "start one without GPUs",
    )
    assert (await core.list_namespaced_pod(hub.namespace)).items == []
    # the dashboard says so, and which way spawns fail
    await wait_for_service(hub)
    token = await user_token(hub, "root")

    async def reported():
        view, _ = await usage(hub, token)
        accounting = view["gpu_hours"]["accounting"]
        return accounting["ok"] is False and accounting

    accounting = await eventually(reported, "the service to report the database", within=30)
    assert accounting["when_unavailable"] == "refuse"
    assert "/proc/no-such-folder/usage.sqlite" in accounting["error"]
    status, _, page = await aget(hub.service_url, token)
    assert status == 200
    assert "GPU spawns of groups with a budget are refused until it is back" in page
    status, _, body = await aget(hub.service_url + "api/showback", token)
    assert status == 503
    assert "the GPU usage database (sqlite:////proc/no-such-folder/usage.sqlite)" in body
    # a user who is not an admin is told that it is down, not where it lives
    ann = await user_token(hub, "ann")
    view, _ = await usage(hub, ann)
    assert view["gpu_hours"]["accounting"]["ok"] is False
    assert view["gpu_hours"]["accounting"]["error"] == (
        "the GPU usage database cannot be read now; an admin can see why"
    )
    for path in ("api/showback", "api/history?group=lab"):
        status, _, body = await aget(hub.service_url + path, ann)
        assert status == 503, path
        assert "cannot be read now" in body
        assert "no-such-folder" not in body
    status, _, page = await aget(hub.service_url, ann)
    assert "no-such-folder" not in page
    # an admin who prefers availability says so: the spawn goes ahead unchecked
    hub.extra_config += "c.GPUPolicy.accounting_fail_open = True\n"
    await asyncio.to_thread(hub.restart)
    status, body = await api(hub, "POST", "/users/bob/server", GPU)
    assert status in (201, 202), body
    await running(hub, "bob")


async def test_concurrent_spawns_never_jointly_promise_more_than_a_stop_budget_has(
    hub_factory, core, tmp_path
):
    # 1 GPU-hour a day, every server promised 10 minutes once it is used up:
    # the remainder covers exactly 6 one-GPU servers, the quota 10
    users = {f"u{i}": ["lab"] for i in range(10)}
    budget = {"gpu_hours": 1, "period": "1d", "when_exhausted": "stop", "grace": "10m"}
    policy = lab_policy(budget)
    policy["groups"]["lab"]["quota"] = {"gpus": 10}
    hub = await hub_factory(policy=policy, users=users)
    results = await asyncio.gather(*(api(hub, "POST", f"/users/{u}/server", GPU) for u in users))
    admitted = [body for status, body in results if status in (201, 202)]
    refused = [body["message"] for status, body in results if status == 403]
    assert (len(admitted), len(refused)) == (6, 4), results
    for message in refused:
        # what is left shrinks a little as the admitted servers start using it
        assert re.fullmatch(
            r"Lab has (1|0\.9\d+) of 1 GPU-hour left in the last day, less than the 1\.2 "
            r"GPU-hours its servers' 6 GPUs and this server's 1 would use in the 10 minutes "
            r"each may still run once they are used up: try again when one of its servers "
            r"stops, or choose fewer GPUs",
            message,
        ), message

    async def pods():
        return len((await core.list_namespaced_pod(hub.namespace)).items) == 6

    await eventually(pods, "the 6 admitted servers' pods")
