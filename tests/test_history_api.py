"""api/history and api/showback through a real hub and its GPU service: one member's
flood of history requests is bounded (429 with Retry-After), answers a second apart
are the cached one, the usage pass and the budget rule keep their pace meanwhile (a stop
budget's stop comes at its announced time through the flood), and an impossible
showback month is the asker's 400."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime

import pytest

from hub_helpers import running_hub
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from kube_helpers import eventually
from test_service_hub import aget, start_server, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200"}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "alpha": {"display_name": "Alpha Lab", "quota": {"gpus": 4}, "profiles": ["small"]},
        "sysadmins": {"admin": True, "unlimited": True, "profiles": ["small"]},
        # 0.002 GPU-hours: 7.2 GPU-seconds, used up by one server within seconds
        "course": {
            "display_name": "Short Course",
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "budget": {"gpu_hours": 0.002, "period": "1h", "when_exhausted": "stop", "grace": "6s"},
        },
    },
}
DAY = 86400.0
#: records of a year ago, older than the months the service keeps in memory: a history
#: of them is read from the database, long enough for requests to overlap
OLD_RECORDS = 150_000


def seed(path, now: float) -> None:
    store = UsageStore(f"sqlite:///{path}")
    start = now - 360 * DAY
    batch = []
    for i in range(OLD_RECORDS):
        began = start + i * (200 * DAY / OLD_RECORDS)
        end = began + 8 * 3600
        batch.append(
            UsageRecord(
                f"old{i}", f"ns/jupyter-u{i % 500}", f"u{i % 500}", "alpha", "small", "h200",
                1.0, began, end, end,
            )
        )  # fmt: skip
        if len(batch) == 10_000:
            store.open(batch)
            batch = []
    store.dispose()


@pytest.fixture(scope="module")
async def history_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        start=False,
        users={"amy": ["alpha"], "olga": ["sysadmins"], "cid": ["course"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.usage_interval = 1\n"
            "c.GPUService.hub_poll_interval = 1\n"
            "c.GPUService.history_per_user = 1\n"
            "c.GPUService.history_total = 2\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await asyncio.to_thread(seed, hub.directory / "jupyterhub-gpu-usage.sqlite", time.time())
        await asyncio.to_thread(hub.start)
        await wait_for_service(hub)
        yield hub


async def get(hub, token: str, path: str) -> tuple[int, dict, dict | str]:
    status, headers, body = await aget(hub.service_url + path, token)
    try:
        return status, headers, json.loads(body)
    except ValueError:
        return status, headers, body


def window(days_ago: float, now: float, seconds: float = 0) -> str:
    """A month of alpha's use from ``days_ago``, in hours, asked ``seconds`` later."""
    since = now - days_ago * DAY + seconds
    return f"api/history?group=alpha&from={since:.0f}&to={since + 30 * DAY:.0f}&step=1h"


async def test_a_members_flood_is_bounded_and_an_answer_a_second_later_is_the_cached_one(
    history_hub,
):
    amy = await user_token(history_hub, "amy")
    now = time.time()
    status, _, first = await get(history_hub, amy, window(340, now))
    assert status == 200, first
    assert first["from"] % 3600 == 0
    assert first["to"] - first["from"] == 30 * DAY + 3600  # rounded out to whole hours
    assert max(first["flavors"]["h200"]) > 0
    # at once: five new windows (one computes, her only slot, the others are refused)
    # and the first window asked a second later (the cached answer, never refused)
    answers = await asyncio.gather(
        *(get(history_hub, amy, window(330 - 5 * i, now)) for i in range(5)),
        get(history_hub, amy, window(340, now, seconds=1)),
    )
    *new, again = answers
    assert again[0] == 200, again
    assert again[2]["times"] == first["times"]
    assert again[2]["flavors"] == first["flavors"]
    refused = [(headers, body) for status, headers, body in new if status == 429]
    assert refused, [status for status, _, _ in new]
    for headers, body in refused:
        assert int(headers["retry-after"]) >= 1
        assert body["message"] == (
            "1 computations of GPU use over time are under way for you, the most allowed "
            "at once; ask again in a moment"
        )


async def test_the_usage_pass_keeps_its_pace_under_a_flood(history_hub):
    """Three members' worth of requests without pause for ten seconds: every usage pass
    and budget run meanwhile succeeds, at its interval."""
    amy, root = await user_token(history_hub, "amy"), await user_token(history_hub, "root")

    async def tasks() -> dict:
        status, _, view = await get(history_hub, root, "api/usage")
        assert status == 200, view
        return {t["name"]: t for t in view["tasks"]}

    before = await tasks()
    now, statuses = time.time(), []

    async def flood(n: int) -> None:
        deadline = time.monotonic() + 10
        i = 0
        while time.monotonic() < deadline:
            status, _, _ = await get(history_hub, amy, window(300 - (n * 50 + i) % 60, now))
            statuses.append(status)
            i += 1

    await asyncio.gather(*(flood(n) for n in range(3)))
    after = await tasks()
    assert 429 in statuses, statuses
    assert 200 in statuses, statuses
    for name in ("GPU time", "GPU budgets"):
        assert after[name]["ok"], after[name]
        # a pass a second: about ten in ten seconds, however many requests came
        assert after[name]["runs"] - before[name]["runs"] >= 6, (before[name], after[name])
        assert after[name]["consecutive_failures"] == 0


async def test_an_impossible_showback_month_is_a_400_saying_what_to_send(history_hub):
    root = await user_token(history_hub, "root")
    for month in ("0000-01", "9999-12", "1969-12"):
        status, _, body = await get(history_hub, root, f"api/showback?month={month}")
        assert status == 400, (month, body)
        assert body["message"] == f"month: expected a month from 1970-01 to 9998-12, got '{month}'"
    status, _, body = await get(history_hub, root, "api/showback?month=2026-13")
    assert (status, body["message"]) == (
        400,
        "month: expected YYYY-MM, such as 2026-11, got '2026-13'",
    )
    status, _, body = await get(history_hub, root, "api/history?group=alpha&to=0001-01-01")
    assert status == 400
    assert body["message"].startswith("to: expected a time from 1970")

    async def answered():
        status, _, body = await get(history_hub, root, "api/showback?month=2026-11&format=csv")
        return status == 200 and body

    assert (await eventually(answered, "a possible month's showback")).startswith("month,")


async def test_a_stop_budget_stops_at_its_announced_time_through_a_flood(history_hub):
    """cid's course budget runs out while amy floods api/history: the notice announces
    the stop, and the server stops then, not later."""
    amy = await user_token(history_hub, "amy")
    cid = await user_token(history_hub, "cid")
    done = asyncio.Event()
    now, statuses = time.time(), []

    async def flood(n: int) -> None:
        i = 0
        while not done.is_set():
            status, _, _ = await get(history_hub, amy, window(280 - (n * 50 + i) % 60, now))
            statuses.append(status)
            i += 1

    flooding = [asyncio.create_task(flood(n)) for n in range(3)]
    try:
        await start_server(history_hub, "cid", "course--small")

        async def announced():
            status, _, view = await get(history_hub, cid, "api/usage")
            assert status == 200, view
            for notice in view["notices"]:
                if notice["stop_at"] and re.search(r"stops at \S+ \S+ UTC", notice["text"]):
                    return notice["stop_at"]
            return None

        said = await eventually(announced, "cid to be told when the server stops", within=60)
        at = datetime.fromisoformat(said).timestamp()

        async def stopped():
            _, model = await asyncio.to_thread(history_hub.api, "GET", "/users/cid")
            return model["servers"] == {} and time.time()

        gone = await eventually(stopped, "cid's server to be stopped", within=60, interval=0.2)
    finally:
        done.set()
        await asyncio.gather(*flooding)
    assert 429 in statuses, statuses
    # never before the announced time; after it by at most a budget run (1 s), the hub's
    # stop and this test's poll
    assert at - 1 <= gone <= at + 5, (said, gone - at)
