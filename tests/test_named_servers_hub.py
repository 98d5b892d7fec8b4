"""Named servers (``allow_named_servers``) under the policy, through a real hub.

A member's every server counts against their caps and their group's, a hub restart
(servers kept, as z2jh keeps them) counts them again from their pods, and the
service's rules stop the named server they judge, naming it, and no other.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from hub_helpers import api
from kube_helpers import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200", "node_selector": H200}},
    "profiles": {
        "gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {
        "lab": {"quota": {"gpus": 3}, "per_user": {"servers": 2}, "profiles": ["gpu"]},
        "brief": {"quota": {"gpus": 1}, "max_runtime": "20s", "profiles": ["gpu"]},
        # 7.2 GPU-seconds an hour, then 6 s of grace
        "short": {
            "quota": {"gpus": 1},
            "budget": {"gpu_hours": 0.002, "period": "1h", "when_exhausted": "stop", "grace": "6s"},
            "profiles": ["gpu"],
        },
    },
}
NAMED = (
    "c.JupyterHub.allow_named_servers = True\n"
    # servers outlive a hub restart, as in z2jh
    "c.JupyterHub.cleanup_servers = False\n"
)


def path(user: str, name: str) -> str:
    return f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"


async def state(hub, user: str, name: str) -> str:
    _, model = await api(hub, "GET", f"/users/{user}")
    server = model["servers"].get(name)
    if server is None:
        return "none"
    return "running" if server["ready"] else server["pending"] or "?"


async def becomes(hub, user: str, name: str, wanted: str, within: float = 120) -> None:
    async def there():
        return await state(hub, user, name) == wanted

    await eventually(there, f"{user}'s server {name!r} to be {wanted}", within=within)


async def start(hub, user: str, name: str, profile: str) -> None:
    status, body = await api(hub, "POST", path(user, name), {"profile": profile})
    assert status in (201, 202), body
    await becomes(hub, user, name, "running")


async def pods(core, hub) -> dict[str, tuple[str, str]]:
    """Each pod: (its server's name, as the hub's annotation says; its group label)."""
    found = (await core.list_namespaced_pod(hub.namespace)).items
    return {
        p.metadata.name: (
            p.metadata.annotations.get("hub.jupyter.org/servername", ""),
            p.metadata.labels.get("gpu.jupyterhub.org/group"),
        )
        for p in found
        if p.metadata.deletion_timestamp is None
    }


async def test_every_server_of_a_member_counts_against_their_caps_across_a_restart(
    hub_factory, core
):
    hub = await hub_factory(policy=POLICY, users={"ann": ["lab"]}, extra_config=NAMED)
    await start(hub, "ann", "", "lab--gpu")
    await start(hub, "ann", "train", "lab--gpu")
    assert await pods(core, hub) == {
        "jupyter-ann": ("", "lab"),
        "jupyter-ann--train": ("train", "lab"),
    }
    refusal = "you already run 2 of the 2 servers lab allows each member: stop one of them first"
    status, body = await api(hub, "POST", path("ann", "third"), {"profile": "lab--gpu"})
    assert (status, body["message"]) == (403, refusal)
    # the hub's count is rebuilt from the pods: both named and default still count
    await asyncio.to_thread(hub.restart)
    assert await state(hub, "ann", "train") == "running"
    status, body = await api(hub, "POST", path("ann", "third"), {"profile": "lab--gpu"})
    assert (status, body["message"]) == (403, refusal)
    assert len(await pods(core, hub)) == 2  # no pod was created for the refused ones
    # stopping the named server frees its place for another
    status, body = await api(hub, "DELETE", path("ann", "train"))
    assert status in (202, 204), body
    await becomes(hub, "ann", "train", "none")
    await start(hub, "ann", "third", "lab--gpu")
    assert set(await pods(core, hub)) == {"jupyter-ann", "jupyter-ann--third"}


async def test_the_services_rules_stop_the_named_server_they_judge_naming_it(hub_factory, core):
    hub = await hub_factory(
        policy=POLICY,
        users={"carl": ["brief"], "dee": ["short"]},
        gpu_service=True,
        extra_config=NAMED + "c.GPUService.rules_interval = 2\nc.GPUService.usage_interval = 2\n",
    )
    await start(hub, "carl", "", "everyone--cpu")  # no max_runtime for everyone
    await start(hub, "carl", "course", "brief--gpu")
    # 20 s max_runtime, rules every 2 s, plus the stop itself
    await becomes(hub, "carl", "course", "none", within=120)
    assert await state(hub, "carl", "") == "running"  # carl's other server is untouched
    log = hub.log_path.read_text(errors="replace")
    assert re.search(
        r"Stopping carl/course's server in brief: it has run for 20 seconds, the longest brief "
        r"allows",
        log,
    ), log[-3000:]
    assert "Stopping carl's server" not in log
    # a used-up budget: the notice and the stop name the server too
    await start(hub, "dee", "", "everyone--cpu")
    await start(hub, "dee", "exp", "short--gpu")
    await becomes(hub, "dee", "exp", "none", within=120)
    assert await state(hub, "dee", "") == "running"
    log = hub.log_path.read_text(errors="replace")
    assert re.search(r"GPU budget used up: .*; dee/exp's server stops at", log), log[-3000:]
    assert "Stopping dee/exp's server: short used" in log, log[-3000:]
