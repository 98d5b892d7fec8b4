"""Rendering the objects the policy implies (pure): per scheduler, per flavor kind, parents."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli_helpers import cli
from jupyterhub_gpu.core.admission import IN_QUOTA
from jupyterhub_gpu.core.manifests import (
    HUB_LABEL,
    KAI_ROOT_QUEUE,
    OWNER,
    OWNER_LABEL,
    desired_objects,
    rbac_objects,
)
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import select
from jupyterhub_gpu.core.shaping import QUEUE_LABELS, shape

REPO = Path(__file__).resolve().parent.parent
HUB = "jhub"

FLAVORS = {
    "a100": {"kind": "gpu"},
    "mig-1g": {"kind": "mig", "profile": "1g.5gb"},
    "mig-3g": {"kind": "mig", "profile": "3g.20gb"},
    "shared": {"kind": "timeslice", "replicas": 4},
    "claim": {
        "kind": "dra",
        "device_class": "gpu.nvidia.com",
        "selectors": ["device.attributes['gpu.nvidia.com'].productName == 'A100'"],
        "sharing": "TimeSlicing",
    },
}
PROFILES = {
    "cpu": {"cpu": 2, "memory": "2Gi"},
    "gpu": {
        "cpu": 8,
        "memory": "32Gi",
        "gpu": {"flavor": "a100"},
        "options": {"gpus": {"choices": [1, 2]}, "flavor": {"choices": ["a100", "mig-1g"]}},
    },
    "small": {"cpu": 1, "memory": "4Gi", "gpu": {"flavor": "shared"}},
    "dra": {"cpu": 4, "memory": "16Gi", "gpu": {"flavor": "claim", "count": 1}},
    "dra2": {
        "cpu": 4,
        "memory": "16Gi",
        "gpu": {"flavor": "claim", "count": 2},
        "options": {"gpus": {"choices": [2, 4]}},
    },
}


def policy(scheduler="default", per_group=True, **groups):
    return parse_policy(
        scheduler={"name": scheduler},
        flavors=FLAVORS,
        profiles=PROFILES,
        everyone={"profiles": ["cpu"]},
        groups=groups
        or {
            "org": {"quota": {"gpus": 10}, "limit": {"gpus": 12}, "profiles": ["gpu"]},
            "lab": {
                "parent": "org",
                "quota": {"gpus": 4, "cpu": 32, "memory": "128Gi", "servers": 6},
                "limit": {"gpus": 6, "cpu": 48},
                "profiles": ["gpu", "cpu", "dra"],
            },
            "course": {
                "parent": "org",
                "quota": {"gpus": 2, "flavors": {"shared": 5}},
                "profiles": ["small"],
            },
            "admins": {"unlimited": True, "profiles": ["gpu", "dra2"]},
        },
        namespace_per_group=per_group,
        namespace_prefix="nb-",
    )


def find(objects, kind, name=None, namespace=None):
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    return found


def one(objects, kind, name=None, namespace=None):
    found = find(objects, kind, name, namespace)
    assert len(found) == 1, (kind, name, namespace, found)
    return found[0]


def test_every_object_carries_the_ownership_and_hub_labels_and_is_unique():
    for scheduler in ("default", "kai", "volcano", "kueue"):
        objects = desired_objects(policy(scheduler), HUB)
        identities = [
            (o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
            for o in objects
        ]
        assert len(identities) == len(set(identities))
        for obj in objects:
            labels = obj["metadata"]["labels"]
            assert labels[OWNER_LABEL] == OWNER, obj
            assert labels[HUB_LABEL] == HUB, obj


def test_namespace_per_group_renders_a_namespace_quota_limits_isolation_and_binding_per_group():
    objects = desired_objects(policy(), HUB)
    names = {o["metadata"]["name"] for o in find(objects, "Namespace")}
    assert names == {"nb-org", "nb-lab", "nb-course", "nb-admins", "nb-everyone"}
    for ns in names:
        one(objects, "LimitRange", namespace=ns)
        # the hub writes no RBAC: the bindings are the admin's (rbac_objects)
        assert not find(objects, "RoleBinding", namespace=ns)
        assert one(rbac_objects(policy(), HUB), "RoleBinding", "jupyterhub-gpu-spawner", ns)
        netpol = one(objects, "NetworkPolicy", namespace=ns)
        sources = netpol["spec"]["ingress"][0]["from"]
        # same namespace, and the hub's (hub and proxy reach the servers); nothing else
        assert {"podSelector": {}} in sources
        assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": HUB}}} in (
            sources
        )
        assert len(sources) == 2
    # an unlimited group has no caps at all
    assert not find(objects, "ResourceQuota", namespace="nb-admins")


def test_resource_quota_is_the_limit_in_whole_units_of_every_device_resource():
    objects = desired_objects(policy(), HUB)
    lab = one(objects, "ResourceQuota", namespace="nb-lab")["spec"]["hard"]
    assert lab["requests.cpu"] == "48"  # the limit, not the quota: the burst ceiling
    assert lab["requests.memory"] == "128Gi"  # no memory limit: the quota is the limit
    assert lab["pods"] == "6"
    assert lab["requests.nvidia.com/gpu"] == "6"  # 6 GPU-equivalents of whole GPUs
    assert lab["requests.nvidia.com/mig-1g.5gb"] == "42"  # a 1g slice is 1/7
    # lab's profiles never reach these: 0, so they are not unlimited in its namespace
    assert lab["requests.nvidia.com/mig-3g.20gb"] == "0"
    assert lab["requests.nvidia.com/gpu.shared"] == "0"
    assert lab["gpu.nvidia.com.deviceclass.resource.k8s.io/devices"] == "6"

    course = one(objects, "ResourceQuota", namespace="nb-course")["spec"]["hard"]
    # 2 GPUs at 4 replicas would be 8 shares; the per-flavor cap says 5
    assert course["requests.nvidia.com/gpu.shared"] == "5"
    assert course["requests.nvidia.com/gpu"] == "0"
    assert "requests.cpu" not in course
    everyone = one(objects, "ResourceQuota", namespace="nb-everyone")["spec"]["hard"]
    assert everyone["requests.nvidia.com/gpu"] == "0"


def test_everyone_gets_objects_only_when_it_offers_a_profile():
    p = parse_policy(
        scheduler={"name": "kueue"},
        flavors=FLAVORS,
        profiles=PROFILES,
        everyone={"profiles": []},
        groups={"lab": {"quota": {"gpus": 2}, "profiles": ["gpu"]}},
        namespace_per_group=True,
    )
    objects = desired_objects(p, HUB)
    assert {o["metadata"]["name"] for o in find(objects, "Namespace")} == {"jupyterhub-gpu-lab"}
    assert {o["metadata"]["name"] for o in find(objects, "ClusterQueue")} == {"lab"}


def test_limit_range_defaults_requests_to_the_groups_smallest_profile_and_sets_no_limit():
    objects = desired_objects(policy(), HUB)
    limits = one(objects, "LimitRange", namespace="nb-lab")["spec"]["limits"]
    assert limits == [{"type": "Container", "defaultRequest": {"cpu": "2", "memory": "2Gi"}}]


def test_without_namespace_per_group_there_is_no_resource_quota_and_queues_are_in_the_hub_ns():
    objects = desired_objects(policy("kueue", per_group=False), HUB)
    assert not find(objects, "Namespace")
    assert not find(objects, "ResourceQuota")
    assert not find(objects, "LimitRange")
    assert not find(objects, "NetworkPolicy")
    assert {o["metadata"]["namespace"] for o in find(objects, "LocalQueue")} == {HUB}
    selectors = {
        o["spec"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for o in find(objects, "ClusterQueue")
    }
    assert selectors == {HUB}


def test_default_scheduler_renders_priority_classes_and_no_queues():
    objects = desired_objects(policy(), HUB)
    classes = {
        o["metadata"]["name"]: (o["value"], o.get("preemptionPolicy"))
        for o in find(objects, "PriorityClass")
    }
    # each with its twin that never preempts, for while servers from before the policy run
    assert classes == {
        "jupyterhub-gpu-in-quota": (1000, None),
        "jupyterhub-gpu-over-quota": (100, None),
        "jupyterhub-gpu-in-quota-no-preemption": (1000, "Never"),
        "jupyterhub-gpu-over-quota-no-preemption": (100, "Never"),
    }
    assert not find(objects, "Queue")
    assert not find(objects, "ClusterQueue")


def test_kai_queues_hang_under_one_root_with_the_parent_hierarchy_in_kai_units():
    objects = desired_objects(policy("kai"), HUB)
    assert not find(objects, "PriorityClass")  # KAI's own build / build-preemptible
    queues = {o["metadata"]["name"]: o for o in find(objects, "Queue")}
    for queue in queues.values():
        assert queue["apiVersion"] == "scheduling.run.ai/v2"
    assert "parentQueue" not in queues[KAI_ROOT_QUEUE]["spec"]
    assert queues["org"]["spec"]["parentQueue"] == KAI_ROOT_QUEUE
    assert queues["lab"]["spec"]["parentQueue"] == "org"
    assert queues["course"]["spec"]["parentQueue"] == "org"
    lab = queues["lab"]["spec"]["resources"]
    assert lab["gpu"] == {"quota": 4, "limit": 6, "overQuotaWeight": 1}
    assert lab["cpu"] == {"quota": 32000, "limit": 48000, "overQuotaWeight": 1}  # millicores
    # megabytes (10^6 bytes): 128 GiB
    assert lab["memory"]["quota"] == pytest.approx(128 * 2**30 / 10**6)
    # no cap set: nothing guaranteed, no ceiling (-1); an unlimited group: -1 both
    assert queues["course"]["spec"]["resources"]["cpu"]["limit"] == -1
    assert queues["course"]["spec"]["resources"]["cpu"]["quota"] == 0
    assert queues["admins"]["spec"]["resources"]["gpu"] == {
        "quota": -1,
        "limit": -1,
        "overQuotaWeight": 1,
    }


def test_volcano_queues_have_deserved_quota_capability_limit_and_parent():
    objects = desired_objects(policy("volcano"), HUB)
    queues = {o["metadata"]["name"]: o["spec"] for o in find(objects, "Queue")}
    assert set(queues) == {"org", "lab", "course", "admins", "everyone"}
    assert queues["lab"]["parent"] == "org"
    assert "parent" not in queues["org"]
    assert queues["lab"]["deserved"]["nvidia.com/gpu"] == "4"
    assert queues["lab"]["capability"]["nvidia.com/gpu"] == "6"
    assert queues["lab"]["capability"]["cpu"] == "48"
    # what the quota leaves uncapped is deserved without bound (Volcano: none otherwise)
    assert queues["course"]["deserved"]["cpu"] == "1000000"
    assert queues["course"]["deserved"]["memory"] == "1000000Gi"
    assert "capability" not in queues["admins"]
    assert find(objects, "PriorityClass")


def test_kueue_cluster_queues_cohorts_and_local_queues_follow_parents():
    objects = desired_objects(policy("kueue"), HUB)
    for obj in objects:
        if "kueue" in obj["apiVersion"]:
            assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    one(objects, "ResourceFlavor")
    assert one(objects, "Cohort", "org")["spec"] == {}  # a top-level parent
    cqs = {o["metadata"]["name"]: o["spec"] for o in find(objects, "ClusterQueue")}
    assert cqs["lab"]["cohortName"] == "org"
    assert cqs["course"]["cohortName"] == "org"
    assert cqs["org"]["cohortName"] == "org"  # the parent's own servers share its pool
    assert "cohortName" not in cqs["admins"]

    def quotas(name):
        resources = cqs[name]["resourceGroups"][0]["flavors"][0]["resources"]
        return {r["name"]: r for r in resources}

    lab = quotas("lab")
    assert lab["nvidia.com/gpu"] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "4",
        "borrowingLimit": "2",
    }
    assert lab["cpu"]["nominalQuota"] == "32"
    # the parent holds only what its quota leaves beyond its children's
    # (10 whole GPUs - lab's 4; course's quota is in shared GPUs, another resource)
    assert quotas("org")["nvidia.com/gpu"]["nominalQuota"] == "6"
    assert quotas("org")["nvidia.com/gpu"]["borrowingLimit"] == "6"  # up to its limit 12
    # outside a cohort nothing can be borrowed: no borrowing limit (Kueue refuses one)
    for resource in quotas("admins").values():
        assert "borrowingLimit" not in resource
    covered = cqs["lab"]["resourceGroups"][0]["coveredResources"]
    assert covered[:3] == ["cpu", "memory", "pods"]
    assert [r["name"] for r in cqs["lab"]["resourceGroups"][0]["flavors"][0]["resources"]] == (
        covered
    )
    local = one(objects, "LocalQueue", namespace="nb-lab")
    assert local["metadata"]["name"] == "lab"
    assert local["spec"] == {"clusterQueue": "lab"}
    assert cqs["lab"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "nb-lab"
    }


def test_nested_parents_make_nested_kueue_cohorts():
    p = policy(
        "kueue",
        top={"quota": {"gpus": 8}},
        mid={"parent": "top", "quota": {"gpus": 4}},
        leaf={"parent": "mid", "quota": {"gpus": 2}, "profiles": ["gpu"]},
    )
    objects = desired_objects(p, HUB)
    assert one(objects, "Cohort", "mid")["spec"] == {"parentName": "top"}
    assert one(objects, "ClusterQueue", "leaf")["spec"]["cohortName"] == "mid"


def test_pods_queue_label_names_the_queue_object_even_for_names_objects_cannot_have():
    p = parse_policy(
        scheduler={"name": "kueue"},
        flavors=FLAVORS,
        profiles=PROFILES,
        groups={"cps_HPCAccess": {"quota": {"gpus": 2}, "profiles": ["gpu"]}},
        namespace_per_group=True,
    )
    objects = desired_objects(p, HUB)
    local = one(objects, "LocalQueue", namespace="jupyterhub-gpu-cps-hpcaccess")
    selection = select(p, ["cps_HPCAccess"], {"profile": "cps_HPCAccess--gpu"})
    pod = shape(p, selection, IN_QUOTA, username="ada")
    assert pod.labels[QUEUE_LABELS["kueue"]] == local["metadata"]["name"] == "cps-hpcaccess"
    assert pod.namespace == local["metadata"]["namespace"]


def test_dra_claim_templates_exist_for_every_count_offered_under_the_names_pods_reference():
    p = policy()
    objects = desired_objects(p, HUB)
    templates = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o
        for o in find(objects, "ResourceClaimTemplate")
    }
    flavor = p.flavors["claim"]
    assert set(templates) == {
        ("nb-lab", flavor.claim_template_name(1)),
        ("nb-admins", flavor.claim_template_name(2)),
        ("nb-admins", flavor.claim_template_name(4)),
    }
    template = templates[("nb-admins", flavor.claim_template_name(4))]
    assert template["apiVersion"] == "resource.k8s.io/v1"
    devices = template["spec"]["spec"]["devices"]
    exactly = devices["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "gpu.nvidia.com"
    assert exactly["count"] == 4
    assert exactly["selectors"] == [{"cel": {"expression": FLAVORS["claim"]["selectors"][0]}}]
    assert devices["config"][0]["opaque"]["parameters"]["sharing"] == {"strategy": "TimeSlicing"}
    # the spawner's pod references a template that is rendered in its namespace
    pod = shape(
        p, select(p, ["admins"], {"profile": "admins--dra2", "gpus": "4"}), IN_QUOTA, username="ada"
    )
    name = pod.resource_claims[0]["resourceClaimTemplateName"]
    assert (pod.namespace, name) in templates


def _grants(role):
    return {
        (g, r, v, tuple(rule.get("resourceNames", ())))
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.mark.parametrize("scheduler", ["default", "kai", "volcano", "kueue"])
def test_rbac_writes_no_rbac_and_changes_only_the_cluster_objects_the_policy_names(scheduler):
    model = policy(scheduler)
    objects = rbac_objects(model, HUB, "hub")
    desired = desired_objects(model, HUB)
    cluster_roles = find(objects, "ClusterRole")
    for role in cluster_roles:
        for group, resource, verb, _ in _grants(role):
            # no way to grant itself anything: no RBAC writes, no bind, no escalate
            assert group != "rbac.authorization.k8s.io", role
            assert verb not in ("bind", "escalate", "impersonate", "*"), role
            assert resource != "*", role
            assert group != "*", role
    bound_cluster_wide = {b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding")}
    for role in cluster_roles:
        if role["metadata"]["name"] not in bound_cluster_wide:
            continue
        for group, resource, verb, names in _grants(role):
            # cluster wide: reads, and writes of exactly the cluster objects rendered
            if verb in ("get", "list", "watch"):
                assert resource != "secrets", role
                continue
            assert names, (role["metadata"]["name"], group, resource, verb)
            rendered = {
                o["metadata"]["name"]
                for o in desired
                if not o["metadata"].get("namespace")
                and o["apiVersion"].split("/")[0] == (group or "v1")
            } | {o["metadata"]["name"] for o in desired if o["kind"] == "Namespace"}
            assert set(names) <= rendered, (resource, names)
    # every namespace a server of the policy runs in, and no other, gets the spawner's
    # and the service's RoleBindings
    server_namespaces = {o["metadata"]["name"] for o in find(desired, "Namespace")} | {HUB}
    for role in ("jupyterhub-gpu-spawner", "jupyterhub-gpu-service"):
        bound = {
            b["metadata"]["namespace"]
            for b in find(objects, "RoleBinding")
            if b["roleRef"]["name"] == role
        }
        assert bound == server_namespaces, role
    # secrets only through the namespaced spawner role
    spawner = one(objects, "ClusterRole", "jupyterhub-gpu-spawner")
    assert ("", "secrets", "create", ()) in _grants(spawner)
    assert ("", "pods", "create", ()) in _grants(spawner)


def test_rbac_gives_the_hub_and_the_service_their_own_halves_when_their_accounts_differ():
    objects = rbac_objects(policy("kueue"), HUB, "hub", "gpu-service")
    hub = {"kind": "ServiceAccount", "name": "hub", "namespace": HUB}
    gpu = {"kind": "ServiceAccount", "name": "gpu-service", "namespace": HUB}
    by_role = {}
    for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
        for subject in binding["subjects"]:
            by_role.setdefault(binding["roleRef"]["name"], []).append(subject)
    assert hub in by_role["jupyterhub-gpu-spawner"]
    assert gpu not in by_role["jupyterhub-gpu-spawner"]  # no secrets, no pod creation
    assert gpu in by_role["jupyterhub-gpu-service"]
    assert hub not in by_role["jupyterhub-gpu-service"]
    assert by_role[f"jupyterhub-gpu-reconcile-{HUB}"] == [gpu]
    assert hub in by_role[f"jupyterhub-gpu-read-{HUB}"]
    assert gpu in by_role[f"jupyterhub-gpu-read-{HUB}"]
    # the queue places for the spawn page: Workloads and PodGroups where servers wait
    spawner = one(objects, "ClusterRole", "jupyterhub-gpu-spawner")
    assert ("kueue.x-k8s.io", "workloads", "list", ()) in _grants(spawner)
    assert ("scheduling.volcano.sh", "podgroups", "watch", ()) in _grants(spawner)


def test_manifests_command_prints_the_objects_and_rbac_as_a_yaml_stream():
    out = cli("manifests", "helm-values/enterprise.yaml", "--hub-namespace", "hubns")
    assert out.returncode == 0, out.stderr
    assert "&id" not in out.stdout  # no YAML anchors: each object reads whole
    docs = list(yaml.safe_load_all(out.stdout))
    kinds = [d["kind"] for d in docs]
    assert {"ClusterRole", "ClusterRoleBinding", "Namespace", "ResourceQuota", "ClusterQueue"} <= (
        set(kinds)
    )
    assert one(docs, "Namespace", "nb-ml-research")
    # namespaces come first: the RoleBindings after them live in them
    assert kinds.index("RoleBinding") > max(i for i, k in enumerate(kinds) if k == "Namespace")
    binding = one(docs, "ClusterRoleBinding", "jupyterhub-gpu-read-hubns")
    assert binding["subjects"][0]["namespace"] == "hubns"


def test_manifests_command_exits_1_with_the_policy_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"hub": {"config": {"GPUPolicy": {"groups": {"x": {"quota": {"gpus": "ten"}}}}}}}
        )
    )
    out = cli("manifests", str(bad))
    assert out.returncode == 1
    assert out.stdout == ""
    assert "hub.config.GPUPolicy.groups.x.quota.gpus: expected a number, got 'ten'" in out.stderr


def test_manifests_for_removal_leave_out_the_namespaces_and_nothing_else():
    # `... --for-removal | kubectl delete -f -` removes the bundle's objects; a group's
    # namespace would take its running servers and their volumes with it
    ns = ("--hub-namespace", "jhub")
    whole = list(yaml.safe_load_all(cli("manifests", "helm-values/enterprise.yaml", *ns).stdout))
    out = cli("manifests", "helm-values/enterprise.yaml", *ns, "--for-removal")
    assert out.returncode == 0, out.stderr
    removal = list(yaml.safe_load_all(out.stdout))
    assert [d for d in whole if d["kind"] != "Namespace"] == removal
    assert any(d["kind"] == "Namespace" for d in whole)
    assert {"ResourceQuota", "ClusterQueue", "PriorityClass"} <= {d["kind"] for d in removal}
