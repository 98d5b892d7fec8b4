"""Chargeback through a real hub and its GPU service: flavors priced and weighted, a
change of rate in the middle of last month, accounts on groups (a child billed to its
parent's unless it names its own), the month's invoice as JSON, CSV and a printable
page in Chromium, and who may read it.

The usage database is seeded before the hub starts with servers of last month, of a
month more than a year ago (summed from the database, not the service's memory) and
of this month; the figures below are worked out by hand from them.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import time
from datetime import UTC, datetime

import pytest
from test_usage_scope import TOKENS, services_config

from hub_helpers import running_hub
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.usage import UsageRecord
from kube_helpers import eventually
from test_service_hub import (
    SCREENSHOTS,
    aget,
    login,
    start_server,
    user_token,
    wait_for_service,
)

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H = 3600.0
DAY = 86400.0


def month_start(year: int, month: int) -> float:
    return datetime(year + (month - 1) // 12, (month - 1) % 12 + 1, 1, tzinfo=UTC).timestamp()


NOW = datetime.now(UTC)
THIS = month_start(NOW.year, NOW.month)
LAST = month_start(NOW.year, NOW.month - 1)
LONG_AGO = month_start(NOW.year, NOW.month - 14)
LAST_MONTH = datetime.fromtimestamp(LAST, UTC).strftime("%Y-%m")
OLD_MONTH = datetime.fromtimestamp(LONG_AGO, UTC).strftime("%Y-%m")
#: how long this month's server ran (at most 2 hours, within this month)
RECENT = max(min(2 * H, NOW.timestamp() - 60 - THIS), 1.0)
#: the H200's rate changes in the middle of last month
CHANGE = LAST + 14 * DAY

POLICY = {
    "currency": "EUR",
    "flavors": {
        "h200": {
            "kind": "gpu",
            "display_name": "H200",
            "billing": [
                {"weight": 2, "price": 4.0},
                {
                    "from": datetime.fromtimestamp(CHANGE, UTC).date().isoformat(),
                    "weight": 3,
                    "price": 6.0,
                },
            ],
        },
        "a100": {"kind": "gpu", "display_name": "A100", "billing": {"weight": 1, "price": 1.5}},
        "mig": {
            "kind": "mig",
            "profile": "1g.10gb",
            "display_name": "MIG 1g.10gb",
            "billing": {"weight": 0.25, "price": 0.3},
        },
    },
    "profiles": {"big": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "research": {"account": "CC-100", "quota": {"gpus": 8}, "profiles": ["big"]},
        "nlp": {"parent": "research", "quota": {"gpus": 4}, "profiles": ["big"]},
        "vision": {
            "parent": "research",
            "account": "GRANT-7",
            "quota": {"gpus": 4},
            "profiles": ["big"],
        },
        "course": {"display_name": "Intro Course", "quota": {"gpus": 2}, "profiles": ["big"]},
        "sysadmins": {"admin": True, "unlimited": True, "profiles": ["big"]},
        # 0.006 billed units: 7.2 seconds of an H200 at weight 3 (21.6 at weight 1)
        "metered": {
            "display_name": "Metered",
            "quota": {"gpus": 2},
            "profiles": ["big"],
            "budget": {"units": 0.006, "period": "1h", "when_exhausted": "stop", "grace": "6s"},
        },
    },
}


def record(uid, group, user, flavor, gpus, start, hours) -> UsageRecord:
    end = start + hours * H
    return UsageRecord(uid, f"ns/{uid}", user, group, "big", flavor, gpus, start, end, end)


RECORDS = [
    # across the change: 120 h at 2 units / 4 EUR, 120 h at 3 / 6
    record("r1", "research", "ann", "h200", 1.0, LAST + 9 * DAY, 240),
    record("r2", "nlp", "nia", "a100", 2.0, LAST + 2 * DAY, 10),  # 20 GPU-h at 1 / 1.5
    record("r3", "vision", "vic", "h200", 1.0, LAST + 15 * DAY, 5),  # after it: 3 / 6
    record("r4", "course", "cid", "mig", 1 / 7, LAST + 3 * DAY, 7),  # 1 GPU-h at 0.25 / 0.3
    record("r5", "research", "ann", "h200", 1.0, LONG_AGO + 5 * DAY, 10),  # at 2 / 4
    # this month, for the dashboard: 2 GPU-hours of an A100, ended a minute ago
    record(
        "r6", "course", "cid", "a100", 2 * H / RECENT, NOW.timestamp() - 60 - RECENT, RECENT / H
    ),
]
#: last month's invoice: (GPU-hours, billed units, cost) by account
LAST_INVOICE = {
    "CC-100": (260.0, 620.0, 1230.0),
    "GRANT-7": (5.0, 15.0, 30.0),
    None: (1.0, 0.25, 0.3),
}


def seed(path) -> None:
    store = UsageStore(f"sqlite:///{path}")
    store.open(RECORDS)
    store.dispose()


@pytest.fixture(scope="module")
async def billing_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        start=False,
        users={
            "ann": ["research"],
            "nia": ["nlp"],
            "vic": ["vision"],
            "cid": ["course"],
            "olga": ["sysadmins"],
            "mel": ["metered"],
        },
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.usage_interval = 2\n"
            "c.GPUService.hub_poll_interval = 1\n"
            "c.GPUKubeSpawner.ledger_resync_interval = 3\n" + services_config()
        ),
    ) as hub:
        await asyncio.to_thread(seed, hub.directory / "jupyterhub-gpu-usage.sqlite")
        await asyncio.to_thread(hub.start)
        await wait_for_service(hub)
        yield hub


async def get(hub, token: str, path: str) -> tuple[int, str]:
    status, _, body = await aget(hub.service_url + path, token)
    return status, body


async def invoice(hub, token: str, month: str) -> dict:
    async def read():
        status, body = await get(hub, token, f"api/invoice?month={month}")
        assert status == 200, body
        view = json.loads(body)
        return view if view["accounts"] else None

    return await eventually(read, f"the invoice of {month}", within=30)


def totals(view: dict) -> dict:
    return {a["account"]: (a["gpu_hours"], a["billed_units"], a["cost"]) for a in view["accounts"]}


async def test_admins_and_the_usage_scope_read_each_months_invoice_by_account(billing_hub):
    root = await user_token(billing_hub, "root")
    for token in (root, TOKENS["billing"]):
        view = await invoice(billing_hub, token, LAST_MONTH)
        assert view["currency"] == "EUR"
        assert totals(view) == LAST_INVOICE
        research = view["accounts"][0]
        # nlp names no account: its use is its parent's account's
        assert [g["group"] for g in research["groups"]] == ["nlp", "research"]
        (h200,) = research["groups"][1]["flavors"]
        assert (h200["flavor"], h200["gpu_hours"], h200["billed_units"], h200["cost"]) == (
            "h200",
            240.0,
            600.0,
            1200.0,
        )
    # a month older than the service keeps in memory: summed from the database alike
    old = await invoice(billing_hub, root, OLD_MONTH)
    assert totals(old) == {"CC-100": (10.0, 20.0, 40.0)}
    status, text = await get(
        billing_hub, TOKENS["billing"], f"api/invoice?month={LAST_MONTH}&format=csv"
    )
    assert status == 200, text
    rows = list(csv.DictReader(io.StringIO(text)))
    by = {(r["account"], r["group"], r["flavor"]): r for r in rows}
    assert set(by) == {
        ("CC-100", "research", "h200"),
        ("CC-100", "nlp", "a100"),
        ("GRANT-7", "vision", "h200"),
        ("", "course", "mig"),
    }
    assert (by["", "course", "mig"]["billed_units"], by["", "course", "mig"]["cost"]) == (
        "0.2500",
        "0.30",
    )
    assert {r["currency"] for r in rows} == {"EUR"}


async def test_members_see_their_own_billed_units_and_cost_but_no_invoice(billing_hub):
    ann = await user_token(billing_hub, "ann")
    status, body = await get(billing_hub, ann, f"api/showback?month={LAST_MONTH}")
    assert status == 200, body
    view = json.loads(body)
    (mine,) = [u for u in view["users"] if u["user"] == "ann"]
    assert (mine["billed_units"], mine["cost"]) == (600.0, 1200.0)
    groups = {g["group"]: g for g in view["groups"]}
    assert groups["research"]["account"] == "CC-100"
    for token in (ann, TOKENS["no-scope"]):
        status, body = await get(billing_hub, token, f"api/invoice?month={LAST_MONTH}")
        assert status == 403
        assert json.loads(body)["message"] == (
            "invoices are for admins: log in as a hub or policy admin, or send a token with "
            "the custom:gpu-usage:read scope"
        )
    status, body = await get(billing_hub, TOKENS["billing"], "api/invoice?month=2026-13")
    assert status == 400
    assert "month: expected YYYY-MM" in json.loads(body)["message"]


async def test_the_printable_invoice_and_the_dashboards_billed_columns_in_chromium(
    billing_hub, browser
):
    root = await user_token(billing_hub, "root")
    await invoice(billing_hub, root, LAST_MONTH)
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await login(page, billing_hub, "olga")  # a member of an admin group
        await page.goto(billing_hub.service_url + f"invoice?month={LAST_MONTH}")
        sections = page.locator("section")
        assert await sections.count() == 3
        first = await sections.nth(0).inner_text()
        assert "Account CC-100" in first
        assert ("H200" in first, "A100" in first) == (True, True)  # the names users see
        total = await sections.nth(0).locator("tr.total").inner_text()
        assert total.split() == ["Total", "260.00", "620.00", "1,230.00", "EUR"]
        assert "Groups without an account" in await sections.nth(2).inner_text()
        await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
        await page.screenshot(path=str(SCREENSHOTS / "invoice.png"), full_page=True)
        # printed: one account a page, without the screen's links
        await page.emulate_media(media="print")
        assert not await page.locator(".screen").is_visible()
        breaks = await sections.evaluate_all("s => s.map(e => getComputedStyle(e).breakAfter)")
        assert breaks == ["page"] * 3
        # the dashboard's showback: each group's account, billed units and cost, and the
        # invoice a click away
        await page.emulate_media(media="screen")
        await page.goto(billing_hub.service_url)

        async def course_billed():
            text = await page.locator("table.showback").inner_text()
            return "course" in text and text

        table = await eventually(course_billed, "this month's showback", within=30)
        for heading in ("Account", "Billed units", "Cost"):
            assert heading in table
        row = await page.locator("table.showback tr", has_text="course").inner_text()
        assert row.split()[-2:] == ["3", "EUR"]  # 2 GPU-hours of an A100 at 1.5
        await page.click("a[href^='invoice?']")
        await page.wait_for_selector("section")
        assert "invoice?month=" in page.url
        # a member has no invoice to read
        member = await browser.new_context()
        try:
            mine = await member.new_page()
            await login(mine, billing_hub, "ann")
            response = await mine.goto(billing_hub.service_url + f"invoice?month={LAST_MONTH}")
            assert response.status == 403
            await mine.goto(billing_hub.service_url)
            await mine.wait_for_selector("text=Showback for")
            assert await mine.locator("a[href^='invoice?']").count() == 0
        finally:
            await member.close()
    finally:
        await context.close()


async def test_a_budget_in_billed_units_stops_and_refuses_with_its_numbers(billing_hub):
    """Metered's budget of 0.006 billed units an hour: an H200 weighs 3 units an hour
    now, so its server uses the budget up in a third of the time its GPU-hours would;
    it is told, stopped after the grace, and a new server is refused with the numbers."""
    mel = await user_token(billing_hub, "mel")
    started = time.monotonic()
    await start_server(billing_hub, "mel", "metered--big")

    async def told():
        status, body = await get(billing_hub, mel, "api/usage")
        assert status == 200, body
        view = json.loads(body)
        texts = [n["text"] for n in view["notices"] if "budget used up" in n["text"]]
        return texts and (texts, view)

    (notice,), view = await eventually(told, "mel to be told the budget is used up", within=60)
    assert re.fullmatch(
        r"GPU budget used up: Metered used 0\.00\d+ of 0\.006 billed units in the last "
        r"hour; mel's server stops at \d{4}-\d\d-\d\d \d\d:\d\d UTC, in 6 seconds: save "
        r"your work",
        notice,
    ), notice
    hours = view["gpu_hours"]["groups"]["metered"]
    assert (hours["unit"], hours["budget"]) == ("billed units", 0.006)
    assert hours["used"] >= 0.006
    # each of its GPU-hours billed 3 units: the H200's weight since the change
    status, body = await get(billing_hub, mel, "api/showback")
    (group,) = [g for g in json.loads(body)["groups"] if g["group"] == "metered"]
    assert group["billed_units"] == pytest.approx(3 * group["gpu_hours"], abs=2e-4)  # rounded

    async def stopped():
        _, model = await asyncio.to_thread(billing_hub.api, "GET", "/users/mel")
        return model["servers"] == {}

    await eventually(stopped, "mel's server to be stopped", within=60)
    assert time.monotonic() - started >= 7.2 + 6  # the budget's time, then the grace
    status, body = await asyncio.to_thread(
        billing_hub.api, "POST", "/users/mel/server", {"profile": "metered--big"}
    )
    assert status == 403, body
    assert re.match(
        r"Metered used 0\.\d+ of 0\.006 billed units in the last hour: GPU servers can "
        r"start again at .*, when [\d.]+ billed units are free again",
        body["message"],
    ), body["message"]
