"""Fair share through a real hub: whoever used less GPU time recently starts first.

GPU histories are rows in the usage database the hub reads, as a week of real use
would leave them; the servers are real pods on the local cluster.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from test_gpu_time import A100, running, stopped, store_for

from hub_helpers import api, progress_messages
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

HOUR = 3600.0


def fair_policy(groups: dict) -> dict:
    return {
        "when_full": "wait",
        "fair_share": {"half_life": "1d", "max_wait": "1h"},
        "flavors": {"a100": {"kind": "gpu", "display_name": "A100", "node_selector": A100}},
        "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "a100"}}},
        "groups": groups,
    }


def used(store: UsageStore, user: str, group: str, gpu_hours: float, flavor: str = "a100") -> None:
    """``user`` held a GPU of ``flavor`` in ``group`` for ``gpu_hours``, ending an hour
    ago."""
    ended = time.time() - HOUR
    store.open(
        [
            UsageRecord(
                uid=f"history-{user}-{group}",
                key=f"elsewhere/jupyter-{user}",
                user=user,
                group=group,
                profile="gpu",
                flavor=flavor,
                gpus=1.0,
                started=ended - gpu_hours * HOUR,
                last_seen=ended,
                ended=ended,
            )
        ]
    )


async def lab_hub(hub_factory, config: str, fair_share=None, flavors=None):
    """A hub whose Lab (ann, bob, cy) has one GPU and waits with fair share (its
    settings and the flavors updated with ``fair_share`` and ``flavors``)."""
    policy = fair_policy(
        {"lab": {"display_name": "Lab", "quota": {"gpus": 1}, "profiles": ["gpu"]}}
    )
    policy["fair_share"].update(fair_share or {})
    policy["flavors"].update(flavors or {})
    return await hub_factory(
        policy=policy,
        users={"ann": ["lab"], "bob": ["lab"], "cy": ["lab"]},
        extra_config=config + "c.GPUKubeSpawner.wait_poll_interval = 0.5\n",
    )


async def says(hub, user: str, text: str) -> list[str]:
    """The spawn page's progress for ``user``, read until a message contains ``text``."""
    await eventually(lambda: pending(hub, user), f"{user}'s spawn to be pending", within=30)
    return await asyncio.to_thread(progress_messages, hub, user, text, 60)


async def pending(hub, user: str) -> bool:
    _, model = await api(hub, "GET", f"/users/{user}")
    server = model["servers"].get("")
    return server is not None and server["pending"] == "spawn" and not server["ready"]


async def first_of_two(hub, holder: str, heavy: str, light: str, group: str, why: str) -> None:
    """``holder`` holds the one GPU; ``heavy`` asks, then ``light``; when ``holder``
    stops, ``light`` starts and ``heavy`` still waits, then starts after ``light``."""
    status, body = await api(
        hub, "POST", f"/users/{holder}/server", {"profile": f"{group[0]}--gpu"}
    )
    assert status in (201, 202), body
    await running(hub, holder)
    heavy_asks = asyncio.create_task(
        api(hub, "POST", f"/users/{heavy}/server", {"profile": f"{group[1]}--gpu"})
    )
    await says(hub, heavy, "position 1 of 1")
    light_asks = asyncio.create_task(
        api(hub, "POST", f"/users/{light}/server", {"profile": f"{group[2]}--gpu"})
    )
    messages = await says(hub, light, "position 1 of 2")
    assert why in messages[-1], messages
    await stopped(hub, holder)
    await running(hub, light)  # asked second, started first
    assert await pending(hub, heavy)
    await stopped(hub, light)
    await running(hub, heavy)
    await stopped(hub, heavy)
    for asked in (heavy_asks, light_asks):
        status, body = await asked
        assert status in (201, 202), body


async def test_the_member_who_used_less_starts_first_and_a_restart_keeps_the_order(
    hub_factory, core, tmp_path
):
    store, config = store_for(tmp_path)
    used(store, "bob", "lab", 6)  # bob held a GPU six hours yesterday; cy one
    used(store, "cy", "lab", 1)
    hub = await lab_hub(hub_factory, config)
    why = (
        "Waiting for Lab: position 1 of 2: you used less GPU time recently than others "
        "waiting; Lab already uses 1 of its 1 GPU, and this server needs 1. The server starts "
        "by itself as soon as there is room; stop it to give up."
    )
    await first_of_two(hub, "ann", "bob", "cy", ("lab", "lab", "lab"), why)
    # the standings are the usage database's: a new hub process orders them the same
    await asyncio.to_thread(hub.restart)
    await first_of_two(hub, "ann", "bob", "cy", ("lab", "lab", "lab"), why)


async def test_a_sibling_group_that_used_less_starts_first_under_a_full_parent(
    hub_factory, core, tmp_path
):
    store, config = store_for(tmp_path)
    used(store, "ann", "nlp", 8)  # nlp used far more than cv
    used(store, "eve", "cv", 1)
    policy = fair_policy(
        {
            "research": {"display_name": "Research", "quota": {"gpus": 1}},
            "nlp": {"parent": "research", "quota": {"gpus": 1}, "profiles": ["gpu"]},
            "cv": {"parent": "research", "quota": {"gpus": 1}, "profiles": ["gpu"]},
        }
    )
    hub = await hub_factory(
        policy=policy,
        users={"ann": ["nlp"], "dee": ["nlp"], "eve": ["cv"]},
        extra_config=config + "c.GPUKubeSpawner.wait_poll_interval = 0.5\n",
    )
    await first_of_two(
        hub,
        "ann",
        "dee",
        "eve",
        ("nlp", "nlp", "cv"),
        "you used less GPU time recently than others waiting; Research already uses 1 of its 1",
    )


async def test_counting_billed_units_who_used_a_heavier_flavor_waits_behind_more_gpu_hours(
    hub_factory, core, tmp_path
):
    """``fair_share.count: billed_units``: bob's 2 GPU-hours on an H200 weighted 4 (8
    billed units) weigh more than cy's 4 GPU-hours on the A100 (4): cy starts first,
    though bob used half her GPU-hours and asked first."""
    store, config = store_for(tmp_path)
    used(store, "bob", "lab", 2, flavor="h200")
    used(store, "cy", "lab", 4)
    hub = await lab_hub(
        hub_factory,
        config,
        {"count": "billed_units"},
        # the H200s' hours are history only: no server here asks for one
        {"h200": {"kind": "gpu", "billing": {"weight": 4}}},
    )
    why = (
        "Waiting for Lab: position 1 of 2: you used fewer billed units recently than others "
        "waiting; Lab already uses 1 of its 1 GPU"
    )
    await first_of_two(hub, "ann", "bob", "cy", ("lab", "lab", "lab"), why)
