"""The RBAC ``jupyterhub-gpu manifests`` renders, applied to the local cluster as an admin
would, and the real API server's authorizer asked what an account may do."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from jupyterhub_gpu.core.manifests import desired_objects, rbac_objects
from jupyterhub_gpu.core.model import Policy

#: what z2jh's chart grants the hub in its own namespace (its ``hub`` Role)
Z2JH_HUB_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
        "verbs": ["get", "watch", "list", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
]


def subject(namespace: str, account: str) -> str:
    return f"system:serviceaccount:{namespace}:{account}"


async def allowed(
    kube,
    user: str,
    verb: str,
    resource: str,
    *,
    namespace: str = "",
    name: str = "",
    group: str = "",
    subresource: str = "",
) -> bool:
    """The real authorizer's answer (a SubjectAccessReview) for a service account."""
    namespace_of_account = user.split(":")[2]
    review = await client.AuthorizationV1Api(kube).create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{namespace_of_account}",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    "namespace": namespace,
                    "name": name,
                    "subresource": subresource,
                },
            },
        }
    )
    return bool(review.status.allowed)


async def _create(create, replace, namespace: str | None, body: dict) -> None:
    """Create, or replace what a previous apply made: applying twice is what an admin
    does after a policy change."""
    args = (namespace,) if namespace else ()
    try:
        await create(*args, body)
    except ApiException as e:
        if e.status != 409:
            raise
        if replace is not None:
            await replace(body["metadata"]["name"], *args, body)


async def apply_rendered_rbac(
    kube,
    policy: Policy | None,
    hub_namespace: str,
    accounts: tuple[str, ...] = ("hub",),
    gpu_service_account: str | None = None,
    *,
    create_hub_namespace: bool = True,
    lease: str | None = None,
) -> None:
    """As the docs say an admin does: the hub's namespace and accounts (the chart's), the
    policy's namespaces, then the RBAC ``manifests`` renders (again after a policy
    change). ``remove`` takes the cluster-wide part away again."""
    core = client.CoreV1Api(kube)
    rbac = client.RbacAuthorizationV1Api(kube)
    if create_hub_namespace:
        await core.create_namespace({"metadata": {"name": hub_namespace}})
    for account in dict.fromkeys((*accounts, gpu_service_account or accounts[0])):
        await _create(
            core.create_namespaced_service_account,
            None,
            hub_namespace,
            {"metadata": {"name": account}},
        )
    # the chart's own Role for the hub in its namespace
    await _create(
        rbac.create_namespaced_role,
        None,
        hub_namespace,
        {"metadata": {"name": "hub"}, "rules": Z2JH_HUB_RULES},
    )
    await _create(
        rbac.create_namespaced_role_binding,
        None,
        hub_namespace,
        {
            "metadata": {"name": "hub"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"},
            "subjects": [
                {"kind": "ServiceAccount", "name": accounts[0], "namespace": hub_namespace}
            ],
        },
    )
    if policy is None:  # a hub without the policy: the chart's Role is all it has
        return
    for obj in desired_objects(policy, hub_namespace):
        if obj["kind"] == "Namespace":
            await _create(core.create_namespace, None, None, obj)
    for obj in rbac_objects(policy, hub_namespace, accounts[0], gpu_service_account, lease):
        kind, meta = obj["kind"], obj["metadata"]
        if kind == "Role":
            await _create(
                rbac.create_namespaced_role,
                rbac.replace_namespaced_role,
                meta["namespace"],
                obj,
            )
        elif kind == "ClusterRole":
            await _create(rbac.create_cluster_role, rbac.replace_cluster_role, None, obj)
        elif kind == "ClusterRoleBinding":
            await _create(
                rbac.create_cluster_role_binding, rbac.replace_cluster_role_binding, None, obj
            )
        else:
            await _create(
                rbac.create_namespaced_role_binding,
                rbac.replace_namespaced_role_binding,
                meta["namespace"],
                obj,
            )


async def remove(kube, hub_namespace: str) -> None:
    """This hub's cluster-wide RBAC (the namespaced part goes with its namespaces; the
    shared spawner and service ClusterRoles stay for other hubs)."""
    rbac = client.RbacAuthorizationV1Api(kube)
    for name in (
        f"jupyterhub-gpu-read-{hub_namespace}",
        f"jupyterhub-gpu-reconcile-{hub_namespace}",
    ):
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                await delete(name)
            except ApiException as e:
                if e.status != 404:
                    raise


async def token_kubeconfig(kube, admin_kubeconfig: Path, namespace: str, account: str, path: Path):
    """A kubeconfig that authenticates as ``account`` (a token the API server issues)."""
    core = client.CoreV1Api(kube)
    token = await core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 7200}}
    )
    await asyncio.to_thread(_write_kubeconfig, admin_kubeconfig, account, token.status.token, path)
    return path


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _write_kubeconfig(admin_kubeconfig: Path, account: str, token: str, path: Path) -> None:
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    if not cluster["certificate-authority"].startswith("/"):
        cluster["certificate-authority"] = str(
            admin_kubeconfig.parent / cluster["certificate-authority"]
        )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "local", "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
