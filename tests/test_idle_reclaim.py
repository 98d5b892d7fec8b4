"""Idle GPU servers are warned, then stopped: by DCGM utilisation, or by notebook activity.

A real hub with the service, real servers in the local cluster, the simulated
DCGM exporter reporting the utilisation each test sets for a pod, and a real
Prometheus scraping it every second. The group ``lab`` reclaims GPUs idle for
20 s (below 5%), with a 10 s notice.

Users: ann (whole GPU, 0%), bob (whole GPU, 50%), carl (time-sliced GPU, the
device reports 50% but cannot be attributed), dave (whole GPU, busy until a
test idles him), erin (MIG slice, 0%). A hub of their own for the failure cases:
Prometheus unreachable, and a busy GPU the exporter does not map to its pod.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from hub_helpers import running_hub
from jupyterhub_gpu.service.idle import Prometheus, PrometheusError
from jupyterhub_gpu_dev.localcluster.cluster import free_port
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import eventually
from test_service_hub import aget, start_server, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

AFTER = 20
NOTICE = 10
POLICY = {
    "flavors": {
        "h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}},
        "shared": {"kind": "timeslice", "replicas": 4},
        "mig": {"kind": "mig", "profile": "1g.5gb", "strategy": "mixed"},
    },
    "profiles": {
        "whole": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "slice": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "shared"}},
        "mig": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "mig"}},
    },
    "groups": {
        "lab": {
            "display_name": "Lab",
            "quota": {"gpus": 8},
            "profiles": ["whole", "slice", "mig"],
            "idle": {"after": f"{AFTER}s", "gpu_utilization_below": 5},
        }
    },
}
CONFIG = (
    "c.GPUService.hub_poll_interval = 1\n"
    "c.KubeSpawner.http_timeout = 120\n"
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    '"services": ["demo-admin"]})\n'
)
SERVERS = {"ann": "whole", "bob": "whole", "carl": "slice", "dave": "whole", "erin": "mig"}
#: utilisation each server's pod reports from the start
START = {"ann": 0, "bob": 50, "carl": 50, "dave": 50, "erin": 0}


def settings(prometheus_url: str, after_notice: float = NOTICE) -> dict:
    return {"prometheus_url": prometheus_url, "idle_notice": after_notice, "rules_interval": 1}


async def pod_name(core, hub: LocalHub, user: str) -> str:
    pods = await core.list_namespaced_pod(
        hub.namespace, label_selector=f"hub.jupyter.org/username={user}"
    )
    (pod,) = pods.items
    return pod.metadata.name


async def set_utilization(gpu_metrics, core, hub: LocalHub, user: str, percent: float) -> None:
    gpu_metrics.exporter.set_utilization(hub.namespace, await pod_name(core, hub, user), percent)


async def running(hub: LocalHub, user: str) -> bool:
    _, model = await asyncio.to_thread(hub.api, "GET", f"/users/{user}")
    return bool(model["servers"].get("", {}).get("ready"))


async def notices(hub: LocalHub, token: str, user: str) -> list[str]:
    view, _ = await usage(hub, token)
    return [n["text"] for n in view["notices"] if n["user"] == user]


async def notice_about(hub: LocalHub, token: str, user: str, start: str, within: float = 90):
    async def found():
        return [t for t in await notices(hub, token, user) if t.startswith(start)]

    (text,) = await eventually(found, f"a notice {start!r}", within=within, interval=0.5)
    return text


@pytest.fixture(scope="module")
async def idle_hub(local_cluster, core, priority_class_objects, gpu_metrics):
    async with running_hub(
        local_cluster,
        core,
        users={user: ["lab"] for user in SERVERS},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_settings=settings(gpu_metrics.prometheus.url),
        extra_config=CONFIG,
    ) as hub:
        await wait_for_service(hub)
        # each pod reports its utilisation from its first scrape on (KubeSpawner's pod name)
        for user, percent in START.items():
            gpu_metrics.exporter.set_utilization(hub.namespace, f"jupyter-{user}", percent)
        await asyncio.gather(
            *(start_server(hub, user, f"lab--{profile}") for user, profile in SERVERS.items())
        )
        for user in SERVERS:
            assert await pod_name(core, hub, user) == f"jupyter-{user}"
        yield hub


async def test_an_idle_whole_gpu_is_warned_by_dcgm_then_stopped_a_busy_one_is_not(idle_hub):
    root = await user_token(idle_hub, "root")
    warning = await notice_about(idle_hub, root, "ann", "ann's server in Lab is idle")
    assert re.fullmatch(
        r"ann's server in Lab is idle: GPU utilisation below 5% for 20 seconds; "
        r"it stops at \d{4}-\d\d-\d\d \d\d:\d\d UTC, in 10 seconds, unless it is used",
        warning,
    ), warning

    async def ann_stopped():
        return not await running(idle_hub, "ann")

    await eventually(ann_stopped, "ann's server to be stopped", within=60, interval=1)
    stop = await notice_about(idle_hub, root, "ann", "Stopping ann's server")
    assert stop == (
        "Stopping ann's server in Lab: still idle 10 seconds after the notice; "
        "GPU utilisation below 5% for 20 seconds"
    )
    # ann sees both on her own page
    own = await notices(idle_hub, await user_token(idle_hub, "ann"), "ann")
    assert own == [warning, stop]
    # a MIG slice is judged by its graphics engine's activity, from DCGM too
    mig = await notice_about(idle_hub, root, "erin", "erin's server in Lab is idle")
    assert "GPU utilisation below 5% for 20 seconds" in mig
    # bob's GPU is at 50%: he has been running as long as ann, untouched
    assert await running(idle_hub, "bob")
    assert await notices(idle_hub, root, "bob") == []


async def test_a_shared_gpu_is_judged_by_notebook_activity(idle_hub):
    root = await user_token(idle_hub, "root")
    # carl's time-sliced device reports 50%, but that is the whole device's use
    warning = await notice_about(idle_hub, root, "carl", "carl's server in Lab is idle")
    assert warning.startswith(
        "carl's server in Lab is idle: no notebook activity for 20 seconds, and a shared "
        "GPU's use cannot be measured per server; it stops at "
    ), warning

    async def carl_stopped():
        return not await running(idle_hub, "carl")

    await eventually(carl_stopped, "carl's server to be stopped", within=60, interval=1)


async def test_use_coming_back_within_the_notice_cancels_the_stop(idle_hub, core, gpu_metrics):
    root = await user_token(idle_hub, "root")
    assert await notices(idle_hub, root, "dave") == []
    await set_utilization(gpu_metrics, core, idle_hub, "dave", 0)
    warning = await notice_about(idle_hub, root, "dave", "dave's server in Lab is idle")
    stop_at = re.search(r"stops at (\S+ \S+) UTC", warning)
    assert stop_at, warning
    # dave starts training within the notice period
    await set_utilization(gpu_metrics, core, idle_hub, "dave", 60)
    cancelled = await notice_about(idle_hub, root, "dave", "dave's server in Lab is in use again")
    assert cancelled == "dave's server in Lab is in use again: it will not be stopped"
    # past the time the stop was announced for, and then some: still running
    await asyncio.sleep(NOTICE + 3)
    assert await running(idle_hub, "dave")
    assert not any(t.startswith("Stopping dave") for t in await notices(idle_hub, root, "dave"))


async def test_prometheus_unreachable_stops_nothing_and_the_task_shows_why(hub_factory):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    policy = {**POLICY, "groups": {"lab": {**POLICY["groups"]["lab"], "idle": {"after": "5s"}}}}
    hub = await hub_factory(
        users={"ann": ["lab"]},
        admin_users=("root",),
        policy=policy,
        gpu_service=True,
        service_settings=settings(url, after_notice=2),
        extra_config=CONFIG,
    )
    await wait_for_service(hub)
    await start_server(hub, "ann", "lab--whole")
    root = await user_token(hub, "root")

    async def failing():
        view, _ = await usage(hub, root)
        task = next((t for t in view["tasks"] if t["name"] == "idle servers"), None)
        return task if task and task["consecutive_failures"] >= 2 else None

    task = await eventually(failing, "the idle task to fail twice", within=60, interval=0.5)
    assert task["last_error"].startswith(
        f"PrometheusError: Prometheus at {url} (GPUService.prometheus_url): cannot connect"
    ), task
    assert "neither warned nor stopped until it answers" in task["last_error"]
    # three times the idle time plus the notice: by notebook activity ann would be gone
    await asyncio.sleep(3 * 5 + 2)
    assert await running(hub, "ann")
    assert await notices(hub, root, "ann") == []


async def idle_task(hub: LocalHub, token: str) -> dict | None:
    view, _ = await usage(hub, token)
    return next((t for t in view["tasks"] if t["name"] == "idle servers"), None)


async def service_metrics(hub: LocalHub) -> set[str]:
    # the hub's demo-admin service token has read:metrics, as a Prometheus would
    status, _, body = await aget(hub.service_url + "metrics", hub.api_token)
    assert status == 200, body
    return set(body.splitlines())


async def test_a_busy_gpu_without_series_is_never_stopped_and_the_task_says_why(
    hub_factory, gpu_metrics
):
    policy = {**POLICY, "groups": {"lab": {**POLICY["groups"]["lab"], "idle": {"after": "5s"}}}}
    hub = await hub_factory(
        users={"fay": ["lab"]},
        admin_users=("root",),
        policy=policy,
        gpu_service=True,
        service_settings={**settings(gpu_metrics.prometheus.url, after_notice=2), "max_backoff": 2},
        extra_config=CONFIG,
    )
    exporter, pod = gpu_metrics.exporter, "jupyter-fay"
    # fay trains from a terminal: her GPU is busy, her notebook silent; the exporter
    # reports her GPU without her pod's labels (as when it cannot map a device to a pod)
    exporter.set_utilization(hub.namespace, pod, 90)
    exporter.set_mapped(hub.namespace, pod, False)
    try:
        await wait_for_service(hub)
        await start_server(hub, "fay", "lab--whole")
        root = await user_token(hub, "root")

        async def failing():
            task = await idle_task(hub, root)
            return task if task and task["consecutive_failures"] >= 2 else None

        task = await eventually(failing, "the idle task to fail twice", within=60, interval=0.5)
        assert task["last_error"].startswith(
            "NoDCGMSeries: 1 of 1 servers judged by GPU utilisation have no DCGM series in "
            "Prometheus, so are neither warned nor stopped: is dcgm-exporter down on their "
            "nodes, scraped without honorLabels (labels renamed exported_pod) or not mapping "
            "DRA devices to pods? nodes "
        ), task
        assert task["last_error"].endswith(f"; pods {hub.namespace}/{pod}"), task
        lines = await service_metrics(hub)
        assert "jupyterhub_gpu_idle_servers_judged_by_dcgm 1.0" in lines
        assert "jupyterhub_gpu_idle_servers_without_dcgm_series 1.0" in lines
        assert 'jupyterhub_gpu_task_consecutive_failures{task="idle servers"} 0.0' not in lines
        # three times the idle time plus the notice: by notebook activity fay would be gone
        await asyncio.sleep(3 * 5 + 2)
        assert await running(hub, "fay")
        assert await notices(hub, root, "fay") == []

        # the exporter maps her GPU again: measured busy, the task recovers
        exporter.set_mapped(hub.namespace, pod, True)

        async def recovered():
            task = await idle_task(hub, root)
            return task if task and task["ok"] else None

        task = await eventually(recovered, "the idle task to recover", within=60, interval=0.5)
        assert task["last_result"].startswith("1 server(s) checked, 0 warned, 0 stopped"), task
        lines = await service_metrics(hub)
        assert "jupyterhub_gpu_idle_servers_without_dcgm_series 0.0" in lines
        assert await running(hub, "fay")
        assert await notices(hub, root, "fay") == []
    finally:
        exporter.set_mapped(hub.namespace, pod, True)
        exporter.set_utilization(hub.namespace, pod, None)


async def test_a_url_that_is_not_prometheus_is_named_as_such(gpu_metrics):
    # the exporter is a real HTTP server, but no Prometheus
    with pytest.raises(PrometheusError) as caught:
        await Prometheus(gpu_metrics.exporter.url).query("up")
    assert str(caught.value).startswith(
        f"Prometheus at {gpu_metrics.exporter.url} (GPUService.prometheus_url): HTTP 404 from "
        "/api/v1/query, not Prometheus' HTTP API"
    )
    up = await Prometheus(gpu_metrics.prometheus.url + "/").query("up")
    assert [s["metric"]["job"] for s in up] == ["dcgm-exporter"]
