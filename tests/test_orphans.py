"""Server pods no hub server owns, with a real hub, its GPU service and the local cluster.

Such a pod is what a stop that failed while the API server was away leaves behind
when the hub restarts before it comes back: the last test makes it so, through a
relay the test cuts. The others make it by hand, with this hub's labels, for a server
the user does not have. The service lists it, keeps it charged, and deletes it after
the grace; in a dry run it only reports it. The servers the hub does own are never
touched.
"""

from __future__ import annotations

import asyncio
import json
from fractions import Fraction

import pytest
from kubernetes_asyncio.client import ApiException

from hub_helpers import api, ready
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.core.shaping import CHARGE_ANNOTATION, GROUP_LABEL, HUB_LABEL
from kube_helpers import eventually, pod_manifest
from test_service_hub import aget, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "flavors": {"gpu": {"kind": "gpu"}},
    "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "gpu"}}},
    "groups": {"lab": {"quota": {"gpus": 4}, "profiles": ["gpu"]}},
}
TOKEN_ISSUER = (
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    '"services": ["demo-admin"]})\n'
)


def stray_pod(hub, name: str, user: str, server: str) -> dict:
    """A pod labelled as this hub's server of ``user``'s ``server``, charged to lab."""
    request = Request(gpus=Fraction(1), cpu=100, memory=2**27, devices=(("gpu", 1),))
    pod = pod_manifest(name, {"nvidia.com/gpu": "1"})
    pod["metadata"]["labels"] = {
        "component": "singleuser-server",
        GROUP_LABEL: "lab",
        HUB_LABEL: hub.namespace,
    }
    pod["metadata"]["annotations"] = {
        "hub.jupyter.org/username": user,
        "hub.jupyter.org/servername": server,
        CHARGE_ANNOTATION: json.dumps({"user": user, "request": request.to_json()}),
    }
    return pod


async def gone(core, namespace: str, name: str) -> bool:
    try:
        await core.read_namespaced_pod(name, namespace)
    except ApiException as e:
        return e.status == 404
    return False


async def orphan_hub(hub_factory, **service_settings):
    hub = await hub_factory(
        users={"ann": ["lab"], "root": []},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_settings={"rules_interval": 1, "hub_poll_interval": 1, **service_settings},
        extra_config=TOKEN_ISSUER,
    )
    await wait_for_service(hub)
    return hub, await user_token(hub, "root")


async def test_a_pod_no_hub_server_owns_is_shown_charged_and_deleted_after_the_grace(
    hub_factory, core
):
    hub, root = await orphan_hub(hub_factory, orphan_grace=4)
    # ann's own server: the hub owns it, so it is never taken for an orphan
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "lab--gpu"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's server", within=120)
    await core.create_namespaced_pod(
        hub.namespace, stray_pod(hub, "jupyter-ann-lost", "ann", "lost")
    )

    async def listed():
        view, _ = await usage(hub, root)
        lab = next(g for g in view["groups"] if g["name"] == "lab")
        return view["orphans"] and lab["gpus"]["used"] == 2 and view

    view = await eventually(listed, "the service to list the stray pod, still charged")
    (orphan,) = view["orphans"]
    assert (orphan["pod"], orphan["user"], orphan["server"], orphan["group"]) == (
        f"{hub.namespace}/jupyter-ann-lost",
        "ann",
        "lost",
        "lab",
    )
    assert orphan["deletes_at"] is not None
    status, _, metrics = await aget(hub.service_url + "metrics", hub.api_token)
    assert status == 200, metrics
    assert 'jupyterhub_gpu_group_orphaned_server_pods{group="lab"} 1.0' in metrics
    await eventually(
        lambda: gone(core, hub.namespace, "jupyter-ann-lost"), "the stray pod to be deleted"
    )
    view, _ = await usage(hub, root)
    texts = [n["text"] for n in view["notices"]]
    assert any(t.startswith(f"Deleted pod {hub.namespace}/jupyter-ann-lost") for t in texts)
    # the server the hub owns runs on
    assert await ready(hub, "ann")
    assert not await gone(core, hub.namespace, "jupyter-ann")


async def test_in_a_dry_run_a_stray_pod_is_only_reported(hub_factory, core):
    hub, root = await orphan_hub(hub_factory, orphan_grace=1, reconcile_dry_run=True)
    await core.create_namespaced_pod(hub.namespace, stray_pod(hub, "jupyter-bob", "bob", ""))

    async def reported():
        view, _ = await usage(hub, root)
        return view["orphans"]

    (orphan,) = await eventually(reported, "the service to report the stray pod")
    assert orphan["deletes_at"] is None
    await asyncio.sleep(4)  # past the grace, a few passes of the rule
    assert not await gone(core, hub.namespace, "jupyter-bob")
    await core.delete_namespaced_pod("jupyter-bob", hub.namespace, grace_period_seconds=0)


async def test_a_stop_that_failed_while_the_api_was_away_leaves_an_orphan_that_goes(
    hub_factory, core
):
    """The real sequence: ann's stop fails while the API server is away (JupyterHub
    forgets her server all the same), and the hub restarts before it comes back. Her
    pod runs on without a hub server: the service lists it, keeps it charged and
    deletes it after the grace."""
    relay, hub = await hub_factory.behind_relay(
        service_behind_relay=True,  # the service runs in the hub pod: it is cut off too
        users={"ann": ["lab"], "root": []},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_settings={"rules_interval": 1, "hub_poll_interval": 1, "orphan_grace": 5},
        # servers outlive the hub's restart; a call to the API fails after 5 s, not 30
        cleanup_servers=False,
        extra_config=TOKEN_ISSUER + "c.KubeSpawner.k8s_api_request_retry_timeout = 5\n",
    )
    await wait_for_service(hub)
    status, body = await api(hub, "POST", "/users/ann/server", {"profile": "lab--gpu"})
    assert status in (201, 202), body
    await eventually(lambda: ready(hub, "ann"), "ann's server", within=120)

    await relay.cut()
    status, body = await api(hub, "DELETE", "/users/ann/server")
    assert status in (202, 204), body

    async def forgotten() -> bool:
        _, model = await api(hub, "GET", "/users/ann")
        return model["servers"] == {}

    # the stop fails (the pod cannot be deleted), and the hub forgets the server anyway
    await eventually(forgotten, "the hub to give up ann's stop", within=60)
    assert not await gone(core, hub.namespace, "jupyter-ann")
    # the hub restarts before the API server is back
    old = hub.process.pid
    restarting = asyncio.create_task(asyncio.to_thread(hub.restart, 180))

    async def restarted() -> bool:
        return hub.process is not None and hub.process.pid != old

    await eventually(restarted, "the hub to start again", within=90)
    await relay.restore()
    await restarting
    await wait_for_service(hub)
    root = await user_token(hub, "root")
    assert await forgotten()

    async def listed():
        view, _ = await usage(hub, root)
        lab = next(g for g in view["groups"] if g["name"] == "lab")
        return view["orphans"] and lab["gpus"]["used"] == 1 and view

    # found within a pass or two of the rules (every second), still charged
    view = await eventually(listed, "the service to list ann's pod, still charged", within=15)
    (orphan,) = view["orphans"]
    assert (orphan["pod"], orphan["user"], orphan["server"], orphan["group"]) == (
        f"{hub.namespace}/jupyter-ann",
        "ann",
        "",
        "lab",
    )
    assert orphan["deletes_at"] is not None
    status, _, page = await aget(hub.service_url, root)
    assert status == 200, page
    assert "Server pods the hub does not own" in page
    assert f"{hub.namespace}/jupyter-ann" in page

    await eventually(
        lambda: gone(core, hub.namespace, "jupyter-ann"), "ann's orphaned pod to be deleted"
    )

    async def released():
        view, _ = await usage(hub, root)
        lab = next(g for g in view["groups"] if g["name"] == "lab")
        return view["orphans"] == [] and lab["gpus"]["used"] == 0 and view

    view = await eventually(released, "the service to count the deleted pod no more")
    texts = [n["text"] for n in view["notices"]]
    assert any(t.startswith(f"Deleted pod {hub.namespace}/jupyter-ann") for t in texts), texts
