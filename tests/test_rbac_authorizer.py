"""The RBAC ``jupyterhub-gpu manifests`` renders, asked of the real API server's authorizer.

Each shipped example's RBAC is applied to the local cluster as the operations guide says;
then the authorizer (SubjectAccessReview) answers what the hub's account may do: nothing
that escalates (RoleBindings, Secrets or pods outside the policy's namespaces, a namespace
the policy does not name), and everything a spawn, the reconciler and the service need.
The reconciler itself then runs under that account, and a real hub spawns under it.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.config import new_client_from_config
from rbac_helpers import allowed, apply_rendered_rbac, remove, subject, token_kubeconfig, unique

from hub_helpers import delete_namespace, running_hub
from jupyterhub_gpu.config.values import load_values, policy_from_loaded
from jupyterhub_gpu.core.manifests import desired_objects
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.kube.reconciler import Reconciler
from kube_helpers import eventually

pytestmark = pytest.mark.k8s

EXAMPLES = ["university.yaml", "department.yaml", "enterprise.yaml"]


def example_policy(name: str, prefix: str):
    """A shipped example's policy, its group namespaces renamed for this test (the
    cluster is shared with other tests)."""
    values = load_values(["helm-values/base.yaml", f"helm-values/{name}"])
    values = copy.deepcopy(values)
    gpu_policy = values["hub"]["config"]["GPUPolicy"]
    if gpu_policy.get("namespace_per_group"):
        gpu_policy["namespace_prefix"] = prefix
    return policy_from_loaded(values)


@pytest.fixture
async def rendered(kube, core):
    made: list[tuple[str, list[str]]] = []

    async def apply(policy, hub_namespace, **accounts):
        namespaces = [
            o["metadata"]["name"]
            for o in desired_objects(policy, hub_namespace)
            if o["kind"] == "Namespace"
        ]
        made.append((hub_namespace, [n for n in namespaces if n != hub_namespace]))
        await apply_rendered_rbac(kube, policy, hub_namespace, **accounts)

    yield apply
    for hub_namespace, namespaces in made:
        await remove(kube, hub_namespace)
        for name in [hub_namespace, *namespaces]:
            await delete_namespace(core, name)


@pytest.mark.parametrize("example", EXAMPLES)
async def test_the_hubs_account_cannot_escalate_and_can_do_its_work(kube, rendered, example):
    hub_ns = unique("rbac-hub")
    policy = example_policy(example, f"{hub_ns}-")
    await rendered(policy, hub_ns)
    hub = subject(hub_ns, "hub")
    desired = desired_objects(policy, hub_ns)
    group_namespaces = [o["metadata"]["name"] for o in desired if o["kind"] == "Namespace"]
    server_namespaces = [hub_ns, *group_namespaces]

    async def can(verb, resource, **where):
        return await allowed(kube, hub, verb, resource, **where)

    # ---- nothing that escalates -------------------------------------------------------
    rbac = "rbac.authorization.k8s.io"
    for namespace in ["kube-system", "default", *server_namespaces]:
        assert not await can("create", "rolebindings", namespace=namespace, group=rbac)
        assert not await can("update", "rolebindings", namespace=namespace, group=rbac)
    assert not await can("create", "clusterrolebindings", group=rbac)
    for verb in ("bind", "escalate"):
        assert not await can(verb, "clusterroles", name="cluster-admin", group=rbac)
        assert not await can(verb, "clusterroles", name="jupyterhub-gpu-spawner", group=rbac)
    for namespace in ("kube-system", "default", "kube-public"):
        assert not await can("get", "secrets", namespace=namespace)
        assert not await can("list", "secrets", namespace=namespace)
        assert not await can("create", "pods", namespace=namespace)
        assert not await can("create", "resourcequotas", namespace=namespace)
        assert not await can(
            "create", "networkpolicies", namespace=namespace, group="networking.k8s.io"
        )
    assert not await can("list", "secrets")  # cluster wide
    for namespace in ("kube-system", "default", "kube-node-lease"):
        assert not await can("delete", "namespaces", name=namespace)
        assert not await can("patch", "namespaces", name=namespace)
    assert not await can(
        "delete", "priorityclasses", name="system-cluster-critical", group="scheduling.k8s.io"
    )
    assert not await can("patch", "nodes", name="any-node")
    assert not await can("create", "pods/exec", namespace=hub_ns)

    # ---- what a spawn, the reconciler and the service need ------------------------------
    assert await can("list", "nodes")
    assert await can("watch", "pods")  # cluster wide: a node's free capacity
    for namespace in server_namespaces:
        for resource in ("pods", "secrets", "services", "persistentvolumeclaims"):
            assert await can("create", resource, namespace=namespace), (resource, namespace)
        assert await can("delete", "pods", namespace=namespace)
        assert await can("get", "pods", namespace=namespace, subresource="log")
        assert await can("list", "events", namespace=namespace)
    for obj in desired:
        meta = obj["metadata"]
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        plural = {
            "Namespace": "namespaces",
            "PriorityClass": "priorityclasses",
            "ResourceQuota": "resourcequotas",
            "LimitRange": "limitranges",
            "NetworkPolicy": "networkpolicies",
            "ResourceClaimTemplate": "resourceclaimtemplates",
            "Queue": "queues",
            "ClusterQueue": "clusterqueues",
            "LocalQueue": "localqueues",
            "ResourceFlavor": "resourceflavors",
            "Cohort": "cohorts",
        }[obj["kind"]]
        where = {"namespace": meta.get("namespace", ""), "name": meta["name"], "group": group}
        for verb in ("create", "patch", "update", "delete"):
            assert await can(verb, plural, **where), (verb, obj["kind"], meta)


async def test_separate_accounts_get_only_their_own_half(kube, rendered):
    hub_ns = unique("rbac-two")
    policy = example_policy("enterprise.yaml", f"{hub_ns}-")
    await rendered(policy, hub_ns, accounts=("hub",), gpu_service_account="gpu-service")
    hub, gpu = subject(hub_ns, "hub"), subject(hub_ns, "gpu-service")
    team = f"{hub_ns}-ml-research"
    # the hub spawns, and writes none of the policy's objects
    assert await allowed(kube, hub, "create", "pods", namespace=team)
    assert await allowed(kube, hub, "create", "secrets", namespace=team)
    assert not await allowed(kube, hub, "create", "resourcequotas", namespace=team)
    assert not await allowed(kube, hub, "delete", "namespaces", name=team)
    # the service reconciles and deletes orphaned servers, and never touches Secrets
    assert await allowed(
        kube, gpu, "patch", "resourcequotas", namespace=team, name="jupyterhub-gpu"
    )
    assert await allowed(kube, gpu, "delete", "pods", namespace=team)
    assert await allowed(kube, gpu, "delete", "namespaces", name=team)
    assert not await allowed(kube, gpu, "get", "secrets", namespace=team)
    assert not await allowed(kube, gpu, "create", "pods", namespace=team)


async def test_the_service_replicas_may_hold_their_one_lease_and_no_other(kube, rendered):
    hub_ns = unique("rbac-lease")
    policy = example_policy("enterprise.yaml", f"{hub_ns}-")
    lease = "jupyterhub-gpu-service"
    await rendered(
        policy, hub_ns, accounts=("hub",), gpu_service_account="gpu-service", lease=lease
    )
    hub, gpu = subject(hub_ns, "hub"), subject(hub_ns, "gpu-service")
    leases = {"group": "coordination.k8s.io", "namespace": hub_ns}
    # its Lease: made, read and renewed
    assert await allowed(kube, gpu, "create", "leases", **leases)
    assert await allowed(kube, gpu, "get", "leases", name=lease, **leases)
    assert await allowed(kube, gpu, "update", "leases", name=lease, **leases)
    # no other Lease (another controller's leader election), nor deleting or listing its own
    for verb in ("get", "update", "delete"):
        assert not await allowed(kube, gpu, verb, "leases", name="kube-scheduler", **leases)
    assert not await allowed(kube, gpu, "delete", "leases", name=lease, **leases)
    assert not await allowed(kube, gpu, "list", "leases", **leases)
    # nor any Lease outside the hub's namespace (the nodes' heartbeats, the control plane's)
    for namespace in ("kube-node-lease", "kube-system", f"{hub_ns}-ml-research"):
        assert not await allowed(
            kube,
            gpu,
            "update",
            "leases",
            group="coordination.k8s.io",
            namespace=namespace,
            name=lease,
        )
        assert not await allowed(
            kube, gpu, "create", "leases", group="coordination.k8s.io", namespace=namespace
        )
    # and the hub's account has none of it
    assert not await allowed(kube, hub, "update", "leases", name=lease, **leases)
    assert not await allowed(kube, hub, "create", "leases", **leases)


def _reconciled_policy(hub_ns: str, groups: dict):
    return parse_policy(
        scheduler={
            "name": "default",
            "in_quota_priority_class": f"{hub_ns}-in",
            "over_quota_priority_class": f"{hub_ns}-over",
        },
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "a100"}}},
        groups=groups,
        namespace_per_group=True,
        namespace_prefix=f"{hub_ns}-",
    )


async def test_the_reconciler_does_its_work_under_the_rendered_rbac_and_nothing_more(
    kube, local_cluster, rendered, tmp_path
):
    hub_ns = unique("rbac-rec")
    groups = {
        "lab": {"quota": {"gpus": 2}, "profiles": ["gpu"]},
        "course": {"quota": {"gpus": 1}, "profiles": ["gpu"]},
    }
    policy = _reconciled_policy(hub_ns, groups)
    await rendered(policy, hub_ns)
    path = await token_kubeconfig(
        kube, local_cluster.state.kubeconfig, hub_ns, "hub", tmp_path / "hub.kubeconfig"
    )
    api = await new_client_from_config(config_file=str(path))
    try:
        reconciler = Reconciler(api, hub_namespace=hub_ns)
        first = await reconciler.reconcile(policy)
        # everything the policy implies, the PriorityClasses created by name included
        assert first.ok, first.summary()
        assert f"PriorityClass {hub_ns}-in" in first.created, first.summary()
        assert f"ResourceQuota {hub_ns}-lab/jupyterhub-gpu" in first.created, first.summary()
        again = await reconciler.reconcile(policy)
        assert again.ok, again.summary()
        assert again.writes == 0, again.summary()
        # a group dropped while the RBAC still names it: its objects go, its namespace stays
        fewer = _reconciled_policy(hub_ns, {"lab": groups["lab"]})
        pruned = await reconciler.reconcile(fewer)
        assert pruned.ok, pruned.summary()
        assert f"ResourceQuota {hub_ns}-course/jupyterhub-gpu" in pruned.pruned
        assert any(k.startswith(f"Namespace {hub_ns}-course") for k in pruned.kept)
        # an object the account may not touch is never one it writes: someone else's
        # namespace named by a policy it has no RBAC for is refused by the API server
        foreign = _reconciled_policy(hub_ns, {**groups, "intruder": groups["lab"]})
        refused = await reconciler.reconcile(foreign)
        assert not refused.ok
        assert any(f"{hub_ns}-intruder" in str(e) and "403" in str(e) for e in refused.errors)
        core = client.CoreV1Api(kube)
        names = {n.metadata.name for n in (await core.list_namespace()).items}
        assert f"{hub_ns}-intruder" not in names
    finally:
        await api.close()
        await Reconciler(kube, hub_namespace=hub_ns, prune_namespaces=True).remove_all()
        await asyncio.sleep(0)


async def test_a_real_hub_and_its_service_spawn_and_reconcile_under_exactly_the_rendered_rbac(
    local_cluster, core, kube, tmp_path, priority_class_objects
):
    """The hub and its GPU service run with the hub's service-account token, granted only
    the chart's Role and what ``manifests`` renders: a member's server starts in their
    group's namespace, every task of the service works, and the reconcile pass is clean."""
    from test_service_hub import aget, start_server, user_token

    async def task_states(hub, token):
        status, _, body = await aget(hub.service_url + "api/usage", token)
        return {t["name"]: t for t in json.loads(body)["tasks"]} if status == 200 else {}

    prefix = unique("rbac-real")
    policy = {
        "namespace_per_group": True,
        "namespace_prefix": f"{prefix}-",
        "flavors": {"a100": {"kind": "gpu"}},
        "profiles": {
            "gpu": {
                "display_name": "GPU",
                "cpu": "100m",
                "memory": "64Mi",
                "gpu": {"flavor": "a100"},
            }
        },
        "groups": {"lab": {"quota": {"gpus": 1}, "profiles": ["gpu"]}},
    }
    async with running_hub(
        local_cluster,
        core,
        users={"ann": ["lab"]},
        admin_users=("root",),
        policy=policy,
        gpu_service=True,
        extra_config=(
            "c.GPUService.reconcile_interval = 2\n"
            'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
            '"services": ["demo-admin"]})\n'
        ),
    ) as hub:
        # running_hub's default, as for every real-hub test: the hub's own token
        (user,) = yaml.safe_load(hub.kubeconfig.read_text())["users"]
        assert set(user["user"]) == {"token"}
        assert hub.service_kubeconfig == hub.kubeconfig
        await start_server(hub, "ann", "lab--gpu")
        pods = await core.list_namespaced_pod(f"{prefix}-lab")
        assert [p.metadata.labels["hub.jupyter.org/username"] for p in pods.items] == ["ann"]
        token = await user_token(hub, "root")

        seen: dict = {}

        async def all_tasks_ok():
            seen.update(await task_states(hub, token))
            return "reconcile" in seen and all(t["ok"] for t in seen.values())

        try:
            await eventually(all_tasks_ok, "every task of the service to succeed", within=90)
        except AssertionError:
            failing = {n: t["last_error"] for n, t in seen.items() if not t["ok"]}
            raise AssertionError(f"tasks failing under the rendered RBAC: {failing}") from None
        quota = await core.read_namespaced_resource_quota("jupyterhub-gpu", f"{prefix}-lab")
        assert quota.spec.hard  # the group's quota, written by the service
