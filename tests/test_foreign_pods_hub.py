"""A pod made by hand beside a running server, copying its pod's labels and
annotations, never costs that server: a real hub with its GPU service, the local
cluster, the simulated DCGM exporter and a real Prometheus.

The demo's reproduction: beside research-1's running server (its GPU busy), a pod
copying its pod's annotations, labelled for research-2. The service took the copy for
research-1's server: the idle rule judged the copy's unused GPU and stopped
research-1's server; the copy was then deleted as an orphan. Here ann's server
(busy) gets two copies: one exactly like her pod, one saying it is bob's server
with her charge. Both are foreign: listed for admins, charged to nobody (the hub
admits bob's server up to the group's limit as if they were not there), never
deleted; ann's server runs on past the idle rule's window and notice.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kubernetes_asyncio.client import ApiException

from hub_helpers import api, ready
from jupyterhub_gpu.core.shaping import CHARGE_ANNOTATION, GROUP_LABEL, SPAWN_ANNOTATION
from kube_helpers import eventually, pod_manifest
from test_service_hub import aget, start_server, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

AFTER = 10
NOTICE = 3
POLICY = {
    "flavors": {
        "h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}}
    },
    "profiles": {"whole": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "lab": {
            "quota": {"gpus": 2},
            # ann's server and bob's: room for both only if the copies count for nobody
            "limit": {"gpus": 2},
            "profiles": ["whole"],
            "idle": {"after": f"{AFTER}s", "gpu_utilization_below": 5},
        }
    },
}
CONFIG = (
    "c.KubeSpawner.http_timeout = 120\n"
    # the hub's ledger is resynced from the pods every second: a copy it counted would
    # fill the group before bob asks
    "c.GPUKubeSpawner.ledger_resync_interval = 1\n"
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    '"services": ["demo-admin"]})\n'
)


def copy_of(real, name: str, user: str | None = None) -> dict:
    """A pod with ``real``'s labels and annotations (another user's name on it, where
    given, as the demo's was), asking for the same GPU."""
    pod = pod_manifest(
        name,
        # cpu and memory too: a group namespace's ResourceQuota may ask for them
        {"nvidia.com/gpu": "1", "cpu": "100m", "memory": "128Mi"},
        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
    )
    labels = dict(real.metadata.labels)
    annotations = dict(real.metadata.annotations)
    if user is not None:
        labels["hub.jupyter.org/username"] = user
        annotations["hub.jupyter.org/username"] = user
    pod["metadata"]["labels"] = labels
    pod["metadata"]["annotations"] = annotations
    return pod


async def exists(core, namespace: str, name: str) -> bool:
    try:
        await core.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


async def test_a_copy_of_a_running_servers_pod_never_stops_or_charges_it(
    hub_factory, core, gpu_metrics
):
    hub = await hub_factory(
        users={"ann": ["lab"], "bob": ["lab"], "root": []},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_settings={
            "prometheus_url": gpu_metrics.prometheus.url,
            "idle_notice": NOTICE,
            "rules_interval": 1,
            "hub_poll_interval": 1,
            "orphan_grace": 2,
        },
        extra_config=CONFIG,
    )
    await wait_for_service(hub)
    root = await user_token(hub, "root")
    namespace = hub.namespace
    for user in ("ann", "bob"):
        gpu_metrics.exporter.set_utilization(namespace, f"jupyter-{user}", 90)
    await start_server(hub, "ann", "lab--whole")
    real = await core.read_namespaced_pod("jupyter-ann", namespace)
    assert real.metadata.annotations[SPAWN_ANNOTATION]
    assert CHARGE_ANNOTATION in real.metadata.annotations
    assert real.metadata.labels[GROUP_LABEL] == "lab"

    # the copies' GPUs are unused: judged in the server's place, they would stop it
    for name in ("copy-ann", "copy-as-bob"):
        gpu_metrics.exporter.set_utilization(namespace, name, 0)
    await core.create_namespaced_pod(namespace, copy_of(real, "copy-ann"))
    await core.create_namespaced_pod(namespace, copy_of(real, "copy-as-bob", user="bob"))
    made = time.monotonic()

    async def reported():
        view, _ = await usage(hub, root)
        lab = next(g for g in view["groups"] if g["name"] == "lab")
        pods = {p["pod"]: p for p in view["foreign_pods"]}
        return len(pods) == 2 and lab["gpus"]["used"] == 1 and (view, pods)

    view, pods = await eventually(reported, "the service to report both copies, uncharged")
    assert pods[f"{namespace}/copy-ann"]["user"] == "ann"
    assert "whose pod is" in pods[f"{namespace}/copy-ann"]["why"]
    assert pods[f"{namespace}/copy-as-bob"]["user"] == "bob"
    assert "its charge names ann" in pods[f"{namespace}/copy-as-bob"]["why"]
    # the server's own pod is ann's server, and no copy is an orphan
    (server,) = [s for s in view["servers"] if s["user"] == "ann"]
    assert server["group"] == "lab"
    assert view["orphans"] == []
    status, _, page = await aget(hub.service_url, root)
    assert status == 200, page
    assert "Foreign pods" in page
    assert f"{namespace}/copy-ann" in page

    # the hub's ledger counts ann's server only: bob's fits within the group's limit
    async def hub_told() -> bool:
        log = hub.log_path.read_text(errors="replace")
        return all(
            f"Pod {namespace}/{name} is labelled as ann's server in lab but counted for nobody"
            in log
            for name in ("copy-ann", "copy-as-bob")
        )

    await eventually(hub_told, "the hub's ledger resync to count the copies for nobody")
    await start_server(hub, "bob", "lab--whole")

    # the idle rule's window and notice go by (the copies' samples cover the window):
    # ann's busy server runs on, and the copies are neither charged nor deleted
    deadline = made + AFTER + NOTICE + 10
    while time.monotonic() < deadline:
        assert await ready(hub, "ann"), "ann's server was stopped because of a copy"
        await asyncio.sleep(1)
    view, _ = await usage(hub, root)
    texts = [n["text"] for n in view["notices"] if n["user"] == "ann"]
    assert not [t for t in texts if "idle" in t.lower()], texts
    assert await exists(core, namespace, "jupyter-ann")
    assert await exists(core, namespace, "copy-ann")
    assert await exists(core, namespace, "copy-as-bob")
    lab = next(g for g in view["groups"] if g["name"] == "lab")
    assert lab["gpus"]["used"] == 2  # ann's and bob's

    # the copies go: ann's server is untouched, and no stop is recorded for it
    for name in ("copy-ann", "copy-as-bob"):
        await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    async def forgotten():
        view, _ = await usage(hub, root)
        return view["foreign_pods"] == [] and view

    await eventually(forgotten, "the service to forget the deleted copies")
    assert await ready(hub, "ann")
    status, model = await api(hub, "GET", "/users/ann")
    assert status == 200, model
    assert model["servers"][""]["ready"]


async def test_a_pod_labelled_for_a_group_in_another_groups_namespace_counts_for_nobody(
    hub_factory, core
):
    prefix = f"fp-{uuid.uuid4().hex[:8]}-"
    hub = await hub_factory(
        users={"ann": ["lab"], "bob": ["lab"], "cy": ["other"], "root": []},
        admin_users=("root",),
        policy={
            "flavors": {"gpu": {"kind": "gpu"}},
            "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "gpu"}}},
            "groups": {
                # room for ann's and bob's servers only if the pod in other's namespace
                # counts for nobody
                "lab": {"quota": {"gpus": 2}, "limit": {"gpus": 2}, "profiles": ["gpu"]},
                "other": {"quota": {"gpus": 1}, "profiles": ["gpu"]},
            },
            "namespace_per_group": True,
            "namespace_prefix": prefix,
        },
        gpu_service=True,
        service_settings={"reconcile_interval": 1, "rules_interval": 1, "hub_poll_interval": 1},
        extra_config=CONFIG,
    )
    await wait_for_service(hub)
    root = await user_token(hub, "root")
    lab, other = f"{prefix}lab", f"{prefix}other"
    await eventually(lambda: exists_namespace(core, other), "the groups' namespaces", within=60)
    await start_server(hub, "ann", "lab--gpu")
    real = await core.read_namespaced_pod("jupyter-ann", lab)
    # a pod in other's namespace with ann's pod's labels and annotations (lab's charge)
    await core.create_namespaced_pod(other, copy_of(real, "lab-elsewhere"))

    async def reported():
        view, _ = await usage(hub, root)
        group = next(g for g in view["groups"] if g["name"] == "lab")
        pods = {p["pod"]: p for p in view["foreign_pods"]}
        return group["gpus"]["used"] == 1 and f"{other}/lab-elsewhere" in pods and pods

    pods = await eventually(reported, "the service to report the pod, uncharged")
    why = pods[f"{other}/lab-elsewhere"]["why"]
    assert why == f"labelled for lab, whose servers run in namespace {lab}, not in {other}"

    async def hub_told() -> bool:
        return (
            f"Pod {other}/lab-elsewhere is labelled as ann's server in lab but counted for "
            "nobody" in hub.log_path.read_text(errors="replace")
        )

    await eventually(hub_told, "the hub's ledger resync to count the pod for nobody")
    # bob's server fits within lab's limit: the pod elsewhere took no room
    await start_server(hub, "bob", "lab--gpu")
    await core.delete_namespaced_pod("lab-elsewhere", other, grace_period_seconds=0)


async def exists_namespace(core, name: str) -> bool:
    try:
        await core.read_namespace(name)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True
