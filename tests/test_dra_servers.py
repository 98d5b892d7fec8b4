"""Servers on DRA devices through a real hub and its GPU service: charged what their
claims were allocated, judged idle by the DCGM series of the devices they hold, and
their devices named on the dashboard.

The session's cluster has a DRA node (the default pools' h200-dra: GPU 0 as two
3g.71gb MIG partitions, GPUs 1-3 whole). The simulated DCGM exporter reports its
devices as dcgm-exporter does with its DRA mapping on, and Prometheus scrapes it
every second. Group ``lab`` reclaims GPUs idle for 20 s (below 5%), with a 10 s
notice.

Users: kim (a whole H200, 0%), lee (a 3g.71gb MIG partition, 0%: admitted and
charged at the 3/7 its selector requires and it was allocated), max (a whole H200
at 90% that the exporter reports without his pod's labels, as an exporter without
its DRA mapping would: unknown, never stopped).
"""

from __future__ import annotations

import asyncio
import re
import time
from fractions import Fraction

import pytest
from test_idle_reclaim import CONFIG, notice_about, notices, running, settings

from hub_helpers import running_hub
from jupyterhub_gpu.accounting.store import UsageStore
from kube_helpers import eventually
from test_service_hub import start_server, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

PRODUCT = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"
POLICY = {
    "flavors": {
        "h200": {"kind": "dra", "display_name": "H200 via DRA", "selectors": [PRODUCT]},
        # no gpu_equivalents: admitted at the 3g profile its selector requires (3/7),
        # charged what it holds (the same)
        "mig": {
            "kind": "dra",
            "display_name": "H200 MIG 3g via DRA",
            "device_class": "mig.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].profile == '3g.71gb'"],
        },
    },
    "profiles": {
        "whole": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "mig": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "mig"}},
    },
    "groups": {
        "lab": {
            "display_name": "Lab",
            "quota": {"gpus": 4},
            "profiles": ["whole", "mig"],
            "idle": {"after": "20s", "gpu_utilization_below": 5},
        }
    },
}
SERVERS = {"kim": "whole", "lee": "mig", "max": "whole"}
START = {"kim": 0, "lee": 0, "max": 90}


@pytest.fixture(scope="module")
async def dra_hub(local_cluster, core, priority_class_objects, gpu_metrics):
    exporter = gpu_metrics.exporter
    async with running_hub(
        local_cluster,
        core,
        users={user: ["lab"] for user in SERVERS},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        # the service's GPU-time pass runs once, before any server: each server's record
        # is the hub's, written when its start finishes (the service charges from the
        # same allocation, which the dashboard's device names below read)
        service_settings={**settings(gpu_metrics.prometheus.url), "usage_interval": 3600},
        extra_config=CONFIG,
    ) as hub:
        pods = {user: f"jupyter-{user}" for user in SERVERS}
        for user, percent in START.items():
            exporter.set_utilization(hub.namespace, pods[user], percent)
        # max's devices reported without his pod's labels
        exporter.set_mapped(hub.namespace, pods["max"], False)
        try:
            await wait_for_service(hub)
            await asyncio.gather(
                *(start_server(hub, user, f"lab--{profile}") for user, profile in SERVERS.items())
            )
            yield hub
        finally:
            for pod in pods.values():
                exporter.set_mapped(hub.namespace, pod, True)
                exporter.set_utilization(hub.namespace, pod, None)


async def test_a_dra_server_is_charged_what_its_claim_was_allocated(dra_hub):
    """The hub reads a DRA server's claims when its start finishes, and writes down
    what they hold."""
    store = UsageStore(f"sqlite:///{dra_hub.directory / 'jupyterhub-gpu-usage.sqlite'}")

    async def recorded():
        rows = await asyncio.to_thread(store.overlapping, 0, time.time() + 3600)
        by_user = {r.user: r for r in rows}
        return by_user if set(SERVERS) <= set(by_user) else None

    rows = await eventually(recorded, "every server's GPU time recorded", within=60)
    assert rows["kim"].gpus == 1
    assert rows["max"].gpus == 1
    # admitted at the profile its selector requires, charged the partition it holds:
    # 3 of the H200's 7 compute slices either way
    assert rows["lee"].gpus == pytest.approx(float(Fraction(3, 7)))
    assert rows["lee"].flavor == "mig"

    # the dashboard's view names each server's device
    view, _ = await usage(dra_hub, await user_token(dra_hub, "root"))
    # and lab's quota holds what admission charged: two H200s and lee's 3/7
    (lab,) = [g for g in view["groups"] if g["name"] == "lab"]
    assert lab["gpus"]["used"] == pytest.approx(float(2 + Fraction(3, 7)), abs=1e-4)
    devices = {s["user"]: s["devices"] for s in view["servers"]}
    whole = r"gpu-[123] \(NVIDIA H200 NVL\) on h200-dra-0"
    assert re.fullmatch(whole, devices["kim"][0]), devices
    assert re.fullmatch(whole, devices["max"][0]), devices
    assert devices["kim"] != devices["max"]
    (partition,) = devices["lee"]
    assert re.fullmatch(
        r"gpu-0-mig-3g71gb-[01] \(NVIDIA H200 NVL 3g\.71gb\) on h200-dra-0", partition
    ), partition


async def test_idle_dra_devices_are_judged_by_their_dcgm_series(dra_hub):
    root = await user_token(dra_hub, "root")
    warning = await notice_about(dra_hub, root, "kim", "kim's server in Lab is idle")
    assert warning.startswith(
        "kim's server in Lab is idle: GPU utilisation below 5% for 20 seconds; "
    ), warning
    # the MIG partition's own engine activity, from DCGM too
    mig = await notice_about(dra_hub, root, "lee", "lee's server in Lab is idle")
    assert "GPU utilisation below 5% for 20 seconds" in mig

    async def kim_stopped():
        return not await running(dra_hub, "kim")

    await eventually(kim_stopped, "kim's server to be stopped", within=60, interval=1)
    # max's GPU has no series for his pod: unknown, so never warned, whatever his notebook
    assert await running(dra_hub, "max")
    assert await notices(dra_hub, root, "max") == []
