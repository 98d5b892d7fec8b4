"""A usage database outage through a real hub, service and cluster: while PostgreSQL
is stopped (or the sqlite file cannot be written), servers start, stop and are
evicted; once it is back every row matches its pod's real lifetime within one usage
interval, and meanwhile GPU spawns of groups with a budget are refused."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hub_helpers import api, stop_hub
from jupyterhub_gpu.accounting.store import UsageStore
from kube_helpers import eventually
from test_service_hub import aget, start_server, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

BUDGETS_UNCHECKED = (
    "GPU-hour budgets cannot be checked now, as the usage database is unavailable, so "
    "GPU servers of groups with a budget cannot start: try again in a few minutes, or "
    "start one without GPUs"
)

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
POLICY = {
    "flavors": {"a100": {"kind": "gpu", "display_name": "A100", "node_selector": A100}},
    "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "a100"}}},
    "groups": {
        "lab": {
            "display_name": "Lab",
            "quota": {"gpus": 4},
            "profiles": ["gpu"],
            "budget": {"gpu_hours": 100, "period": "30d"},
        },
        "open": {"display_name": "Open", "quota": {"gpus": 4}, "profiles": ["gpu"]},
    },
}
USERS = {"ann": ["lab"], "bob": ["lab"], "cid": ["open"], "dan": ["open"], "eve": ["open"]}
#: the service's usage interval and the hub's ledger resync
INTERVAL = 2
#: how far a recorded end may be from the real one: one interval, and a second of slack
#: for the moments the test takes
TOLERANCE = INTERVAL + 1
CONFIG = (
    f"c.GPUService.usage_interval = {INTERVAL}\n"
    f"c.GPUKubeSpawner.ledger_resync_interval = {INTERVAL}\n"
    "c.GPUService.hub_poll_interval = 1\n"
    "c.Spawner.poll_interval = 1\n"
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    '"services": ["demo-admin"]})\n'
)


async def pod_of(core, hub, user: str):
    pods = await core.list_namespaced_pod(
        hub.namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    (pod,) = pods.items
    return pod


async def start(core, hub, user: str, profile: str, lifetimes: dict) -> None:
    await start_server(hub, user, profile)
    pod = await pod_of(core, hub, user)
    lifetimes[user] = {"uid": pod.metadata.uid, "started": pod.status.start_time.timestamp()}


async def stop(core, hub, user: str, lifetimes: dict) -> None:
    """Through the hub: the real end lies between the request and the pod's going."""
    before = time.time()
    status, body = await api(hub, "DELETE", f"/users/{user}/server")
    assert status in (202, 204), body

    async def gone():
        pods = await core.list_namespaced_pod(
            hub.namespace, label_selector=f"hub.jupyter.org/username={user}"
        )
        _, model = await api(hub, "GET", f"/users/{user}")
        return not pods.items and model["servers"] == {}

    await eventually(gone, f"{user}'s server to stop", within=60, interval=0.1)
    lifetimes[user]["ended"] = (before, time.time())


async def evict(core, hub, user: str, lifetimes: dict) -> None:
    """The pod deleted directly (an eviction, an admin's kubectl): the hub never stopped it."""
    pod = await pod_of(core, hub, user)
    before = time.time()
    await core.delete_namespaced_pod(pod.metadata.name, hub.namespace, grace_period_seconds=0)
    lifetimes[user]["ended"] = (before, time.time())


async def outage_loses_no_gpu_time(
    hub, core, store: UsageStore, down: Callable[[], None], up: Callable[[], None]
) -> None:
    await wait_for_service(hub)
    root = await user_token(hub, "root")
    lifetimes: dict[str, dict] = {}
    await start(core, hub, "ann", "lab--gpu", lifetimes)
    await start(core, hub, "cid", "open--gpu", lifetimes)

    async def written(*users: str):
        found = {r.uid for r in await asyncio.to_thread(store.overlapping, 0, 1e12)}
        return all(lifetimes[u]["uid"] in found for u in users)

    await eventually(lambda: written("ann", "cid"), "ann's and cid's rows", within=30)

    await asyncio.to_thread(down)
    try:
        # meanwhile: a server stopped through the hub, servers started, stopped and
        # evicted, and one started before the outage evicted during it
        await start(core, hub, "dan", "open--gpu", lifetimes)
        await start(core, hub, "eve", "open--gpu", lifetimes)
        # a GPU spawn of a group with a budget is refused: the hub could not write
        status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--gpu"})
        assert (status, body.get("message")) == (403, BUDGETS_UNCHECKED), body

        async def behind():
            view, _ = await usage(hub, root)
            return view["gpu_hours"]["accounting"]["ok"] is False

        await eventually(behind, "the service to say the accounting is behind", within=20)
        await asyncio.sleep(INTERVAL + 1)
        await stop(core, hub, "ann", lifetimes)
        await stop(core, hub, "dan", lifetimes)
        await evict(core, hub, "cid", lifetimes)
        await evict(core, hub, "eve", lifetimes)
        # the hub and the service notice the evictions while the database is down
        await asyncio.sleep(3 * INTERVAL)
        # the dashboard and the metrics say how far behind the accounting is
        view, _ = await usage(hub, root)
        accounting = view["gpu_hours"]["accounting"]
        assert accounting["behind"] is True
        assert accounting["unwritten"] >= 1
        assert accounting["oldest_unwritten_age_seconds"] > 0
        status, _, page = await aget(hub.service_url, root)
        assert "GPU-hour accounting is behind" in page
        status, _, metrics = await aget(hub.service_url + "metrics", hub.api_token)
        assert "jupyterhub_gpu_accounting_up 0.0" in metrics.splitlines()
        # the hub's own side, which JupyterHubGPUUsageDatabaseDown reads as the hub's
        status, hub_metrics = await asyncio.to_thread(hub.request, "GET", "/hub/metrics")
        assert status == 200, hub_metrics
        assert "jupyterhub_gpu_hub_accounting_up 0.0" in str(hub_metrics).splitlines()
    finally:
        await asyncio.to_thread(up)

    async def all_ended():
        rows = {r.uid: r for r in await asyncio.to_thread(store.overlapping, 0, 1e12)}
        found = {u: rows.get(lifetime["uid"]) for u, lifetime in lifetimes.items()}
        return all(r is not None and r.ended is not None for r in found.values()) and found

    rows = await eventually(all_ended, "every server's row to be written and ended", within=60)
    for user, lifetime in lifetimes.items():
        row = rows[user]
        first, last = lifetime["ended"]
        assert row.started == lifetime["started"], (user, row)
        assert first - TOLERANCE <= row.ended <= last + TOLERANCE, (user, row.ended, first, last)
        assert (row.user, row.group, row.gpus) == (user, USERS[user][0], 1.0)

    # the hub reads again: budgets are checked, and the GPU spawn is admitted
    async def admitted():
        status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--gpu"})
        assert status in (201, 202, 403), body
        return status != 403

    await eventually(admitted, "the hub to admit GPU spawns again", within=30)

    async def caught_up():
        view, _ = await usage(hub, root)
        accounting = view["gpu_hours"]["accounting"]
        return accounting["ok"] and not accounting["behind"]

    await eventually(caught_up, "the service to have caught up", within=20)
    status, _, metrics = await aget(hub.service_url + "metrics", hub.api_token)
    assert "jupyterhub_gpu_accounting_up 1.0" in metrics.splitlines()
    # and the hub's own side, on the hub's /hub/metrics
    status, hub_metrics = await asyncio.to_thread(hub.request, "GET", "/hub/metrics")
    assert status == 200, hub_metrics
    assert "jupyterhub_gpu_hub_accounting_up 1.0" in str(hub_metrics).splitlines()
    assert "jupyterhub_gpu_accounting_unwritten_servers 0.0" in metrics.splitlines()


async def test_a_postgresql_outage_loses_no_gpu_time_and_refuses_budgeted_gpu_spawns(
    hub_factory, core
):
    from jupyterhub_gpu_dev.postgres import postgres_server

    with postgres_server("usage") as postgres:
        store = UsageStore(postgres.url)
        hub = await hub_factory(
            policy=POLICY,
            users={**USERS, "root": []},
            admin_users=("root",),
            gpu_service=True,
            extra_config=f"c.GPUPolicy.accounting_url = {postgres.url!r}\n" + CONFIG,
        )
        try:
            await outage_loses_no_gpu_time(hub, core, store, postgres.stop, postgres.start)
        finally:
            store.dispose()
            # the hub's servers, the hub and its service go before the database does
            await stop_hub(hub, core)


def immutable(paths: list[Path], on: bool) -> None:
    """``chattr +i``: not even root may write the files (sqlite then says "attempt to
    write a readonly database" or "disk I/O error"); reads still work."""
    subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], check=True)


async def test_a_sqlite_file_that_cannot_be_written_loses_no_gpu_time(hub_factory, core, tmp_path):
    probe = tmp_path / "probe"
    probe.write_text("")
    try:
        immutable([probe], True)
        immutable([probe], False)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("chattr +i is not possible here (needs root on ext4 or alike)")
    hub = await hub_factory(
        policy=POLICY,
        users={**USERS, "root": []},
        admin_users=("root",),
        gpu_service=True,
        extra_config=CONFIG,
    )
    database = hub.directory / "jupyterhub-gpu-usage.sqlite"
    store = UsageStore(f"sqlite:///{database}")
    # the database and its write-ahead log; the shared-memory index stays writable
    # (sqlite maps it: a read-only one would crash the processes, not refuse writes)
    files = [database, Path(f"{database}-wal")]
    try:
        await outage_loses_no_gpu_time(
            hub, core, store, lambda: immutable(files, True), lambda: immutable(files, False)
        )
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            immutable(files, False)
        store.dispose()
