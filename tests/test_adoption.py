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


def test_pods_of_the_policy_and_pods_on_their_way_out_are_not_adopted():
    policy = parse_policy(**POLICY)
    ours = server_pod({"nvidia.com/gpu": "1"}, labels={"gpu.jupyterhub.org/group": "lab"})
    assert adopt(policy, ours, ["lab"]) is None
    leaving = server_pod({"nvidia.com/gpu": "1"}, deletionTimestamp="2026-11-25T00:00:00Z")
    assert adopt(policy, leaving, ["lab"]) is None
    not_a_server = server_pod({})
    not_a_server["metadata"]["labels"] = {"component": "hub"}
    assert adopt(policy, not_a_server, ["lab"]) is None
