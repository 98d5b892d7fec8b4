"""The reconciler's pure decision: is a live object already what the policy wants?"""

from __future__ import annotations

from jupyterhub_gpu.kube.reconciler import (
    APPLIED_HASH,
    FIELD_MANAGER,
    KINDS,
    Reconciler,
    ReconcileReport,
    contains,
)

QUOTA_KIND = next(k for k in KINDS if k.kind == "ResourceQuota")


def desired(hard: dict[str, str], digest: str = "abc") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "n", "annotations": {APPLIED_HASH: digest}},
        "spec": {"hard": hard},
    }


def live(hard: dict[str, str], digest: str = "abc", managers=(FIELD_MANAGER,)) -> dict:
    obj = desired(hard, digest)
    obj["metadata"]["resourceVersion"] = "7"
    obj["metadata"]["managedFields"] = [{"manager": m, "operation": "Apply"} for m in managers]
    obj["status"] = {"hard": hard}
    return obj


def test_quantities_compare_by_value_and_server_defaults_do_not_count_as_drift():
    assert contains({"memory": "2Gi"}, {"memory": "2048Mi"})
    assert contains({"cpu": "500m"}, {"cpu": "0.5"})
    assert not contains({"cpu": "1"}, {"cpu": "2"})
    assert contains({"a": 1, "added_by_server": "x"}, {"a": 1})
    # Go's omitempty: a false or empty field we send comes back absent
    assert contains({"value": 100}, {"value": 100, "globalDefault": False, "spec": {}})
    assert not contains({"value": 100}, {"value": 100, "globalDefault": True})
    assert not contains({"items": [1, 2]}, {"items": [1]})
    assert not contains({"name": "lab"}, {"name": "Lab"})


def test_an_object_only_we_wrote_with_the_current_hash_is_left_alone():
    report = ReconcileReport()
    want = desired({"pods": "4"})
    assert not Reconciler._needs_apply(QUOTA_KIND, want, live({"pods": "4"}), report)
    assert report.unchanged == 1
    # a controller writing status does not make it drift
    status_writer = live({"pods": "4"}, managers=(FIELD_MANAGER, "kube-controller-manager"))
    status_writer["metadata"]["managedFields"][1]["subresource"] = "status"
    assert not Reconciler._needs_apply(QUOTA_KIND, want, status_writer, report)


def test_a_policy_change_a_hand_edit_or_a_missing_object_needs_an_apply():
    report = ReconcileReport()
    want = desired({"pods": "4"}, digest="new")
    assert Reconciler._needs_apply(QUOTA_KIND, want, None, report)
    assert Reconciler._needs_apply(QUOTA_KIND, want, live({"pods": "3"}, digest="old"), report)
    edited = live({"pods": "40"}, digest="new", managers=(FIELD_MANAGER, "kubectl-edit"))
    assert Reconciler._needs_apply(QUOTA_KIND, want, edited, report)
    # someone else wrote, but our fields still hold: no write
    labelled = live({"pods": "4"}, digest="new", managers=(FIELD_MANAGER, "kubectl-label"))
    assert not Reconciler._needs_apply(QUOTA_KIND, want, labelled, report)
    assert report.unchanged == 1
    assert report.errors == []


def test_an_object_being_deleted_is_reported_not_applied():
    report = ReconcileReport()
    going = live({"pods": "4"})
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not Reconciler._needs_apply(QUOTA_KIND, desired({"pods": "4"}), going, report)
    assert len(report.errors) == 1
    assert report.errors[0].name == "n/q"
    assert "being deleted" in report.errors[0].message
