"""The first rebuild of the ledger after a hub start, under concurrent spawns.

A storm of spawns right after a hub (re)start all need the ledger before they
can be admitted or refused. They must share one rebuild and all go on the moment
it ends. Behind an asyncio.Lock they went on one event-loop turn at a time, and
on a busy hub that queued ~50 spawns for 10 s (docs/benchmarks.md). The pod listing
is held open here by a stand-in so the waiting is deterministic; the listing
itself runs against the real cluster in the hub restart and resync tests.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from traitlets.config import Config

from jupyterhub_gpu.hub.admission import SpawnAdmission
from jupyterhub_gpu.hub.offline import offline_spawner
from jupyterhub_gpu.hub.spawner import GPUKubeSpawner, SpawnRefused

#: the admission every spawner of a test shares, as a hub's spawners do
ADMISSION: SpawnAdmission


@pytest.fixture
def config():
    c = Config()
    c.GPUPolicy.update(
        {
            "flavors": {"g": {"kind": "gpu"}},
            "profiles": {"p": {"gpu": {"flavor": "g"}}},
            "groups": {"lab": {"quota": {"gpus": 10}, "profiles": ["p"]}},
        }
    )
    c.GPUKubeSpawner.ledger_resync_interval = 0
    global ADMISSION
    ADMISSION = SpawnAdmission()  # the hub's one admission, just started: nothing loaded yet
    return c


class HeldListing:
    """Stands in for the pod listing: counts calls, returns no pods when released."""

    def __init__(self, fail_first: bool = False) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.fail_first = fail_first

    async def __call__(self, policy):  # set on the class: not bound to a spawner
        self.calls += 1
        await self.release.wait()
        if self.fail_first and self.calls == 1:
            raise aiohttp.ClientConnectionError("connection refused")
        return []


async def spawn(config, user: str) -> str:
    spawner = offline_spawner(config, user, ["lab"], ADMISSION)
    spawner.user_options = {"profile": "lab--p"}
    try:
        await spawner.load_user_options()
    except SpawnRefused as e:
        return str(e)
    return "admitted"


async def test_spawns_after_a_hub_start_share_one_rebuild_and_go_on_together(config, monkeypatch):
    listing = HeldListing()
    monkeypatch.setattr(GPUKubeSpawner, "_charges_from_pods", listing)
    spawns = [asyncio.create_task(spawn(config, f"u{i:02d}")) for i in range(50)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert listing.calls == 1
    assert not any(s.done() for s in spawns)

    listing.release.set()
    # a few turns of the loop for the rebuild to finish and wake every waiter:
    # behind a lock, the 50th would need 50 turns
    for _ in range(8):
        await asyncio.sleep(0)
    assert all(s.done() for s in spawns)
    outcomes = [s.result() for s in spawns]
    assert outcomes.count("admitted") == 10
    assert set(outcomes) - {"admitted"} == {
        "lab already uses 10 of its 10 GPUs, and this server needs 1: try again when one of "
        "its servers stops"
    }
    assert listing.calls == 1


async def test_a_failed_rebuild_answers_every_waiting_spawn_and_the_next_one_retries(
    config, monkeypatch
):
    listing = HeldListing(fail_first=True)
    monkeypatch.setattr(GPUKubeSpawner, "_charges_from_pods", listing)
    waiting = [asyncio.create_task(spawn(config, f"u{i}")) for i in range(3)]
    for _ in range(20):  # all three waiting for the held rebuild
        await asyncio.sleep(0)
    listing.release.set()
    answers = await asyncio.gather(*waiting)
    assert all("could not be reached" in answer for answer in answers), answers
    assert listing.calls == 1

    assert await spawn(config, "later") == "admitted"
    assert listing.calls == 2


async def test_the_rebuild_begins_when_the_hub_makes_its_first_gpu_spawner(config, monkeypatch):
    listing = HeldListing()
    monkeypatch.setattr(GPUKubeSpawner, "_charges_from_pods", listing)
    # as the hub does at start, or at ann's first request
    offline_spawner(config, "ann", ["lab"], ADMISSION)
    offline_spawner(config, "bob", ["lab"], ADMISSION)
    await asyncio.sleep(0)
    assert listing.calls == 1  # under way before any spawn reached start(), and only once
    listing.release.set()
    await asyncio.sleep(0)
    assert await spawn(config, "ann") == "admitted"
    assert listing.calls == 1
