"""The service with less than it needs: it degrades, says why, retries, and recovers.

A real hub runs the service hub-managed with the permissions a z2jh hub pod has
by default: a service account whose Role reads pods in the hub's namespace
(no nodes, no cluster-wide pods), and a hub role without ``delete:servers``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes_asyncio import client
from rbac_helpers import token_kubeconfig

from hub_helpers import running_hub
from kube_helpers import eventually
from test_service_hub import aget, start_server, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "flavors": {"h200": {"kind": "gpu", "display_name": "H200"}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        "brief": {
            "display_name": "Brief Course",
            "quota": {"gpus": 2},
            "max_runtime": "5s",
            "profiles": ["small"],
        },
    },
}
#: the GPU service's own account here, granted less than the rendered RBAC gives it
RESTRICTED = "gpu-restricted"
ALL_PODS_AND_NODES = [
    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}
]


async def service_account_kubeconfig(kube, core, local_cluster, namespace: str, path) -> None:
    """A kubeconfig for a service account (``RESTRICTED``) that may only read pods in
    ``namespace``."""
    rbac = client.RbacAuthorizationV1Api(kube)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": RESTRICTED}})
    await rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": RESTRICTED},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
    )
    await rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": RESTRICTED},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": RESTRICTED,
            },
            "subjects": [{"kind": "ServiceAccount", "name": RESTRICTED, "namespace": namespace}],
        },
    )
    await token_kubeconfig(kube, local_cluster.state.kubeconfig, namespace, RESTRICTED, path)


@pytest.fixture(scope="module")
async def restricted_hub(local_cluster, kube, core, priority_class_objects, tmp_path_factory):
    kubeconfig = tmp_path_factory.mktemp("sa") / "hub.kubeconfig"
    async with running_hub(
        local_cluster,
        core,
        start=False,
        users={"carl": ["brief"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_kubeconfig=kubeconfig,
        extra_config=(
            "c.GPUService.rules_interval = 1\n"
            "c.GPUService.hub_poll_interval = 1\n"
            "c.GPUService.max_backoff = 4\n"
            "c.KubeSpawner.http_timeout = 120\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
            # the service's role as an admin might first write it: it may list, not stop
            "for role in c.JupyterHub.load_roles:\n"
            '    if role["name"] == "jupyterhub-gpu-service":\n'
            '        role["scopes"] = ["list:users", "read:servers"]\n'
        ),
    ) as hub:
        # the service's account lives in the hub's namespace, made before the hub starts
        await service_account_kubeconfig(kube, core, local_cluster, hub.namespace, kubeconfig)
        await asyncio.to_thread(hub.start)
        await wait_for_service(hub)
        yield hub


def tasks_of(view: dict) -> dict[str, dict]:
    return {t["name"]: t for t in view["tasks"]}


async def test_without_node_rbac_capacity_is_unknown_then_recovers_without_restart(
    restricted_hub, kube
):
    root = await user_token(restricted_hub, "root")
    view, _ = await usage(restricted_hub, root)
    # usage works from the namespaced pod watch; capacity is unknown, not zero
    assert [g["name"] for g in view["groups"]] == ["brief", "everyone"]
    assert view["capacity"] == {"known": False, "flavors": []}
    for name in ("watch nodes", "watch bound pods"):
        task = tasks_of(view)[name]
        assert task["ok"] is False
        assert task["consecutive_failures"] >= 1
        assert task["last_error"].startswith("HTTP 403 permission denied")
    status, _, page = await aget(restricted_hub.service_url, root)
    assert status == 200
    assert "Cluster capacity unknown" in page
    assert "retrying with backoff" in page

    # the admin grants what docs/service.md lists: the next retry succeeds
    rbac = client.RbacAuthorizationV1Api(kube)
    name = f"gpu-service-{restricted_hub.namespace}"
    await rbac.create_cluster_role({"metadata": {"name": name}, "rules": ALL_PODS_AND_NODES})
    await rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": RESTRICTED,
                    "namespace": restricted_hub.namespace,
                }
            ],
        }
    )
    try:

        async def known():
            view, _ = await usage(restricted_hub, root)
            return view["capacity"]["known"] and view

        view = await eventually(known, "capacity after the grant", within=30, interval=0.5)
        assert view["capacity"]["flavors"][0]["allocatable"] > 0
        assert tasks_of(view)["watch nodes"]["ok"] is True
    finally:
        await rbac.delete_cluster_role_binding(name)
        await rbac.delete_cluster_role(name)


async def test_without_delete_servers_the_stop_fails_visibly_and_is_retried(restricted_hub):
    await start_server(restricted_hub, "carl", "brief--small")
    root = await user_token(restricted_hub, "root")

    async def failing():
        view, _ = await usage(restricted_hub, root)
        task = tasks_of(view)["runtime rules"]
        return task["consecutive_failures"] >= 2 and task

    task = await eventually(failing, "the stop to fail twice", within=60, interval=0.5)
    assert "HTTP 403" in task["last_error"]
    assert "delete:servers" in task["last_error"]
    # nothing else broke: the server still runs, the views still answer
    _, model = await asyncio.to_thread(restricted_hub.api, "GET", "/users/carl")
    assert model["servers"][""]["ready"]
    view, _ = await usage(restricted_hub, root)
    assert tasks_of(view)["hub servers"]["ok"] is True
    assert view["groups"][0]["gpus"]["used"] == 1
    # announced once, not at every retry
    assert json.dumps(view).count("Stopping carl's server") == 1
