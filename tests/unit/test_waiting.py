"""when_full: wait — a per-group first-come-first-served line, shown in progress.

In-process spawners share one ledger (an empty cluster, no Kubernetes calls):
the admission and waiting code is the spawner's own.
"""

from __future__ import annotations

import asyncio

import pytest
from traitlets.config import Config

from jupyterhub_gpu.hub.admission import SpawnAdmission
from jupyterhub_gpu.hub.offline import offline_spawner
from jupyterhub_gpu.hub.spawner import GPUKubeSpawner, SpawnRefused
from kube_helpers import eventually

#: the hub's one admission, which every spawner of a test shares (an empty cluster)
ADMISSION: SpawnAdmission


@pytest.fixture
def config():
    global ADMISSION
    ADMISSION = SpawnAdmission.empty_cluster()
    c = Config()
    c.GPUPolicy.update(
        {
            "when_full": "wait",
            "flavors": {"g": {"kind": "gpu"}},
            "profiles": {"p": {"gpu": {"flavor": "g"}}},
            "groups": {"lab": {"display_name": "Lab", "quota": {"gpus": 1}, "profiles": ["p"]}},
        }
    )
    c.GPUKubeSpawner.wait_poll_interval = 0.05
    return c


def spawner(config, user: str) -> GPUKubeSpawner:
    s = offline_spawner(config, user, ["lab"], ADMISSION)
    s.user_options = {"profile": "lab--p"}
    return s


async def test_full_group_queues_in_order_and_admits_when_a_server_stops(config):
    first, second, third = (spawner(config, u) for u in ("ann", "bob", "cy"))
    await first.load_user_options()
    waiting_second = asyncio.create_task(second.load_user_options())
    await eventually(lambda: _message(second), "bob to be in line", within=5)
    waiting_third = asyncio.create_task(third.load_user_options())
    await eventually(lambda: _message(third), "cy to be in line", within=5)
    then = "The server starts by itself as soon as there is room; stop it to give up."
    assert second._gpu_wait_message == (
        "Waiting for Lab: position 1 of 2: Lab already uses 1 of its 1 GPU, and this server "
        f"needs 1. {then}"
    )
    assert third._gpu_wait_message == (
        f"Waiting for Lab: position 2 of 2, 1 spawn ahead of you. {then}"
    )
    progress = second.progress()
    assert (await progress.__anext__())["message"] == second._gpu_wait_message
    await progress.aclose()

    await first._release()  # ann's server stops
    await asyncio.wait_for(waiting_second, 5)  # bob, first in line, gets the GPU
    assert not waiting_third.done()  # cy still waits: one GPU

    async def cy_first():
        return (third._gpu_wait_message or "").startswith("Waiting for Lab: position 1 of 1")

    await eventually(cy_first, "cy to move up to position 1", within=5)
    await second._release()
    await asyncio.wait_for(waiting_third, 5)
    assert ADMISSION.ledger.usage("lab").gpus == 1


async def test_a_cancelled_wait_leaves_the_line(config):
    first, second = spawner(config, "ann"), spawner(config, "bob")
    await first.load_user_options()
    waiting = asyncio.create_task(second.load_user_options())
    await eventually(lambda: _message(second), "bob to be in line", within=5)
    waiting.cancel()  # the user stops the pending spawn
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert list(ADMISSION.waiting["lab"]) == []
    assert second._gpu_wait_message is None


async def test_a_profile_larger_than_the_group_is_never_offered_so_never_queued(config):
    config.GPUPolicy.profiles = {"p": {"gpu": {"flavor": "g", "count": 2}}}
    GPUKubeSpawner._policies.clear()
    with pytest.raises(SpawnRefused, match="you are not offered any server"):
        await spawner(config, "ann").load_user_options()
    assert ADMISSION.waiting.get("lab", []) == []


async def _message(s: GPUKubeSpawner) -> str | None:
    return s._gpu_wait_message
