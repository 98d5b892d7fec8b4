"""A real hub counts the spawns it refuses on its own /hub/metrics, by group and reason,
where Prometheus scrapes them for the refused-spawns alert."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hub_helpers import api, stop_server, wait_no_pods

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "flavors": {
        "h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}}
    },
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "lab": {"quota": {"gpus": 1}, "limit": {"gpus": 1}, "profiles": ["small"]},
        "other": {"quota": {"gpus": 1}, "profiles": ["small"]},
    },
}


def refusals(hub) -> dict[tuple[str, str], float]:
    """The hub's refused-spawn counts on /hub/metrics, as Prometheus reads them."""
    status, text = hub.request("GET", "/hub/metrics")
    assert status == 200, text
    text = text if isinstance(text, str) else str(text)
    return {
        (sample.labels["group"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "jupyterhub_gpu_spawns_refused"
        for sample in family.samples
        if sample.name == "jupyterhub_gpu_spawns_refused_total"
    }


async def test_refused_spawns_are_counted_on_the_hubs_metrics_by_group_and_reason(
    hub_factory, core
):
    hub = await hub_factory(
        policy=POLICY,
        users={"ann": ["lab"], "bob": ["lab"], "mallory": ["other"]},
    )
    assert await asyncio.to_thread(refusals, hub) == {}
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "lab--small"})
    assert status in (201, 202), body
    # lab is full: bob is refused twice, charged to lab
    for _ in range(2):
        status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--small"})
        assert status == 403, body
    # a forged request for a group mallory is not in: refused before any group is chosen
    status, body = await api(hub, "POST", "/users/mallory/server", {"profile": "lab--small"})
    assert status == 403, body
    counted = await asyncio.to_thread(refusals, hub)
    assert counted == {("lab", "group_full"): 2.0, ("", "options"): 1.0}
    # an admitted spawn counts nothing
    assert await stop_server(hub, "ann") in (202, 204)
    await wait_no_pods(core, hub.namespace)
    status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--small"})
    assert status in (201, 202), body
    assert await asyncio.to_thread(refusals, hub) == counted
    assert await stop_server(hub, "bob") in (202, 204)
    await wait_no_pods(core, hub.namespace)
