"""Adopting on a live hub, and rolling back, with a real hub on the local cluster.

A hub runs stock KubeSpawner with a site's own GPU profile; ann starts a server
holding a GPU. The hub is switched to GPUKubeSpawner with a policy (as `helm
upgrade` restarts it): ann's server keeps running and counts against her group's
quota from the first minute; it stops cleanly and frees the quota. Then the hub is
switched back: servers start and stop as before, and nothing was deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import uuid
from fractions import Fraction

import pytest
from kubernetes_asyncio import client

from hub_helpers import api, apply_policy_rbac, ready, wait_no_pods
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.core.shaping import CHARGE_ANNOTATION, GROUP_LABEL, HUB_LABEL
from kube_helpers import (
    GPU_TOLERATION,
    dedicated_gpu_node,
    eventually,
    failed_scheduling,
    pod_manifest,
    taken_away,
    user_pod,
)
from test_service_hub import aget, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

#: the site's profile list before the policy: a GPU through KubeSpawner's own settings
STOCK_PROFILES = f"""
c.KubeSpawner.profile_list = [{{
    "display_name": "Old GPU",
    "slug": "gpu-old",
    "kubespawner_override": {{
        "cpu_guarantee": 0.1,
        "mem_guarantee": "128M",
        "extra_resource_guarantees": {{"nvidia.com/gpu": "1"}},
        "extra_resource_limits": {{"nvidia.com/gpu": "1"}},
        "tolerations": [{GPU_TOLERATION!r}],
    }},
}}]
"""
TOKEN_ISSUER = (
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    '"services": ["demo-admin"]})\n'
)
POLICY = {
    "flavors": {"gpu": {"kind": "gpu"}},
    "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "gpu"}}},
    "groups": {"lab": {"quota": {"gpus": 1}, "profiles": ["gpu"]}},
}


async def switch(hub, *, policy, extra_config) -> None:
    """Restart the hub with other settings, its servers left running (``helm upgrade``):
    with the policy, the GPU service too."""
    # as an admin does before such an upgrade: the RBAC `manifests` renders for it
    async with hub.cluster.api() as admin:
        await apply_policy_rbac(client.CoreV1Api(admin), hub.namespace, policy)
    hub.policy = policy
    hub.gpu_service = policy is not None
    # the test's own token may issue users' tokens for the service's API
    hub.extra_config = extra_config + TOKEN_ISSUER
    await asyncio.to_thread(hub.restart)


def usage_rows(hub) -> list[tuple]:
    """(uid, group, started, ended) of every row of the hub's usage database."""
    with contextlib.closing(sqlite3.connect(hub.directory / "jupyterhub-gpu-usage.sqlite")) as db:
        return db.execute(
            'SELECT uid, "group", started, ended FROM jupyterhub_gpu_usage'
        ).fetchall()


async def test_a_server_from_before_the_policy_counts_keeps_running_and_rolls_back(
    hub_factory, core
):
    hub = await hub_factory(
        users={"ann": ["lab"], "bob": ["lab"], "root": []},
        admin_users=("root",),
        extra_config=STOCK_PROFILES,
        cleanup_servers=False,
        service_settings={"usage_interval": 1},
    )
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "gpu-old"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's stock server to be ready", within=120)
    (old_pod,) = (await core.list_namespaced_pod(hub.namespace)).items
    assert "gpu.jupyterhub.org/group" not in (old_pod.metadata.labels or {})

    await switch(hub, policy=POLICY, extra_config="")
    # ann's GPU counts against lab's quota of 1 from the hub's first minute
    status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--gpu"})
    assert status == 403, body
    assert body["message"].startswith("lab already uses 1 of its 1 GPU,"), body
    log = hub.log_path.read_text(errors="replace")
    assert (
        f"Server pod {hub.namespace}/{old_pod.metadata.name} of ann, started before the GPU policy"
        in log
    )
    assert "is charged to lab: the only one of ann's groups that offers flavor gpu" in log
    # ...and keeps running, untouched
    assert await ready(hub, "ann")
    pod = await core.read_namespaced_pod(old_pod.metadata.name, hub.namespace)
    assert pod.metadata.uid == old_pod.metadata.uid
    assert pod.metadata.deletion_timestamp is None
    # the GPU service counts it too, shows it as started before the policy, and
    # records its GPU time from then on
    switched = time.time()
    await wait_for_service(hub)
    root = await user_token(hub, "root")

    async def counted():
        view, _ = await usage(hub, root)
        lab = next(g for g in view["groups"] if g["name"] == "lab")
        return view if lab["gpus"]["used"] == 1 else None

    view = await eventually(counted, "the service to count ann's old GPU in lab")
    (shown,) = [s for s in view["servers"] if s["user"] == "ann"]
    assert (shown["group"], shown["before_policy"], shown["stops_in_seconds"]) == (
        "lab",
        True,
        None,
    )
    status, _, page = await aget(hub.service_url, root)
    assert "(started before the GPU policy)" in page

    async def recorded():
        rows = [r for r in usage_rows(hub) if r[0] == old_pod.metadata.uid]
        return rows or None

    ((_, group, started, ended),) = await eventually(recorded, "a usage row for ann's server")
    assert group == "lab"
    assert ended is None
    # counted from the switch, not from the pod's start before it
    assert started >= old_pod.status.start_time.timestamp()
    assert started >= switched - 60

    # it stops cleanly, and its GPU is lab's again
    status, _ = await api(hub, "DELETE", "/users/ann/server")
    assert status in (202, 204)
    await wait_no_pods(core, hub.namespace)
    status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--gpu"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "bob"), "bob's policy server to be ready", within=120)

    async def ended():
        rows = [r for r in usage_rows(hub) if r[0] == old_pod.metadata.uid]
        return rows if rows and rows[0][3] is not None else None

    ((_, _, started, end),) = await eventually(ended, "ann's usage row to be ended")
    assert end > started

    # rolling back: stock KubeSpawner again; bob's policy server keeps running, ann's
    # stock profile starts and stops, and nothing was deleted
    await switch(hub, policy=None, extra_config=STOCK_PROFILES)
    assert await ready(hub, "bob")
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "gpu-old"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's stock server to start again", within=120)
    for user in ("ann", "bob"):
        status, _ = await api(hub, "DELETE", f"/users/{user}/server")
        assert status in (202, 204)
    await wait_no_pods(core, hub.namespace)
    assert (await core.read_namespace(hub.namespace)).status.phase == "Active"


async def test_another_hubs_server_in_the_same_namespace_is_not_counted(hub_factory, core):
    """A staging hub's server, labelled as its own, in the namespace this hub lists:
    it holds a GPU of a group of the same name, and this hub's quota ignores it."""
    hub = await hub_factory(users={"ann": ["lab"]}, policy=POLICY)
    request = Request(gpus=Fraction(1), cpu=100, memory=2**27, devices=(("gpu", 1),))
    staging = pod_manifest("jupyter-staging-ann", {"nvidia.com/gpu": "1"})
    staging["metadata"]["labels"] = {
        "component": "singleuser-server",
        GROUP_LABEL: "lab",
        HUB_LABEL: "staging",
    }
    staging["metadata"]["annotations"] = {
        CHARGE_ANNOTATION: json.dumps({"user": "ann", "request": request.to_json()})
    }
    await core.create_namespaced_pod(hub.namespace, staging)
    await asyncio.to_thread(hub.restart)  # the ledger is rebuilt from the pods it lists
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "lab--gpu"})
    assert status in (201, 202), body
    pods = (await core.list_namespaced_pod(hub.namespace)).items
    mine = next(p for p in pods if p.metadata.name != "jupyter-staging-ann")
    assert mine.metadata.labels[HUB_LABEL] == hub.namespace
    await core.delete_namespaced_pod("jupyter-staging-ann", hub.namespace, grace_period_seconds=0)


async def test_new_servers_never_preempt_a_server_from_before_the_policy_unless_asked(
    hub_factory, core
):
    """On a full node, kube-scheduler would evict the old server (priority 0) for a
    policy server: while one runs, policy servers wait instead; with
    ``adopted_servers_preemptible`` they take its place."""
    pool = f"adopt-{uuid.uuid4().hex[:6]}"
    node = await dedicated_gpu_node(core, pool, gpus=1)
    on_the_node = {"jupyterhub-gpu.local/pool": pool}
    stock = STOCK_PROFILES.replace(
        '"tolerations"', f'"node_selector": {on_the_node!r}, "tolerations"'
    )
    policy = {
        "flavors": {"gpu": {"kind": "gpu", "node_selector": on_the_node}},
        "profiles": POLICY["profiles"],
        "groups": {"lab": {"quota": {"gpus": 2}, "profiles": ["gpu"]}},
    }
    try:
        hub = await hub_factory(
            users={"ann": ["lab"], "bob": ["lab"]}, extra_config=stock, cleanup_servers=False
        )
        status, body = await api(hub, "POST", "/users/ann/server", {"profile": "gpu-old"})
        assert status in (201, 202), body
        await eventually(lambda: ready(hub, "ann"), "ann's stock server to be ready", within=120)
        (old,) = (await core.list_namespaced_pod(hub.namespace)).items
        assert old.spec.node_name == node

        await switch(hub, policy=policy, extra_config="")
        # lab has room in its quota (1 of 2), the node has none: bob's server waits
        status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--gpu"})
        assert status in (201, 202), body
        bobs = await eventually(
            lambda: user_pod(core, hub.namespace, "bob"), "bob's server pod to be created"
        )
        assert bobs.spec.priority_class_name == "jupyterhub-gpu-in-quota-no-preemption"
        assert (bobs.spec.priority, bobs.spec.preemption_policy) == (1000, "Never")
        await failed_scheduling(core, hub.namespace, bobs.metadata.name)
        await asyncio.sleep(3)  # a preemption follows the failed attempt at once
        kept = await core.read_namespaced_pod(old.metadata.name, hub.namespace)
        assert (kept.metadata.uid, kept.metadata.deletion_timestamp) == (old.metadata.uid, None)
        assert await ready(hub, "ann")
        waiting = await core.read_namespaced_pod(bobs.metadata.name, hub.namespace)
        assert (waiting.spec.node_name, waiting.status.nominated_node_name) == (None, None)
        log = hub.log_path.read_text(errors="replace")
        assert "1 server pods started before the GPU policy are running" in log

        # the admin allows it: bob's next server takes the old server's place
        status, _ = await api(hub, "DELETE", "/users/bob/server")
        assert status in (202, 204)
        await eventually(
            lambda: no_pod_of(core, hub.namespace, "bob"), "bob's waiting pod to be deleted"
        )
        await switch(hub, policy={**policy, "adopted_servers_preemptible": True}, extra_config="")
        status, body = await api(hub, "POST", "/users/bob/server", {"profile": "lab--gpu"})
        assert status in (201, 202), body
        bobs = await eventually(
            lambda: user_pod(core, hub.namespace, "bob"), "bob's server pod to be created"
        )
        assert bobs.spec.priority_class_name == "jupyterhub-gpu-in-quota"

        await eventually(
            lambda: taken_away(core, old), "kube-scheduler to preempt ann's old server", within=60
        )
        for user in ("ann", "bob"):
            await api(hub, "DELETE", f"/users/{user}/server")
        await wait_no_pods(core, hub.namespace)
    finally:
        await core.delete_node(node)


async def no_pod_of(core, namespace: str, user: str) -> bool:
    return await user_pod(core, namespace, user) is None
