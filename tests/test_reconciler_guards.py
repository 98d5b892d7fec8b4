"""What the reconciler will not delete, against the real local control plane.

Deleting is the one write that cannot be undone: a policy without groups (what a
policy that failed to load looks like) prunes nothing, a namespace is deleted
only with ``prune_namespaces`` and never while it holds pods, and a dry run
writes nothing at all.
"""

from __future__ import annotations

import pytest
from test_reconciler import make_policy, owned, two_groups

from jupyterhub_gpu.core.manifests import desired_objects, identity
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.kube.reconciler import Reconciler
from kube_helpers import eventually, pod_manifest

pytestmark = pytest.mark.k8s


@pytest.fixture
async def hub(kube, namespace):
    """A hub namespace; afterwards everything reconciled for it is removed."""
    yield namespace
    report = await Reconciler(kube, namespace).remove_all()
    assert report.ok, report.summary()


async def test_a_policy_without_groups_prunes_nothing(kube, hub, core):
    reconciler = Reconciler(kube, hub, prune_namespaces=True)
    first = await reconciler.reconcile(two_groups(f"{hub}-"))
    assert first.ok, first.summary()
    before = set(await owned(kube, hub))

    empty = parse_policy(namespace_per_group=True, namespace_prefix=f"{hub}-")
    report = await reconciler.reconcile(empty)
    assert report.ok, report.summary()
    assert report.pruned == []
    assert report.writes == 0
    assert set(await owned(kube, hub)) == before
    assert f"Namespace {hub}-lab: the policy has no groups (pruning skipped)" in report.kept
    assert "kept" in report.summary()
    ns = await core.read_namespace(f"{hub}-lab")
    assert ns.metadata.deletion_timestamp is None


async def test_a_dropped_group_keeps_its_namespace_unless_prune_namespaces(kube, hub, core):
    prefix = f"{hub}-"
    only_org = make_policy(prefix, org={"quota": {"gpus": 8}, "profiles": ["gpu"]})
    reconciler = Reconciler(kube, hub)  # prune_namespaces off: the default
    assert (await reconciler.reconcile(two_groups(prefix))).ok

    report = await reconciler.reconcile(only_org)
    assert report.ok, report.summary()
    # what the service made in the namespace goes; the namespace stays, reported
    assert f"ResourceQuota {prefix}lab/jupyterhub-gpu" in report.pruned
    assert f"Namespace {prefix}lab" not in report.pruned
    assert any(
        k.startswith(f"Namespace {prefix}lab: ") and "prune_namespaces" in k for k in report.kept
    )
    assert (await core.read_namespace(f"{prefix}lab")).metadata.deletion_timestamp is None

    pruning = Reconciler(kube, hub, prune_namespaces=True)
    report = await pruning.reconcile(only_org)
    assert report.pruned == [f"Namespace {prefix}lab"]
    assert (await core.read_namespace(f"{prefix}lab")).metadata.deletion_timestamp is not None
    want = {identity(o) for o in desired_objects(only_org, hub)}
    assert set(await owned(kube, hub)) == want


async def test_a_namespace_holding_pods_is_never_deleted(kube, hub, core):
    prefix = f"{hub}-"
    reconciler = Reconciler(kube, hub, prune_namespaces=True)
    assert (await reconciler.reconcile(two_groups(prefix))).ok
    lab = f"{prefix}lab"

    async def account():
        names = [a.metadata.name for a in (await core.list_namespaced_service_account(lab)).items]
        return "default" in names or None

    await eventually(account, "the lab namespace's service account")
    await core.create_namespaced_pod(
        lab, pod_manifest("someones-server", {"cpu": "100m", "memory": "64Mi"})
    )

    only_org = make_policy(prefix, org={"quota": {"gpus": 8}, "profiles": ["gpu"]})
    report = await reconciler.reconcile(only_org)
    assert report.ok, report.summary()
    assert f"Namespace {lab}" not in report.pruned
    assert (
        f"Namespace {lab}: holds 1 pod; not deleted (stop its servers, and a later pass deletes it)"
        in report.kept
    )
    assert (await core.read_namespace(lab)).metadata.deletion_timestamp is None
    assert (
        await core.read_namespaced_pod("someones-server", lab)
    ).metadata.deletion_timestamp is None

    # once the servers are gone, a later pass deletes it
    await core.delete_namespaced_pod("someones-server", lab, grace_period_seconds=0)

    async def gone():
        return not (await core.list_namespaced_pod(lab)).items or None

    await eventually(gone, "the pod to go")
    report = await reconciler.reconcile(only_org)
    assert report.pruned == [f"Namespace {lab}"]


async def test_a_dry_run_writes_nothing_and_says_what_it_would_do(kube, hub, core):
    prefix = f"{hub}-"
    policy = two_groups(prefix)
    dry = Reconciler(kube, hub, prune_namespaces=True, dry_run=True)
    report = await dry.reconcile(policy)
    assert report.ok, report.summary()
    assert report.writes == 0
    assert await owned(kube, hub) == {}
    want = {identity(o) for o in desired_objects(policy, hub)}
    assert len(report.created) == len(want)
    summary = report.summary()
    assert summary.startswith("dry run, nothing written:")
    assert f"  would create Namespace {prefix}lab" in summary.splitlines()

    assert (await Reconciler(kube, hub, prune_namespaces=True).reconcile(policy)).ok
    only_org = make_policy(prefix, org={"quota": {"gpus": 8}, "profiles": ["gpu"]})
    report = await dry.reconcile(only_org)
    assert report.writes == 0
    assert f"Namespace {prefix}lab" in report.pruned
    assert (
        f"  would prune ResourceQuota {prefix}lab/jupyterhub-gpu" in report.summary().splitlines()
    )
    assert set(await owned(kube, hub)) == want
