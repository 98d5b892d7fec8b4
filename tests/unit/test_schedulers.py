"""One object per scheduler (pure): the registry, what each puts on a server's pod, where
a pod waits in its queue and why, and the objects and kinds each brings.

The expectations are written out as the spawn path had them before the schedulers
were objects, so that the objects answer exactly as the branches on a scheduler's
name did.
"""

from __future__ import annotations

import pytest
from test_pending import NO_QUOTA, podgroup, workload

import matrix
from jupyterhub_gpu.core import model
from jupyterhub_gpu.core.admission import IN_QUOTA, OVER_QUOTA
from jupyterhub_gpu.core.manifests import priority_classes, rbac_objects, scheduler_objects
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.pending import kueue_queue_line, volcano_queue_line
from jupyterhub_gpu.core.schedulers import SCHEDULERS, QueuePlace, object_kinds, scheduler_for
from jupyterhub_gpu.core.selection import offers, select
from jupyterhub_gpu.core.shaping import PodShape, shape
from jupyterhub_gpu.kube.reconciler import KINDS

#: what each scheduler put on a pod: its schedulerName and its queue label
POD_SCHEDULER_NAME = {"kai": "kai-scheduler", "volcano": "volcano"}
QUEUE_LABEL = {"kai": "kai.scheduler/queue", "kueue": "kueue.x-k8s.io/queue-name"}


def policy(scheduler: str, **extra):
    return parse_policy(**matrix.policy(scheduler, **extra))


def test_every_scheduler_the_policy_may_name_has_one_object_chosen_by_its_name():
    assert tuple(SCHEDULERS) == model.SCHEDULERS
    for name in model.SCHEDULERS:
        chosen = scheduler_for(policy(name))
        assert type(chosen) is SCHEDULERS[name]
        assert chosen.name == name


@pytest.mark.parametrize("scheduler", matrix.SCHEDULERS)
@pytest.mark.parametrize("tier", [IN_QUOTA, OVER_QUOTA])
def test_each_scheduler_shapes_the_pod_as_the_spawn_path_did(scheduler, tier):
    p = policy(scheduler, extra_labels={"team": "{group}"})
    for offer in offers(p, ["lab"]):
        selection = select(p, ["lab"], {"profile": offer.slug})
        pod = shape(p, selection, tier, username="ann", hub="jhub")
        flavor = selection.flavor
        if flavor is not None and flavor.kind == "hami":
            assert pod.scheduler_name == "hami-scheduler"  # the flavor's own wins
        else:
            assert pod.scheduler_name == POD_SCHEDULER_NAME.get(scheduler)
        # the scheduler's queue label comes last, after the policy's and the site's
        labels = [
            "gpu.jupyterhub.org/group",
            "gpu.jupyterhub.org/profile",
            "gpu.jupyterhub.org/flavor",
            "gpu.jupyterhub.org/tier",
            "gpu.jupyterhub.org/hub",
            "team",
            *([QUEUE_LABEL[scheduler]] if scheduler in QUEUE_LABEL else []),
        ]
        assert list(pod.labels) == labels
        if scheduler in QUEUE_LABEL:
            assert pod.labels[QUEUE_LABEL[scheduler]] == selection.group.name
        annotations = dict(pod.annotations)
        annotations.pop("gpu.jupyterhub.org/charge")
        annotations.pop("gpu-memory", None)  # a KAI fraction's, the flavor's doing
        if scheduler == "volcano":
            assert annotations == {
                "scheduling.volcano.sh/queue-name": selection.group.name,
                "volcano.sh/preemptable": "false" if tier == IN_QUOTA else "true",
            }
        else:
            assert annotations == {}


@pytest.mark.parametrize("scheduler", matrix.SCHEDULERS)
def test_a_scheduler_puts_only_its_own_fields_on_a_pod(scheduler):
    p = policy(scheduler)
    pod = PodShape()
    scheduler_for(p).shape_pod(pod, p.groups["lab"], IN_QUOTA)
    expected = PodShape(scheduler_name=POD_SCHEDULER_NAME.get(scheduler))
    if scheduler in QUEUE_LABEL:
        expected.labels = {QUEUE_LABEL[scheduler]: "lab"}
    if scheduler == "volcano":
        expected.annotations = {
            "scheduling.volcano.sh/queue-name": "lab",
            "volcano.sh/preemptable": "false",
        }
    assert pod == expected


def test_kueue_and_volcano_hold_pods_in_a_queue_and_say_what_they_keep_per_pod():
    held = {
        name: (s.display_name, s.queue_objects, s.queue_states)
        for name, s in SCHEDULERS.items()
        if s.queue_objects
    }
    assert held == {
        "kueue": ("Kueue", ("kueue.x-k8s.io", "v1beta2", "workloads"), None),
        "volcano": (
            "Volcano",
            ("scheduling.volcano.sh", "v1beta1", "podgroups"),
            ("scheduling.volcano.sh", "v1beta1", "queues"),
        ),
    }
    for name in ("default", "kai"):
        scheduler = scheduler_for(policy(name))
        pod = {"metadata": {"labels": {}}, "spec": {"schedulingGates": []}}
        assert not scheduler.queues_pods
        assert not scheduler.holds(pod)
        assert scheduler.place(pod, []) is None


def kueue_pod(gated: bool = True) -> dict:
    gates = [{"name": "kueue.x-k8s.io/admission"}] if gated else []
    return {
        "metadata": {
            "uid": "uid-bob",
            "namespace": "hub",
            "labels": {"kueue.x-k8s.io/queue-name": "lab"},
        },
        "spec": {"schedulingGates": gates},
    }


def test_kueue_holds_a_gated_pod_and_places_it_among_its_local_queues_workloads():
    kueue = scheduler_for(policy("kueue"))
    assert kueue.holds(kueue_pod())
    assert not kueue.holds(kueue_pod(gated=False))  # admitted: past the gate
    assert kueue.queue_of(kueue_pod()) == "lab"
    assert kueue.queue_of({"metadata": {}}) == "?"

    ann = workload("ann", "2026-01-01T10:00:00Z")
    bob = workload("bob", "2026-01-01T10:01:00Z")
    place = kueue.place(kueue_pod(), [ann, bob])
    assert place == QueuePlace("lab", bob, 2)
    assert kueue.queue_line(place) == kueue_queue_line("lab", bob, 2)
    assert kueue.queue_line(place).startswith(
        f"Waiting in Kueue queue lab: position 2. Kueue: {NO_QUOTA}"
    )
    # no Workload yet: held all the same, and the line says so
    place = kueue.place(kueue_pod(), [ann])
    assert place == QueuePlace("lab", None, None)
    assert kueue.queue_line(place) == kueue_queue_line("lab", None, None)
    assert kueue.unread_line("lab") == kueue_queue_line("lab", None, None)


def volcano_pod(node: str | None = None, group: str | None = "podgroup-cy") -> dict:
    annotations = {"scheduling.volcano.sh/queue-name": "lab"}
    if group:
        annotations["scheduling.k8s.io/group-name"] = group
    return {
        "metadata": {"namespace": "hub", "annotations": annotations},
        "spec": {"nodeName": node} if node else {},
    }


def test_volcano_holds_a_pod_while_its_podgroup_is_pending_and_places_it_by_priority():
    volcano = scheduler_for(policy("volcano"))
    assert volcano.holds(volcano_pod())
    assert not volcano.holds(volcano_pod(node="gpu-1"))  # bound to a node: past the queue
    assert volcano.queue_of(volcano_pod()) == "lab"
    assert volcano.queue_of({"metadata": {}}) == "?"

    # priorities are the policy's own PriorityClasses: in-quota servers go first
    bob = podgroup("bob", "2026-01-01T10:00:00Z", priorityClassName="jupyterhub-gpu-over-quota")
    cy = podgroup("cy", "2026-01-01T10:01:00Z", priorityClassName="jupyterhub-gpu-in-quota")
    place = volcano.place(volcano_pod(), [bob, cy])
    assert place == QueuePlace("lab", cy, 1)
    assert volcano.queue_line(place) == volcano_queue_line("lab", cy, 1)
    assert volcano.queue_line(place, "Closed") == volcano_queue_line("lab", cy, 1, "Closed")
    # not grouped by Volcano's controller yet, or let into its queue: not held
    assert volcano.place(volcano_pod(group=None), [bob, cy]) is None
    inqueue = podgroup("cy", "2026-01-01T10:01:00Z", phase="Inqueue")
    assert volcano.place(volcano_pod(), [inqueue]) is None
    assert volcano.unread_line("lab") == (
        "Waiting in Volcano queue lab. The server starts by itself when Volcano lets it in; "
        "stop it to give up."
    )


def test_each_scheduler_brings_its_own_objects_and_kai_its_own_priority_classes():
    kinds = {
        name: sorted(
            {(o["apiVersion"], o["kind"]) for o in scheduler_for(policy(name)).objects("jhub")}
        )
        for name in matrix.SCHEDULERS
    }
    assert kinds == {
        "default": [],
        "kai": [("scheduling.run.ai/v2", "Queue")],
        "volcano": [("scheduling.volcano.sh/v1beta1", "Queue")],
        "kueue": [
            ("kueue.x-k8s.io/v1beta2", "ClusterQueue"),
            ("kueue.x-k8s.io/v1beta2", "LocalQueue"),
            ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"),
        ],
    }
    # what each renders is of a kind it declares (so the reconciler can prune it)
    declared = {(k.api_version, k.kind) for k in object_kinds()}
    assert all(set(found) <= declared for found in kinds.values())
    assert [n for n, s in SCHEDULERS.items() if s.own_priority_classes] == ["kai"]
    assert priority_classes(policy("kai")) == []
    # ours, each with its twin that never preempts
    assert len(priority_classes(policy("volcano"))) == 4


def test_the_reconciler_keeps_every_schedulers_kinds_in_creation_order():
    assert [(k.api_version, k.kind, k.namespaced) for k in KINDS] == [
        ("v1", "Namespace", False),
        ("scheduling.k8s.io/v1", "PriorityClass", False),
        ("scheduling.run.ai/v2", "Queue", False),
        ("scheduling.volcano.sh/v1beta1", "Queue", False),
        ("kueue.x-k8s.io/v1beta2", "ResourceFlavor", False),
        ("kueue.x-k8s.io/v1beta2", "Cohort", False),
        ("kueue.x-k8s.io/v1beta2", "ClusterQueue", False),
        ("v1", "ResourceQuota", True),
        ("v1", "LimitRange", True),
        ("networking.k8s.io/v1", "NetworkPolicy", True),
        ("kueue.x-k8s.io/v1beta2", "LocalQueue", True),
        ("resource.k8s.io/v1", "ResourceClaimTemplate", True),
    ]
    fixes = {k.api_version.split("/")[0]: k.fix for k in KINDS if k.fix}
    assert fixes["scheduling.run.ai"].startswith("install the KAI scheduler")
    assert fixes["scheduling.volcano.sh"].startswith("install Volcano")
    assert fixes["kueue.x-k8s.io"].startswith("install Kueue")


def test_the_hubs_cluster_roles_cover_every_schedulers_objects():
    read = ["get", "list", "watch"]
    scheduler_groups = ("scheduling.run.ai", "scheduling.volcano.sh", "kueue.x-k8s.io")
    for name in ("default", "kai", "volcano", "kueue"):
        objects = [o for o in rbac_objects(policy(name), "jhub") if o["kind"] == "ClusterRole"]
        (reads,) = [o for o in objects if o["metadata"]["name"] == "jupyterhub-gpu-read-jhub"]
        # every scheduler's cluster kinds are read, whichever the policy names (the
        # reconciler finds its own after a change of scheduler)
        assert [r for r in reads["rules"] if r["apiGroups"][0] in scheduler_groups] == [
            {"apiGroups": ["scheduling.run.ai"], "resources": ["queues"], "verbs": read},
            {"apiGroups": ["scheduling.volcano.sh"], "resources": ["queues"], "verbs": read},
            {
                "apiGroups": ["kueue.x-k8s.io"],
                "resources": ["clusterqueues", "cohorts", "resourceflavors"],
                "verbs": read,
            },
        ]
        # and only the policy's own scheduler objects are written, by name
        (writes,) = [o for o in objects if o["metadata"]["name"] == "jupyterhub-gpu-reconcile-jhub"]
        written = {
            (r["apiGroups"][0], n)
            for r in writes["rules"]
            if r["apiGroups"][0] in scheduler_groups
            for n in r["resourceNames"]
        }
        rendered = {
            (o["apiVersion"].split("/")[0], o["metadata"]["name"])
            for o in scheduler_objects(policy(name), "jhub")
            if not o["metadata"].get("namespace")
        }
        assert written == rendered


FAIR = dict(
    fair_share={"half_life": "7d"},
    flavors={"a100": {"kind": "gpu"}},
    profiles={"gpu": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "a100"}}},
    groups={
        "dept": {"quota": {"gpus": 8}},
        "nlp": {"parent": "dept", "share": 1.5, "limit": {"gpus": 8}, "profiles": ["gpu"]},
        "vision": {"parent": "dept", "share": 0.5, "limit": {"gpus": 8}, "profiles": ["gpu"]},
    },
)


@pytest.mark.parametrize("scheduler", ["kai", "volcano", "kueue"])
def test_each_scheduler_weighs_sibling_queues_by_the_groups_shares(scheduler):
    from jupyterhub_gpu.core.objects import share_weights

    p = parse_policy(scheduler={"name": scheduler}, **FAIR)
    # whole numbers in the shares' ratio
    assert share_weights(p) == {"dept": 2, "nlp": 3, "vision": 1}
    queues = {
        o["metadata"]["name"]: o
        for o in scheduler_for(p).objects("jhub")
        if o["kind"] in ("Queue", "ClusterQueue")
    }
    if scheduler == "kai":
        weights = {n: q["spec"]["resources"]["gpu"]["overQuotaWeight"] for n, q in queues.items()}
        assert weights == {"jupyterhub-gpu": 1, "dept": 2, "nlp": 3, "vision": 1}
    elif scheduler == "volcano":
        assert {n: q["spec"]["weight"] for n, q in queues.items()} == {
            "dept": 2,
            "nlp": 3,
            "vision": 1,
        }
    else:
        weights = {n: q["spec"]["fairSharing"]["weight"] for n, q in queues.items()}
        assert weights == {"dept": "2", "nlp": "3", "vision": "1"}
        # without fair share, Kueue's queues carry no weights (its default, 1)
        plain = parse_policy(scheduler={"name": "kueue"}, **{**FAIR, "fair_share": None})
        assert not any("fairSharing" in o["spec"] for o in scheduler_for(plain).objects("jhub"))


def test_a_parent_without_profiles_of_its_own_lends_its_children_their_gpus():
    from jupyterhub_gpu.core.objects import device_caps

    p = parse_policy(scheduler={"name": "kueue"}, **FAIR)
    assert device_caps(p, p.groups["dept"], p.groups["dept"].quota) == {"nvidia.com/gpu": 8}
    (dept,) = [
        o
        for o in scheduler_for(p).objects("jhub")
        if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "dept"
    ]
    (gpus,) = [
        r
        for r in dept["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        if r["name"] == "nvidia.com/gpu"
    ]
    assert gpus["nominalQuota"] == "8"


def test_with_fair_share_a_bursts_class_follows_its_users_standing():
    from jupyterhub_gpu.core.fairshare import Standing, burst_band
    from jupyterhub_gpu.core.manifests import priority_classes

    def band(group_used, group_share, member_used, member_share):
        return burst_band(
            Standing(1.0, group_share, group_used), Standing(1.0, member_share, member_used)
        )

    assert band(0.1, 0.5, 1.0, 1.0) == "light"  # 0.2 of its share
    assert band(0.5, 0.5, 1.0, 1.0) == "fair"  # exactly its share
    assert band(1.0, 0.5, 1.0, 0.5) == "heavy"  # 4 times it
    p = parse_policy(scheduler={"name": "default"}, **FAIR)
    (offer,) = offers(p, ["nlp"])
    selection = select(p, ["nlp"], {"profile": offer.slug})

    def class_of(tier, burst, **kw):
        return shape(p, selection, tier, username="ann", burst_band=burst, **kw)

    assert class_of(OVER_QUOTA, "light").priority_class_name == "jupyterhub-gpu-over-quota-light"
    assert class_of(OVER_QUOTA, "heavy").priority_class_name == "jupyterhub-gpu-over-quota"
    assert class_of(IN_QUOTA, "light").priority_class_name == "jupyterhub-gpu-in-quota"
    twin = class_of(OVER_QUOTA, "fair", preempt=False).priority_class_name
    assert twin == "jupyterhub-gpu-over-quota-fair-no-preemption"
    rendered = {c["metadata"]["name"]: c["value"] for c in priority_classes(p)}
    assert rendered["jupyterhub-gpu-over-quota-light"] == 120
    assert rendered["jupyterhub-gpu-over-quota-fair"] == 110
    assert rendered[twin] == 110
    # without fair share there are no bands
    plain = parse_policy(scheduler={"name": "default"}, **{**FAIR, "fair_share": None})
    assert len(priority_classes(plain)) == 4
