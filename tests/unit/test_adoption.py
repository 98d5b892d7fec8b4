"""Servers started before the policy: which flavor and group each is charged (pure)."""

from __future__ import annotations

from fractions import Fraction

from jupyterhub_gpu.core.adoption import adopt
from jupyterhub_gpu.core.model import parse_policy

POLICY = dict(
    flavors={
        "a100": {"kind": "gpu", "node_selector": {"gpu": "a100"}},
        "h200": {"kind": "gpu", "node_selector": {"gpu": "h200"}},
        "shared": {"kind": "timeslice", "replicas": 4},
        "mig": {"kind": "mig", "profile": "3g.20gb"},
    },
    profiles={
        "cpu": {"cpu": 1, "memory": "1Gi"},
        "big": {"cpu": 4, "memory": "8Gi", "gpu": {"flavor": "a100"}},
        "any": {
            "cpu": 4,
            "memory": "8Gi",
            "gpu": {"flavor": "a100"},
            "options": {"flavor": {"choices": ["a100", "h200"]}},
        },
        "slice": {"gpu": {"flavor": "mig"}},
        "light": {"gpu": {"flavor": "shared"}},
    },
    everyone={"profiles": ["cpu"]},
    groups={
        "lab": {"quota": {"gpus": 8}, "profiles": ["big", "slice"]},
        "ml": {"quota": {"gpus": 8}, "profiles": ["any", "light", "cpu"]},
    },
)


def server_pod(resources: dict, *, user="ann", selector=None, labels=None, **meta) -> dict:
    return {
        "metadata": {
            "name": f"jupyter-{user}",
            "namespace": "jhub",
            "labels": {"component": "singleuser-server", **(labels or {})},
            "annotations": {"hub.jupyter.org/username": user},
            **meta,
        },
        "spec": {
            "nodeSelector": selector or {},
            "containers": [
                {
                    "name": "notebook",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi", **resources},
                        "limits": dict(resources),
                    },
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def test_a_gpu_server_is_charged_to_the_only_group_that_offers_its_flavor():
    policy = parse_policy(**POLICY)
    pod = server_pod({"nvidia.com/gpu": "2"}, selector={"gpu": "h200"})
    adopted = adopt(policy, pod, ["lab", "ml"])
    # h200 is offered only as ml's "any" profile's flavor choice
    assert (adopted.flavor, adopted.group) == ("h200", "ml")
    assert adopted.request.gpus == 2
    assert adopted.request.devices == (("h200", 2),)
    assert adopted.request.cpu == 500
    assert adopted.request.memory == 2**30
    charge = adopted.charge
    assert (charge.key, charge.user, charge.group) == ("jhub/jupyter-ann", "ann", "ml")


def test_shared_and_mig_units_are_charged_as_the_policy_charges_them():
    policy = parse_policy(**POLICY)
    shared = adopt(policy, server_pod({"nvidia.com/gpu.shared": "1"}), ["ml"])
    assert (shared.flavor, shared.group, shared.request.gpus) == ("shared", "ml", Fraction(1, 4))
    mig = adopt(policy, server_pod({"nvidia.com/mig-3g.20gb": "1"}), ["lab", "ml"])
    assert (mig.flavor, mig.group, mig.request.gpus) == ("mig", "lab", Fraction(3, 7))


def test_an_ambiguous_server_goes_to_the_setting_or_to_no_group_with_the_reason():
    policy = parse_policy(**POLICY)
    # a100 is offered by lab and ml alike
    pod = server_pod({"nvidia.com/gpu": "1"}, selector={"gpu": "a100"})
    adopted = adopt(policy, pod, ["lab", "ml"])
    assert adopted.group is None
    assert adopted.charge is None
    assert adopted.why == "2 of ann's groups offer flavor a100 (lab, ml)"
    assert adopted.request.gpus == 1  # what it holds is still known and shown
    policy = parse_policy(**POLICY, adopted_servers_group="lab")
    adopted = adopt(policy, pod, ["lab", "ml"])
    assert adopted.group == "lab"
    assert adopted.why.endswith(": GPUPolicy.adopted_servers_group")


def test_a_cpu_server_and_a_gpu_no_flavor_names():
    policy = parse_policy(**POLICY)
    # ml and everyone both offer a profile without GPUs: ambiguous
    cpu = adopt(policy, server_pod({}), ["ml"])
    assert cpu.group is None
    assert cpu.why == "2 of ann's groups offer a profile without GPUs (ml, everyone)"
    # a lab member: only everyone offers one
    assert adopt(policy, server_pod({}), ["lab"]).group == "everyone"
    unknown = adopt(policy, server_pod({"nvidia.com/mig-1g.5gb": "1"}), ["lab"])
    assert unknown.group is None
    assert unknown.why == "it requests nvidia.com/mig-1g.5gb, which no flavor of the policy names"
    # other extended resources are not GPUs
    fpga = adopt(policy, server_pod({"example.com/fpga": "1"}), ["lab"])
    assert (fpga.group, fpga.request.gpus) == ("everyone", 0)


def test_pods_of_the_policy_and_finished_pods_are_not_adopted_terminating_ones_are():
    policy = parse_policy(**POLICY)
    ours = server_pod({"nvidia.com/gpu": "1"}, labels={"gpu.jupyterhub.org/group": "lab"})
    assert adopt(policy, ours, ["lab"]) is None
    finished = {**server_pod({"nvidia.com/gpu": "1"}), "status": {"phase": "Succeeded"}}
    assert adopt(policy, finished, ["lab"]) is None
    # a terminating pod holds its GPU until it is gone: it stays charged until then
    leaving = server_pod({"nvidia.com/gpu": "1"}, deletionTimestamp="2026-11-25T00:00:00Z")
    assert adopt(policy, leaving, ["lab"]).group == "lab"
    not_a_server = server_pod({})
    not_a_server["metadata"]["labels"] = {"component": "hub"}
    assert adopt(policy, not_a_server, ["lab"]) is None


def test_while_servers_from_before_run_new_servers_get_classes_that_never_preempt():
    from jupyterhub_gpu.core.manifests import priority_classes
    from jupyterhub_gpu.core.selection import select
    from jupyterhub_gpu.core.shaping import shape

    def class_of(policy, tier, preempt, group="lab", profile="big"):
        selection = select(policy, [group], {"profile": f"{group}--{profile}"})
        return shape(policy, selection, tier, username="ann", preempt=preempt).priority_class_name

    policy = parse_policy(**POLICY)
    assert class_of(policy, "in-quota", True) == "jupyterhub-gpu-in-quota"
    assert class_of(policy, "in-quota", False) == "jupyterhub-gpu-in-quota-no-preemption"
    assert class_of(policy, "over-quota", False) == "jupyterhub-gpu-over-quota-no-preemption"
    # every class a server can be given exists, the twins with the same value
    rendered = {c["metadata"]["name"]: c for c in priority_classes(policy)}
    for tier in ("in-quota", "over-quota"):
        ours = class_of(policy, tier, True)
        twin = rendered[class_of(policy, tier, False)]
        assert (twin["value"], twin["preemptionPolicy"]) == (rendered[ours]["value"], "Never")
        assert "preemptionPolicy" not in rendered[ours]
    # a group's own class is the site's, and KAI's classes are KAI's: kept as they are
    own = {**POLICY["groups"], "lab": {**POLICY["groups"]["lab"], "priority_class": "site-high"}}
    assert class_of(parse_policy(**{**POLICY, "groups": own}), "in-quota", False) == "site-high"
    kai = parse_policy(**{**POLICY, "scheduler": {"name": "kai"}})
    assert class_of(kai, "in-quota", False) == "build"


def test_an_adopted_servers_gpu_time_is_recorded_only_once_its_users_groups_are_known():
    """The service sees pods before the hub has told it the users' groups: a server from
    before the policy is then charged to the fallback group, but its GPU time (a row
    that keeps its group once written) waits for the groups, and goes to the group the
    quota charges."""
    from jupyterhub_gpu.service.state import ServiceState

    policy = parse_policy(**POLICY, adopted_servers_group="ml")
    state = ServiceState(policy, hub_namespace="jhub")
    pod = server_pod(
        {"nvidia.com/gpu": "1"},
        selector={"gpu": "a100"},
        uid="uid-ann",
        creationTimestamp="2026-01-05T12:00:00Z",
    )
    pod["status"]["startTime"] = "2026-01-05T12:00:01Z"
    found = state.server_pod(pod)
    assert found is not None
    state.server_pods_listed({found.key: found})
    before = state.server_pods[found.key]
    assert before.usage is None  # nobody's groups known yet: no row that would stick
    state.set_user_groups({"ann": ["lab"]})  # lab alone offers the a100 she holds
    after = state.server_pods[found.key]
    assert after.charge is not None
    assert after.charge.group == "lab"
    assert after.usage is not None
    assert after.usage.group == "lab"
