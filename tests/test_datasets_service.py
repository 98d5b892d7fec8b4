"""Datasets whose claim is missing, with a real hub, its GPU service and the local cluster.

One hub for the module, its servers in its own namespace. ``research`` and
``vision`` are labs of ``department``, which starts no servers of its own but
lists the data every lab mounts (``dept-shared``, made before the hub starts).
Each lab's own claim (``research-scratch``, ``vision-scratch``) is missing at
first: the service reports it in ``api/usage``, its metrics and the dashboard,
the hub refuses the lab's spawns naming it, and once a test creates the claim
the report clears within the service's ``datasets_interval`` and the spawn
starts a server that mounts it.

The claims are PersistentVolumeClaim objects. The report's claim matches no
volume and stays Pending: its existence is all the service and the hub's refusal
look at. A server's pod can only be placed once its claims are bound, so the
spawn test binds them as a storage admin's pre-provisioned volume is bound: a
PersistentVolume reserved for the claim, and the claim naming it. The third test
runs the service with a service account that may not read claims.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from kubernetes_asyncio import client
from test_service_failures import RESTRICTED, service_account_kubeconfig

from hub_helpers import api, logged_in_opener, no_server, pod_json, ready, running_hub
from jupyterhub_gpu.core.shaping import GROUP_LABEL
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import create_bound_claim, create_claim, eventually, remove_claims
from test_service_hub import aget, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

POLICY = {
    "profiles": {"cpu": {"cpu": "100m", "memory": "128Mi"}},
    "datasets": {
        "imagenet": {
            "display_name": "ImageNet",
            # nothing mounts it in the local cluster (its pods are processes)
            "nfs": {"server": "127.0.0.1", "path": "/export/imagenet"},
            "mount_path": "/data/imagenet",
            "read_only": True,
        },
        "shared": {
            "display_name": "Department data",
            "claim": "dept-shared",
            "mount_path": "/data/shared",
            "read_only": True,
        },
        "scratch": {
            "display_name": "Research scratch",
            "claim": "research-scratch",
            "mount_path": "/data/scratch",
        },
        "vision": {"claim": "vision-scratch", "mount_path": "/data/vision"},
    },
    "groups": {
        "department": {"datasets": ["shared"]},
        "research": {
            "parent": "department",
            "profiles": ["cpu"],
            "datasets": ["imagenet", "scratch"],
        },
        "vision": {"parent": "department", "profiles": ["cpu"], "datasets": ["vision"]},
        "students": {"profiles": ["cpu"]},
    },
}
#: the service's check, short for the test (default 60 s)
INTERVAL = 2
TOKEN_ISSUER = (
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    '"services": ["demo-admin"]})\n'
)
MISSING_METRIC = "jupyterhub_gpu_dataset_claim_missing"


@pytest.fixture(scope="module")
async def datasets_hub(local_cluster, core, priority_class_objects):
    async with running_hub(
        local_cluster,
        core,
        start=False,
        users={"ann": ["research"], "vic": ["vision"], "bo": ["students"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_settings={"datasets_interval": INTERVAL, "hub_poll_interval": 1},
        extra_config=TOKEN_ISSUER + "c.KubeSpawner.http_timeout = 120\n",
    ) as hub:
        try:
            # the department's data is there from the start, as a storage admin left it
            await create_bound_claim(core, hub.namespace, "dept-shared")
            await asyncio.to_thread(hub.start)
            await wait_for_service(hub)
            yield hub
        finally:
            # nothing here protects a claim in use: they may go before the servers
            await remove_claims(core, hub.namespace)


async def why_not_running(core, namespace: str) -> str:
    """The pods, claims and events of ``namespace``: why a server did not come up."""
    lines = []
    for pod in (await core.list_namespaced_pod(namespace)).items:
        conditions = [(c.type, c.status, c.reason, c.message) for c in pod.status.conditions or []]
        lines.append(f"pod {pod.metadata.name}: {pod.status.phase} {conditions}")
    for claim in (await core.list_namespaced_persistent_volume_claim(namespace)).items:
        lines.append(
            f"claim {claim.metadata.name}: {claim.status.phase}, volume {claim.spec.volume_name}"
        )
    for event in (await core.list_namespaced_event(namespace)).items:
        lines.append(f"event {event.involved_object.name}: {event.reason}: {event.message}")
    return "\n".join(lines)


def datasets_of(view: dict, group: str) -> dict[str, dict]:
    (found,) = [g for g in view["groups"] if g["name"] == group]
    return {d["name"]: d for d in found["datasets"]}


def metric(text: str, **labels: str) -> float | None:
    """The value of the series of ``MISSING_METRIC`` with these labels, if there is one."""
    for line in text.splitlines():
        if not line.startswith(MISSING_METRIC + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return None


async def metrics_text(hub: LocalHub) -> str:
    # the demo-admin service's token has read:metrics, as a Prometheus would
    status, _, body = await aget(hub.service_url + "metrics", hub.api_token)
    assert status == 200, body
    return body


def dashboard(hub: LocalHub, user: str) -> str:
    """The service's page as ``user``'s browser gets it: logged in at the hub, then OAuth."""
    opener = logged_in_opener(hub.url, user, hub.password)
    return opener.open(hub.service_url, timeout=60).read().decode()


async def test_a_missing_claim_is_reported_until_it_is_created(datasets_hub, core):
    hub = datasets_hub
    root = await user_token(hub, "root")
    scratch = {
        "group": "research",
        "dataset": "scratch",
        "claim": "research-scratch",
        "namespace": hub.namespace,
    }

    async def checked():
        view, _ = await usage(hub, root)
        return view if datasets_of(view, "research")["scratch"]["status"] != "unknown" else None

    view = await eventually(checked, "the service's first check of the claims", within=60)
    research = datasets_of(view, "research")
    assert list(research) == ["shared", "imagenet", "scratch"]
    assert research["scratch"] == {
        "name": "scratch",
        "display_name": "Research scratch",
        "description": "",
        "mount_path": "/data/scratch",
        "read_only": False,
        "kind": "claim",
        "claim": "research-scratch",
        "namespace": hub.namespace,
        "missing": True,
        "status": "missing",
        "problem": f"claim research-scratch is missing in namespace {hub.namespace}: servers "
        "of this group cannot start until an admin creates it (or removes the dataset from "
        "the group)",
    }
    assert (research["shared"]["claim"], research["shared"]["missing"]) == ("dept-shared", False)
    assert (research["imagenet"]["kind"], research["imagenet"]["missing"]) == ("nfs", False)
    # the department starts no servers: its namespace needs no claim
    assert datasets_of(view, "department")["shared"]["status"] == "not_needed"
    tasks = {t["name"]: t for t in view["tasks"]}
    assert "missing claim(s)" in tasks["dataset claims"]["last_result"]
    assert f"{hub.namespace}/research-scratch" in tasks["dataset claims"]["last_result"]

    # a member sees their own group's datasets, nothing of the others'
    member, raw = await usage(hub, await user_token(hub, "bo"))
    assert [g["name"] for g in member["groups"]] == ["students", "everyone"]
    assert datasets_of(member, "students") == {}
    for leaked in ("research-scratch", "vision-scratch", "dept-shared", "Research scratch"):
        assert leaked not in raw
    ann, _ = await usage(hub, await user_token(hub, "ann"))
    assert [g["name"] for g in ann["groups"]] == ["research", "everyone"]
    assert datasets_of(ann, "research")["scratch"]["missing"] is True

    text = await metrics_text(hub)
    assert metric(text, **scratch) == 1.0
    shared = {**scratch, "dataset": "shared", "claim": "dept-shared"}
    assert metric(text, **shared) == 0.0
    assert metric(text, **{**shared, "group": "department"}) is None

    page = await asyncio.to_thread(dashboard, hub, "root")
    assert "<b>Research scratch</b> at <code>/data/scratch</code> (read-write)" in page
    assert "<b>Department data</b> at <code>/data/shared</code> (read-only)" in page
    assert "<b>ImageNet</b> at <code>/data/imagenet</code> (read-only)" in page
    assert (
        f'<div class="err">claim research-scratch is missing in namespace {hub.namespace}: '
        "servers of this group cannot start" in page
    )

    await create_claim(core, hub.namespace, "research-scratch")

    async def cleared():
        view, _ = await usage(hub, root)
        return view if not datasets_of(view, "research")["scratch"]["missing"] else None

    # within the check's interval (and a scrape), with room for a loaded machine
    view = await eventually(cleared, "the missing claim to clear", within=INTERVAL * 5)
    assert datasets_of(view, "research")["scratch"]["status"] == "ok"
    assert metric(await metrics_text(hub), **scratch) == 0.0
    page = await asyncio.to_thread(dashboard, hub, "root")
    assert "claim research-scratch is missing" not in page
    assert "<b>Research scratch</b> at <code>/data/scratch</code> (read-write)" in page


async def test_the_hub_refuses_a_spawn_whose_claim_is_missing_then_mounts_it_once_created(
    datasets_hub, core
):
    hub = datasets_hub
    status, body = await api(hub, "POST", "/users/vic/server", {"profile": "vision--cpu"})
    assert status == 403, body
    assert "vision-scratch" in body["message"], body
    assert hub.namespace in body["message"], body
    await asyncio.sleep(1)
    pods = await core.list_namespaced_pod(hub.namespace, label_selector=f"{GROUP_LABEL}=vision")
    assert pods.items == []
    assert await no_server(hub, "vic")

    await create_bound_claim(core, hub.namespace, "vision-scratch")
    status, body = await api(hub, "POST", "/users/vic/server", {"profile": "vision--cpu"})
    assert status in (201, 202), body
    try:
        await eventually(lambda: ready(hub, "vic"), "vic's server to be ready", within=180)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{await why_not_running(core, hub.namespace)}") from None
    pod = await pod_json(core, hub.namespace, "jupyter-vic")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (notebook,) = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    mounts = {m["mountPath"]: m for m in notebook["volumeMounts"]}
    # (the API server leaves a false readOnly out of what it stores)
    assert volumes["dataset-vision"]["persistentVolumeClaim"] == {"claimName": "vision-scratch"}
    assert volumes["dataset-shared"]["persistentVolumeClaim"] == {
        "claimName": "dept-shared",
        "readOnly": True,
    }
    assert mounts["/data/vision"] == {"name": "dataset-vision", "mountPath": "/data/vision"}
    assert mounts["/data/shared"] == {
        "name": "dataset-shared",
        "mountPath": "/data/shared",
        "readOnly": True,
    }
    # research's data is research's alone
    assert "/data/scratch" not in mounts
    assert json.dumps(pod).count("research-scratch") == 0


async def test_without_rbac_to_read_claims_the_check_says_what_to_grant_then_recovers(
    local_cluster, kube, core, priority_class_objects, tmp_path
):
    """The service with a service account that reads pods in the hub's namespace and
    nothing else: the claims are not known (not reported missing), the task names the
    claim and the grant; once granted, the next check finds the missing claim."""
    kubeconfig = tmp_path / "hub.kubeconfig"
    async with running_hub(
        local_cluster,
        core,
        start=False,
        users={"ann": ["research"]},
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_kubeconfig=kubeconfig,
        service_settings={"datasets_interval": INTERVAL, "hub_poll_interval": 1},
        extra_config=TOKEN_ISSUER,
    ) as hub:
        await service_account_kubeconfig(kube, core, local_cluster, hub.namespace, kubeconfig)
        await asyncio.to_thread(hub.start)
        await wait_for_service(hub)
        root = await user_token(hub, "root")

        async def failed():
            view, _ = await usage(hub, root)
            task = {t["name"]: t for t in view["tasks"]}.get("dataset claims", {})
            return view if task.get("consecutive_failures") else None

        view = await eventually(failed, "the check of the claims to fail", within=60)
        error = {t["name"]: t for t in view["tasks"]}["dataset claims"]["last_error"]
        assert "dataset claim(s) not read" in error
        assert f"reading PersistentVolumeClaim {hub.namespace}/" in error
        assert "HTTP 403: grant the hub's service account get on persistentvolumeclaims" in error
        scratch = datasets_of(view, "research")["scratch"]
        assert (scratch["status"], scratch["missing"]) == ("unknown", False)
        assert "not known" in scratch["problem"]
        text = await metrics_text(hub)
        assert MISSING_METRIC + "{" not in text

        # the grant z2jh's hub Role has in the hub's namespace
        rbac = client.RbacAuthorizationV1Api(kube)
        await rbac.create_namespaced_role(
            hub.namespace,
            {
                "metadata": {"name": "claims"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["persistentvolumeclaims"],
                        "verbs": ["get"],
                    }
                ],
            },
        )
        await rbac.create_namespaced_role_binding(
            hub.namespace,
            {
                "metadata": {"name": "claims"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "claims",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": RESTRICTED, "namespace": hub.namespace}
                ],
            },
        )

        async def found_missing():
            view, _ = await usage(hub, root)
            return view if datasets_of(view, "research")["scratch"]["missing"] else None

        view = await eventually(found_missing, "the claim to be read after the grant", within=30)
        assert {t["name"]: t for t in view["tasks"]}["dataset claims"]["ok"] is True
        scratch = {
            "group": "research",
            "dataset": "scratch",
            "claim": "research-scratch",
            "namespace": hub.namespace,
        }
        assert metric(await metrics_text(hub), **scratch) == 1.0
