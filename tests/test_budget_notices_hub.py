"""One notice and one grace per used-up budget, through a real hub, its GPU service and
the local cluster: the service's clock is the machine's, so the budgets are GPU-seconds
and the graces seconds.

A server's stop is watched from the hub: the first moment its server is stopping or
gone must not come before the stop its notice announced (as kept in the usage
database, to the fraction of a second), and comes within a few of the service's
passes after it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from datetime import UTC, datetime

import pytest

from hub_helpers import running_hub
from jupyterhub_gpu.accounting.events import BudgetToldStore, EventStore, ToldRow
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.service.budget_rules import NOT_READ_YET
from kube_helpers import eventually
from test_service_hub import aget, service_pids, start_server, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
SMALL = {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}


def stop_budget(gpu_seconds: float, grace: str) -> dict:
    return {
        "gpu_hours": gpu_seconds / 3600,
        "period": "1h",
        "when_exhausted": "stop",
        "grace": grace,
    }


POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {"small": SMALL},
    "groups": {
        # the group's warn budget is used up first (7.2 s), the member's own stop
        # budget later (21.6 s): its 20 s grace counts from its own notice
        "warned": {
            "display_name": "Warned Lab",
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "budget": {"gpu_hours": 0.002, "period": "1h"},
            "per_user": {"budget": stop_budget(21.6, "20s")},
        },
        # the group's used up at 20 s (stop 18 s later), the member's own at 26 s
        # (stop 8 s later): the member's stop comes first. (A stop budget admits a
        # server only while what is left covers its grace.)
        "twice": {
            "display_name": "Twice Lab",
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "budget": stop_budget(20, "18s"),
            "per_user": {"budget": stop_budget(26, "8s")},
        },
        # used up in 50 s; 45 s of grace, longer than the hub takes to start its
        # service again
        "kept": {
            "display_name": "Kept Lab",
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "per_user": {"budget": stop_budget(50, "45s")},
        },
        # used up in 25 s; 20 s of grace, longer than each life of the service
        "looped": {
            "display_name": "Looped Lab",
            "quota": {"gpus": 2},
            "profiles": ["small"],
            "per_user": {"budget": stop_budget(25, "20s")},
        },
    },
}
#: how long after the announced stop the hub may still show the server running: the
#: service's pass and rule intervals, and the hub's answer
LATE = 15


@pytest.fixture(scope="module")
async def budget_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        users={"wes": ["warned"], "two": ["twice"], "rex": ["kept"], "lou": ["looped"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        extra_config=(
            "c.GPUService.usage_interval = 2\n"
            "c.GPUService.rules_interval = 2\n"
            "c.GPUService.hub_poll_interval = 1\n"
            "c.GPUKubeSpawner.ledger_resync_interval = 3\n"
            # the test's admin token also issues users' own tokens
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        await wait_for_service(hub)
        yield hub


def told_rows(hub, user: str) -> list[ToldRow]:
    store = UsageStore(f"sqlite:///{hub.directory / 'jupyterhub-gpu-usage.sqlite'}")
    try:
        return [r for r in BudgetToldStore(EventStore(store)).read() if r.user == user]
    finally:
        store.dispose()


async def rows_of(hub, user: str) -> list[ToldRow]:
    return await asyncio.to_thread(told_rows, hub, user)


async def notices(hub, user: str) -> list[str]:
    status, _, body = await aget(hub.service_url + "api/usage", await user_token(hub, user))
    assert status == 200, body
    return [n["text"] for n in json.loads(body)["notices"]]


async def stopped_at(hub, user: str, within: float) -> float:
    """When the hub first shows the user's server stopping or gone (polled 4 times a second)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        _, model = await asyncio.to_thread(hub.api, "GET", f"/users/{user}")
        server = model["servers"].get("")
        if server is None or server.get("pending") == "stop":
            return time.time()
        await asyncio.sleep(0.25)
    raise AssertionError(f"{user}'s server was not stopped within {within} s")


def clock_of(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


async def test_a_warn_budget_used_up_first_does_not_shorten_the_members_stop_grace(budget_hub):
    await start_server(budget_hub, "wes", "warned--small")

    async def warned():
        rows = await rows_of(budget_hub, "wes")
        return [r for r in rows if r.told.key == ("warned", "")] or None

    (warn,) = await eventually(warned, "wes to be told of the group's warn budget", within=60)
    assert warn.told.stop_at is None

    async def own():
        rows = await rows_of(budget_hub, "wes")
        return [r for r in rows if r.told.key == ("warned", "wes")] or None

    (stop,) = await eventually(own, "wes to be told of the member's stop budget", within=60)
    stop_at = stop.told.stop_at
    assert stop_at == pytest.approx(stop.told.at + 20)
    # the old rule stopped at once here: the warn notice had started the grace
    _, model = await asyncio.to_thread(budget_hub.api, "GET", "/users/wes")
    assert model["servers"][""]["ready"], "stopped at the stop budget's notice"
    when = await stopped_at(budget_hub, "wes", within=60)
    assert stop_at <= when <= stop_at + LATE, (when - stop_at, clock_of(stop_at))
    texts = await notices(budget_hub, "wes")
    assert [t for t in texts if t.startswith("GPU budget used up")] == [
        next(t for t in texts if t.startswith("GPU budget used up: Warned Lab used")),
        next(t for t in texts if t.startswith("GPU budget used up: wes in Warned Lab used")),
    ]
    (told,) = [t for t in texts if t.startswith("GPU budget used up: wes in Warned Lab")]
    assert told.endswith(
        f"wes's server stops at {clock_of(stop_at)}, in 20 seconds: save your work"
    ), told
    (group,) = [t for t in texts if t.startswith("GPU budget used up: Warned Lab")]
    assert group.endswith(
        "new GPU servers are refused until some of it is free again; wes's server keeps running"
    )
    (stopping,) = [t for t in texts if t.startswith("Stopping wes's server")]
    assert stopping.startswith("Stopping wes's server: wes in Warned Lab used 0.0")


async def test_two_stop_budgets_stop_at_the_earliest_announced_time_never_earlier(budget_hub):
    await start_server(budget_hub, "two", "twice--small")

    async def both():
        rows = {r.told.key: r.told for r in await rows_of(budget_hub, "two")}
        return len(rows) == 2 and rows

    told = await eventually(both, "two to be told of both budgets", within=60)
    group, own = told[("twice", "")], told[("twice", "two")]
    assert group.stop_at == pytest.approx(group.at + 18)
    assert own.stop_at == pytest.approx(own.at + 8)
    assert own.stop_at < group.stop_at
    when = await stopped_at(budget_hub, "two", within=60)
    assert own.stop_at <= when <= own.stop_at + LATE, when - own.stop_at
    texts = await notices(budget_hub, "two")
    assert any(
        t.startswith("GPU budget used up: Twice Lab used")
        and t.endswith(
            f"two's server stops at {clock_of(group.stop_at)}, in 18 seconds: save your work"
        )
        for t in texts
    ), texts
    assert any(
        t.startswith("GPU budget used up: two in Twice Lab used")
        and f"two's server stops at {clock_of(own.stop_at)}, in 8 seconds" in t
        for t in texts
    ), texts


async def restart_service(hub) -> None:
    (pid,) = service_pids(hub)
    os.kill(pid, signal.SIGKILL)

    async def gone():
        return pid not in service_pids(hub)

    await eventually(gone, "the service to be gone", within=10, interval=0.1)
    await wait_for_service(hub)


async def test_a_service_restart_during_the_grace_neither_tells_again_nor_gives_a_new_grace(
    budget_hub,
):
    await start_server(budget_hub, "rex", "kept--small")

    async def told():
        return await rows_of(budget_hub, "rex") or None

    (before,) = await eventually(told, "rex to be told", within=90)
    stop_at = before.told.stop_at
    assert stop_at == pytest.approx(before.told.at + 45)
    await restart_service(budget_hub)
    back = time.time()
    assert back < stop_at - 5, "the service took longer to start again than the grace"
    await asyncio.sleep(4)  # two of the restarted service's passes
    assert await rows_of(budget_hub, "rex") == [before]
    when = await stopped_at(budget_hub, "rex", within=90)
    assert stop_at <= when <= stop_at + LATE, when - stop_at
    texts = await notices(budget_hub, "rex")
    assert not [t for t in texts if t.startswith("GPU budget used up")], texts


async def budget_pass_made(hub, token: str) -> bool:
    """Whether this life of the service has made a budget pass on read GPU-hours."""
    status, _, body = await aget(hub.service_url + "api/usage", token)
    if status != 200:
        return False
    task = {t["name"]: t for t in json.loads(body)["tasks"]}.get("GPU budgets", {})
    return bool(task.get("ok")) and task.get("last_result") != NOT_READ_YET


async def test_a_service_killed_in_a_loop_still_stops_the_server_at_the_announced_time(
    budget_hub,
):
    await start_server(budget_hub, "lou", "looped--small")
    root = await user_token(budget_hub, "root")

    async def told():
        return await rows_of(budget_hub, "lou") or None

    (before,) = await eventually(told, "lou to be told", within=60)
    stop_at = before.told.stop_at
    stopping = asyncio.create_task(stopped_at(budget_hub, "lou", within=300))
    # killed a few seconds after each life's first budget pass, until the server stops:
    # the old rule told each life anew with a fresh 20 s grace and never stopped anyone
    killed: list[float] = []
    lives: list[tuple[float, float]] = []  # (answering since, first budget pass made by)
    while not stopping.done():
        killed.append(time.time())
        await restart_service(budget_hub)
        up = time.time()

        async def acted(token=root):
            return stopping.done() or await budget_pass_made(budget_hub, token)

        await eventually(acted, "the service's first budget pass", within=60, interval=0.25)
        lives.append((up, time.time()))
        await asyncio.wait({stopping}, timeout=3)
        # the same notice and stop, or none once the pod is gone (and when the stop was
        # said, once)
        now = [(r.told.key, r.told.at, r.told.stop_at) for r in await rows_of(budget_hub, "lou")]
        assert now in ([(before.told.key, before.told.at, stop_at)], []), (now, before)
    when = stopping.result()
    assert killed[0] < stop_at, "not killed during the grace"
    assert stop_at <= when, (when - stop_at, killed)
    # a life that began after the announced time stops the server at its first budget
    # pass (the hub starts its service again when it next polls it, LocalProcessSpawner's
    # poll_interval of 30 s, so how many lives that takes depends on the machine)
    after = [made for began, made in lives if began >= stop_at]
    if after:
        assert when <= after[0] + LATE, (when - after[0], lives, killed)
