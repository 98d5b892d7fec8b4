"""The reconciler against the real local control plane, with the schedulers' real CRDs."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from jupyterhub_gpu.core.manifests import HUB_LABEL, OWNER, OWNER_LABEL, desired_objects, identity
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.kube.reconciler import KINDS, Reconciler
from jupyterhub_gpu_dev.localcluster import crds
from kube_helpers import created_once_quota_admits, eventually, pod_manifest

pytestmark = pytest.mark.k8s
REPO = Path(__file__).resolve().parent.parent

FLAVORS = {
    "a100": {"kind": "gpu"},
    "mig-1g": {"kind": "mig", "profile": "1g.5gb"},
    "shared": {"kind": "timeslice", "replicas": 4},
    "claim": {"kind": "dra", "device_class": "gpu.nvidia.com"},
}
PROFILES = {
    "cpu": {"cpu": "500m", "memory": "1Gi"},
    "gpu": {"cpu": 1, "memory": "2Gi", "gpu": {"flavor": "a100"}},
    "mig": {"cpu": 1, "memory": "2Gi", "gpu": {"flavor": "mig-1g"}},
    "dra": {"cpu": 1, "memory": "2Gi", "gpu": {"flavor": "claim", "count": 2}},
}


def make_policy(prefix: str, scheduler: str = "default", **groups):
    return parse_policy(
        scheduler={"name": scheduler},
        flavors=FLAVORS,
        profiles=PROFILES,
        everyone={"profiles": ["cpu"]},
        groups=groups,
        namespace_per_group=True,
        namespace_prefix=prefix,
    )


def two_groups(prefix: str, scheduler: str = "default", lab_gpus: int = 2):
    return make_policy(
        prefix,
        scheduler,
        org={"quota": {"gpus": 8}, "profiles": ["gpu"]},
        lab={
            "parent": "org",
            "quota": {"gpus": lab_gpus, "cpu": 8, "memory": "16Gi", "servers": 4},
            "profiles": ["gpu", "mig", "dra", "cpu"],
        },
    )


async def settled(kube, hub: str) -> dict[tuple, dict]:
    """``owned`` once controllers have finished their own writes (e.g. quota status)."""
    found = await owned(kube, hub)
    for _ in range(50):
        await asyncio.sleep(0.5)
        again = await owned(kube, hub)
        if _versions(again) == _versions(found):
            return again
        found = again
    raise AssertionError("objects kept changing for 25 s")


def _versions(objects: dict[tuple, dict]) -> dict[tuple, str]:
    return {key: obj["metadata"]["resourceVersion"] for key, obj in objects.items()}


async def owned(kube, hub: str) -> dict[tuple, dict]:
    """Every object of a kind the reconciler manages carrying our labels, by identity."""
    api = Reconciler(kube, hub)
    found = {}
    for kind in KINDS:
        try:
            items = await api._list(kind)
        except client.ApiException as e:
            if e.status == 404:
                continue
            raise
        for item in items:
            if not item["metadata"].get("deletionTimestamp"):
                found[identity(item)] = item
    return found


@pytest.fixture
async def hub(kube, namespace):
    """A hub namespace; afterwards everything reconciled for it is pruned."""
    yield namespace
    report = await Reconciler(kube, namespace).remove_all()
    assert report.ok, report.summary()


@pytest.fixture(scope="session")
async def scheduler_crds(kube):
    """Installs one scheduler's CRDs (from its pinned Go module) on demand."""

    async def install(scheduler: str) -> None:
        await crds.install(kube, scheduler)

    return install


async def test_applying_creates_exactly_the_desired_objects_and_a_second_pass_writes_nothing(
    kube, hub, scheduler_crds
):
    await scheduler_crds("kueue")
    policy = two_groups(f"{hub}-", "kueue")
    reconciler = Reconciler(kube, hub)
    desired = {identity(o) for o in desired_objects(policy, hub)}
    assert len(desired) > 20

    first = await reconciler.reconcile(policy)
    assert first.ok, first.summary()
    assert len(first.created) == len(desired)
    assert first.writes == len(desired)
    live = await settled(kube, hub)
    assert set(live) == desired

    writes_before = reconciler.writes
    second = await reconciler.reconcile(policy)
    assert second.ok, second.summary()
    assert (second.created, second.updated, second.pruned) == ([], [], [])
    assert second.unchanged == len(desired)
    assert second.writes == 0
    assert reconciler.writes == writes_before
    assert _versions(await owned(kube, hub)) == _versions(live)


async def test_a_quota_change_updates_and_a_removed_group_is_pruned_leaving_others_alone(
    kube, hub, core
):
    prefix = f"{hub}-"
    reconciler = Reconciler(kube, hub, prune_namespaces=True)
    report = await reconciler.reconcile(two_groups(prefix, lab_gpus=2))
    assert report.ok, report.summary()
    lab_ns = f"{prefix}lab"
    quota = await core.read_namespaced_resource_quota("jupyterhub-gpu", lab_ns)
    assert quota.spec.hard["requests.nvidia.com/gpu"] == "2"

    # objects that are not ours: no labels, and our owner label for another hub
    org_ns = f"{prefix}org"
    await core.create_namespaced_resource_quota(
        org_ns, {"metadata": {"name": "admins-own"}, "spec": {"hard": {"pods": "100"}}}
    )
    other_hub = f"{hub}-other"
    await core.create_namespace(
        {"metadata": {"name": other_hub, "labels": {OWNER_LABEL: OWNER, HUB_LABEL: "elsewhere"}}}
    )
    try:
        changed = await reconciler.reconcile(two_groups(prefix, lab_gpus=3))
        assert changed.ok, changed.summary()
        assert changed.updated == [f"ResourceQuota {lab_ns}/jupyterhub-gpu"]
        assert changed.created == []
        assert changed.pruned == []
        assert changed.writes == 1
        quota = await core.read_namespaced_resource_quota("jupyterhub-gpu", lab_ns)
        assert quota.spec.hard["requests.nvidia.com/gpu"] == "3"
        assert quota.spec.hard["requests.nvidia.com/mig-1g.5gb"] == "21"

        # someone edits our quota by hand: the next pass puts it back
        await core.patch_namespaced_resource_quota(
            "jupyterhub-gpu", lab_ns, {"spec": {"hard": {"requests.nvidia.com/gpu": "50"}}}
        )
        restored = await reconciler.reconcile(two_groups(prefix, lab_gpus=3))
        assert restored.updated == [f"ResourceQuota {lab_ns}/jupyterhub-gpu"]
        quota = await core.read_namespaced_resource_quota("jupyterhub-gpu", lab_ns)
        assert quota.spec.hard["requests.nvidia.com/gpu"] == "3"

        only_org = make_policy(prefix, org={"quota": {"gpus": 8}, "profiles": ["gpu"]})
        pruned = await reconciler.reconcile(only_org)
        assert pruned.ok, pruned.summary()
        assert f"Namespace {lab_ns}" in pruned.pruned
        assert f"ResourceQuota {lab_ns}/jupyterhub-gpu" in pruned.pruned
        assert f"ResourceClaimTemplate {lab_ns}/jupyterhub-gpu-claim-x2" in pruned.pruned
        assert not any(org_ns in name for name in pruned.pruned)
        namespace = await core.read_namespace(lab_ns)
        assert namespace.metadata.deletion_timestamp is not None
        assert (await core.read_namespace(org_ns)).metadata.deletion_timestamp is None
        own = await core.read_namespaced_resource_quota("admins-own", org_ns)
        assert own.spec.hard == {"pods": "100"}
        assert (await core.read_namespace(other_hub)).metadata.deletion_timestamp is None
        assert set(await owned(kube, hub)) == {identity(o) for o in desired_objects(only_org, hub)}
    finally:
        await core.delete_namespace(other_hub)


async def test_the_resource_quota_stops_an_over_quota_pod_created_outside_the_hub(kube, hub, core):
    prefix = f"{hub}-"
    policy = make_policy(
        prefix, lab={"quota": {"gpus": 1}, "limit": {"gpus": 2}, "profiles": ["gpu", "cpu"]}
    )
    report = await Reconciler(kube, hub).reconcile(policy)
    assert report.ok, report.summary()
    lab_ns = f"{prefix}lab"

    async def ready():
        quota = await core.read_namespaced_resource_quota("jupyterhub-gpu", lab_ns)
        accounts = await core.list_namespaced_service_account(lab_ns)
        return quota.status.hard and any(a.metadata.name == "default" for a in accounts.items)

    await eventually(ready, "the quota controller to count the lab namespace")
    # within the limit (2 GPUs): admitted; no cpu/memory given, the LimitRange fills them in
    fits = pod_manifest("fits", {"nvidia.com/gpu": "2"})
    del fits["spec"]["containers"][0]["resources"]["requests"]
    created = await created_once_quota_admits(
        lambda: core.create_namespaced_pod(lab_ns, fits), "a pod within the limit"
    )
    assert created.spec.containers[0].resources.requests["cpu"] == "500m"

    with pytest.raises(client.ApiException) as refused:
        await core.create_namespaced_pod(lab_ns, pod_manifest("over", {"nvidia.com/gpu": "1"}))
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert "exceeded quota: jupyterhub-gpu" in message
    assert "requests.nvidia.com/gpu" in message
    # a resource the group's profiles never use is capped at 0, not unlimited
    with pytest.raises(client.ApiException) as shared:
        await core.create_namespaced_pod(
            lab_ns, pod_manifest("shared", {"nvidia.com/gpu.shared": "1"})
        )
    assert shared.value.status == 403
    await core.delete_namespaced_pod("fits", lab_ns, grace_period_seconds=0)


@pytest.mark.parametrize("scheduler", ["kai", "volcano"])
async def test_kai_and_volcano_queues_are_accepted_and_stable(kube, hub, scheduler_crds, scheduler):
    await scheduler_crds(scheduler)
    policy = two_groups(f"{hub}-", scheduler)
    reconciler = Reconciler(kube, hub)
    first = await reconciler.reconcile(policy)
    assert first.ok, first.summary()
    custom = client.CustomObjectsApi(kube)
    group, version = {
        "kai": ("scheduling.run.ai", "v2"),
        "volcano": ("scheduling.volcano.sh", "v1beta1"),
    }[scheduler]
    lab = await custom.get_cluster_custom_object(group, version, "queues", "lab")
    if scheduler == "kai":
        assert lab["spec"]["parentQueue"] == "org"
        assert lab["spec"]["resources"]["gpu"]["quota"] == 2
        assert lab["spec"]["resources"]["memory"]["quota"] == pytest.approx(16 * 2**30 / 10**6)
    else:
        assert lab["spec"]["parent"] == "org"
        assert lab["spec"]["deserved"]["nvidia.com/gpu"] == "2"
    second = await reconciler.reconcile(policy)
    assert second.writes == 0, second.summary()


async def test_a_missing_crd_is_reported_with_the_fix_and_other_kinds_still_apply(
    kube, hub, scheduler_crds
):
    await crds.uninstall(kube, "volcano")
    policy = two_groups(f"{hub}-", "volcano")
    reconciler = Reconciler(kube, hub)
    report = await reconciler.reconcile(policy)
    queues = [o for o in desired_objects(policy, hub) if o["kind"] == "Queue"]
    assert len(report.errors) == len(queues) == 3  # org, lab, everyone
    for error in report.errors:
        assert error.kind == "scheduling.volcano.sh/v1beta1 Queue"
        assert "install Volcano" in error.message
        assert "scheduler.name" in error.message
    assert f"Namespace {hub}-lab" in report.created
    assert f"ResourceQuota {hub}-lab/jupyterhub-gpu" in report.created

    await scheduler_crds("volcano")
    later = await reconciler.reconcile(policy)
    assert later.ok, later.summary()
    assert sorted(later.created) == sorted(f"Queue {q['metadata']['name']}" for q in queues)


def _plural(kind: str) -> str:
    irregular = {"NetworkPolicy": "networkpolicies", "PriorityClass": "priorityclasses"}
    return irregular.get(kind, kind.lower() + "s")


async def _dry_run_apply(kube, obj: dict) -> None:
    version = obj["apiVersion"]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    namespace = obj["metadata"].get("namespace")
    path = base + (f"/namespaces/{namespace}" if namespace else "")
    path += f"/{_plural(obj['kind'])}/{obj['metadata']['name']}"
    await kube.call_api(
        path,
        "PATCH",
        query_params=[
            ("fieldManager", "gitops"),
            ("dryRun", "All"),
            ("force", "true"),
            ("fieldValidation", "Strict"),  # an unknown field fails instead of being dropped
        ],
        header_params={"Content-Type": "application/apply-patch+yaml"},
        body=obj,
        auth_settings=["BearerToken"],
        response_types_map={},
    )


@pytest.mark.parametrize("example", ["university", "department", "enterprise"])
async def test_manifests_of_each_example_are_accepted_by_the_api_server(
    kube, core, namespace, scheduler_crds, example
):
    for scheduler in ("kai", "volcano", "kueue"):
        await scheduler_crds(scheduler)
    command = [sys.executable, "-m", "jupyterhub_gpu.cli", "manifests"]
    process = await asyncio.create_subprocess_exec(
        *command,
        f"helm-values/{example}.yaml",
        "--hub-namespace",
        namespace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    objects = list(yaml.safe_load_all(stdout))
    assert objects
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    # a dry run does not create the namespaces the rest live in: create those for real
    for ns in namespaces:
        await core.create_namespace(ns)
    try:
        refused = []
        for obj in objects:
            try:
                await _dry_run_apply(kube, obj)
            except client.ApiException as e:
                refused.append(f"{obj['kind']} {obj['metadata']['name']}: {e.status} {e.body}")
        assert refused == []
    finally:
        for ns in namespaces:
            await core.delete_namespace(ns["metadata"]["name"])
