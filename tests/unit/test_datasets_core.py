"""Where each group's datasets stand (core.datasets): the claims they need and what was
found, pure; and how the service's views, metrics and page show it, without a cluster
(the hub and cluster tests are in test_datasets_service.py)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import generate_latest

from jupyterhub_gpu.core.admission import Ledger
from jupyterhub_gpu.core.datasets import (
    MISSING,
    NOT_NEEDED,
    OK,
    UNKNOWN,
    dataset_report,
    missing_claims,
    needed_claims,
    server_namespace,
)
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.service import metrics
from jupyterhub_gpu.service.datasets import ClaimReadError, DatasetCheckFailed, DatasetClaims
from jupyterhub_gpu.service.page import render_page
from jupyterhub_gpu.service.views import Snapshot, Viewer, usage_view

HUB = "jhub"
DATASETS = {
    "imagenet": {
        "display_name": "ImageNet",
        "description": "ILSVRC 2012",
        "nfs": {"server": "nfs.example.edu", "path": "/export/imagenet"},
        "mount_path": "/data/imagenet",
        "read_only": True,
    },
    "scratch": {"claim": "research-scratch", "mount_path": "/data/scratch"},
    "shared": {"claim": "dept-shared", "mount_path": "/data/shared", "read_only": True},
    "course": {
        "csi": {"driver": "lustre.csi.hpe.com"},
        "mount_path": "/data/course",
        "read_only": True,
    },
}


def policy(**changes):
    settings = {
        "flavors": {"h200": {"kind": "gpu"}},
        "profiles": {"gpu": {"cpu": "1", "memory": "1Gi", "gpu": {"flavor": "h200"}}},
        "everyone": {"profiles": []},
        "groups": {
            # a department without profiles: its labs mount its data
            "department": {"quota": {"gpus": 8}, "datasets": ["shared"]},
            "research": {
                "parent": "department",
                "quota": {"gpus": 4},
                "profiles": ["gpu"],
                "datasets": ["imagenet", "scratch"],
            },
            "vision": {"parent": "department", "quota": {"gpus": 2}, "profiles": ["gpu"]},
            "students": {"quota": {"gpus": 2}, "profiles": ["gpu"], "datasets": ["course"]},
        },
        "datasets": DATASETS,
    }
    settings.update(changes)
    return parse_policy(**settings)


def states(report, group):
    return {s.dataset.name: s.status for s in report[group]}


# ---- the pure function -----------------------------------------------------------------


def test_the_claims_needed_are_those_of_groups_that_start_servers_in_the_hubs_namespace():
    assert needed_claims(policy(), HUB) == {HUB: {"research-scratch", "dept-shared"}}


def test_with_a_namespace_per_group_each_group_needs_its_claims_in_its_own_namespace():
    model = policy(namespace_per_group=True, namespace_prefix="gpu-")
    assert server_namespace(model, "research", HUB) == "gpu-research"
    assert needed_claims(model, HUB) == {
        "gpu-research": {"research-scratch", "dept-shared"},
        "gpu-vision": {"dept-shared"},
    }


def test_each_group_lists_its_parents_datasets_then_its_own_with_their_state():
    model = policy()
    report = dataset_report(model, HUB, {HUB: {"dept-shared"}})
    assert list(report) == ["department", "research", "vision", "students", "everyone"]
    research = report["research"]
    assert [s.dataset.name for s in research] == ["shared", "imagenet", "scratch"]
    assert states(report, "research") == {"shared": OK, "imagenet": OK, "scratch": MISSING}
    # the department starts no servers of its own: its claim is not needed in its namespace
    assert states(report, "department") == {"shared": NOT_NEEDED}
    assert states(report, "vision") == {"shared": OK}
    # NFS and CSI mount inline: nothing to find
    assert states(report, "students") == {"course": OK}
    assert report["everyone"] == []
    assert [(s.group, s.dataset.claim) for s in missing_claims(report)] == [
        ("research", "research-scratch")
    ]


def test_a_claim_found_in_another_namespace_does_not_count():
    model = policy(namespace_per_group=True, namespace_prefix="gpu-")
    report = dataset_report(
        model, HUB, {"gpu-research": {"dept-shared"}, "gpu-vision": {"research-scratch"}}
    )
    assert states(report, "research")["scratch"] == MISSING
    assert states(report, "vision") == {"shared": MISSING}
    missing = {(s.group, s.namespace, s.dataset.claim) for s in missing_claims(report)}
    assert missing == {
        ("research", "gpu-research", "research-scratch"),
        ("vision", "gpu-vision", "dept-shared"),
    }


def test_a_namespace_or_claim_not_read_is_unknown_not_missing():
    model = policy(namespace_per_group=True, namespace_prefix="gpu-")
    report = dataset_report(model, HUB, {"gpu-research": {"dept-shared"}})
    assert states(report, "vision") == {"shared": UNKNOWN}
    report = dataset_report(
        model,
        HUB,
        {"gpu-research": {"dept-shared"}, "gpu-vision": set()},
        unknown={("gpu-research", "research-scratch")},
    )
    assert states(report, "research")["scratch"] == UNKNOWN
    assert states(report, "vision") == {"shared": MISSING}
    assert not report["research"][2].missing
    assert "not known" in report["research"][2].problem


def test_the_json_names_the_claim_its_namespace_and_what_stands_in_the_way():
    report = dataset_report(policy(), HUB, {HUB: set()})
    scratch = report["research"][2].to_json()
    assert scratch == {
        "name": "scratch",
        "display_name": "scratch",
        "description": "",
        "mount_path": "/data/scratch",
        "read_only": False,
        "kind": "claim",
        "claim": "research-scratch",
        "namespace": HUB,
        "missing": True,
        "status": "missing",
        "problem": "claim research-scratch is missing in namespace jhub: servers of this "
        "group cannot start until an admin creates it (or removes the dataset from the group)",
    }
    imagenet = report["research"][1].to_json()
    assert (imagenet["kind"], imagenet["claim"], imagenet["read_only"]) == ("nfs", None, True)
    assert (imagenet["missing"], imagenet["problem"]) == (False, None)


def test_no_datasets_no_claims():
    model = parse_policy(
        profiles={"cpu": {"cpu": "1", "memory": "1Gi"}}, everyone={"profiles": ["cpu"]}
    )
    assert needed_claims(model, HUB) == {}
    assert dataset_report(model, HUB, {}) == {"everyone": []}


# ---- the service's check, with claims read by a stand-in reader -----------------------


class Claims:
    """What a stand-in API server holds: (namespace, name) pairs; errors by pair."""

    def __init__(self, *present: tuple[str, str]) -> None:
        self.present = set(present)
        self.errors: dict[tuple[str, str], Exception] = {}
        self.reads: list[tuple[str, str]] = []

    async def __call__(self, namespace: str, name: str) -> bool:
        self.reads.append((namespace, name))
        if (namespace, name) in self.errors:
            raise self.errors[(namespace, name)]
        return (namespace, name) in self.present


def forbidden(namespace: str, name: str) -> ClaimReadError:
    error = ApiException(status=403, reason="Forbidden")
    message = (
        f'persistentvolumeclaims "{name}" is forbidden: User '
        '"system:serviceaccount:jhub:hub" cannot get resource'
    )
    error.body = json.dumps({"message": message})
    return ClaimReadError(namespace, name, error)


def test_the_check_reads_each_needed_claim_once_and_keeps_what_it_found():
    model = policy(namespace_per_group=True, namespace_prefix="gpu-")
    claims = Claims(("gpu-research", "dept-shared"))
    check = DatasetClaims(model, HUB, claims)
    # before the first read nothing is known
    assert states(check.report, "research")["scratch"] == UNKNOWN
    result = asyncio.run(check.run())
    assert sorted(claims.reads) == [
        ("gpu-research", "dept-shared"),
        ("gpu-research", "research-scratch"),
        ("gpu-vision", "dept-shared"),
    ]
    assert result == (
        "missing claim(s) gpu-research/research-scratch, gpu-vision/dept-shared: "
        "servers of research, vision cannot start"
    )
    claims.present |= {("gpu-research", "research-scratch"), ("gpu-vision", "dept-shared")}
    assert asyncio.run(check.run()) == "3 dataset claim(s) found"
    assert missing_claims(check.report) == []


def test_a_claim_that_cannot_be_read_keeps_its_last_state_and_fails_the_check_saying_why():
    model = policy(namespace_per_group=True, namespace_prefix="gpu-")
    claims = Claims(("gpu-research", "dept-shared"))
    check = DatasetClaims(model, HUB, claims)
    asyncio.run(check.run())
    claims.errors[("gpu-vision", "dept-shared")] = forbidden("gpu-vision", "dept-shared")
    claims.present.add(("gpu-research", "research-scratch"))
    with pytest.raises(DatasetCheckFailed) as failed:
        asyncio.run(check.run())
    message = str(failed.value)
    assert message.startswith(
        "1 of 3 dataset claim(s) not read, the first: reading PersistentVolumeClaim "
        "gpu-vision/dept-shared: HTTP 403: grant the hub's service account get on "
        "persistentvolumeclaims in gpu-vision"
    )
    assert "cannot get resource" in message
    # the others were read; the one not read stays missing, as last found
    assert states(check.report, "research") == {"shared": OK, "imagenet": OK, "scratch": OK}
    assert states(check.report, "vision") == {"shared": MISSING}
    # never read at all: unknown
    fresh = DatasetClaims(model, HUB, claims)
    with pytest.raises(DatasetCheckFailed):
        asyncio.run(fresh.run())
    assert states(fresh.report, "vision") == {"shared": UNKNOWN}


# ---- the views, the metric and the page ------------------------------------------------


def snapshot(model, report) -> Snapshot:
    return Snapshot(ledger=Ledger(), servers=[], capacity=None, datasets=report)


def test_a_member_sees_their_groups_datasets_an_admin_every_groups():
    model = policy()
    report = dataset_report(model, HUB, {HUB: {"dept-shared"}})
    now = datetime.now(UTC)
    member = usage_view(model, snapshot(model, report), Viewer("ann", groups={"vision"}), now)
    assert [g["name"] for g in member["groups"]] == ["vision", "everyone"]
    assert [d["name"] for d in member["groups"][0]["datasets"]] == ["shared"]
    assert "research-scratch" not in str(member)
    admin = usage_view(model, snapshot(model, report), Viewer("root", admin=True), now)
    research = next(g for g in admin["groups"] if g["name"] == "research")
    scratch = research["datasets"][2]
    assert (scratch["claim"], scratch["namespace"], scratch["missing"]) == (
        "research-scratch",
        HUB,
        True,
    )


def test_the_group_view_cache_sees_a_claim_come_back():
    from jupyterhub_gpu.service.views import CachedUsage

    model = policy()
    cached = CachedUsage(model)
    root = Viewer("root", admin=True)
    now = datetime.now(UTC)
    before = cached.json(snapshot(model, dataset_report(model, HUB, {HUB: set()})), root, now)
    assert '"missing": true' in before
    after = cached.json(
        snapshot(model, dataset_report(model, HUB, {HUB: {"dept-shared", "research-scratch"}})),
        root,
        now,
    )
    assert '"missing": true' not in after


def test_the_metric_is_1_for_a_missing_claim_0_for_one_found_absent_when_not_known():
    model = policy(namespace_per_group=True, namespace_prefix="gpu-")
    report = dataset_report(model, HUB, {"gpu-research": {"dept-shared"}})
    registry, _ = metrics.registry(model, lambda: snapshot(model, report))
    text = generate_latest(registry).decode()
    lines = [line for line in text.splitlines() if line.startswith("jupyterhub_gpu_dataset")]
    assert sorted(lines) == [
        'jupyterhub_gpu_dataset_claim_missing{claim="dept-shared",dataset="shared",'
        'group="research",namespace="gpu-research"} 0.0',
        'jupyterhub_gpu_dataset_claim_missing{claim="research-scratch",dataset="scratch",'
        'group="research",namespace="gpu-research"} 1.0',
    ]


def test_the_page_lists_each_groups_datasets_and_flags_a_missing_claim():
    model = policy()
    report = dataset_report(model, HUB, {HUB: {"dept-shared"}})
    view = usage_view(model, snapshot(model, report), Viewer("root", admin=True), datetime.now(UTC))
    view["gpu_hours"]["accounting"]["ok"] = True
    page = render_page(view)
    assert "<b>ImageNet</b> at <code>/data/imagenet</code> (read-only)" in page
    assert "ILSVRC 2012" in page
    assert "<b>scratch</b> at <code>/data/scratch</code> (read-write)" in page
    assert (
        '<div class="err">claim research-scratch is missing in namespace jhub: servers of '
        "this group cannot start" in page
    )
    assert page.count("is missing in namespace") == 1


def test_the_rendered_rbac_lets_the_hub_read_claims_in_every_group_namespace():
    """The spawner reads a group's claims in its namespace, and the service checks them
    there: the role bound in each group namespace allows ``get`` on claims."""
    from jupyterhub_gpu.core.manifests import SPAWNER_ROLE, rbac_objects

    model = policy(namespace_per_group=True, namespace_prefix="gpu-")
    rbac = rbac_objects(model, HUB)
    (role,) = [
        o for o in rbac if o["kind"] == "ClusterRole" and o["metadata"]["name"] == SPAWNER_ROLE
    ]
    assert any(
        "persistentvolumeclaims" in rule["resources"] and "get" in rule["verbs"]
        for rule in role["rules"]
        if rule["apiGroups"] == [""]
    )
    bound = {
        o["metadata"]["namespace"]
        for o in rbac
        if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == SPAWNER_ROLE
    }
    assert set(needed_claims(model, HUB)) <= bound
