"""Node pools derived from a policy offer every flavor the way real hardware would."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets.config import Config

import matrix
from jupyterhub_gpu.config.values import policy_from_config, policy_from_values
from jupyterhub_gpu.core.capacity import flavor_capacity
from jupyterhub_gpu.core.dra import DraInventory
from jupyterhub_gpu.core.model import Flavor, Policy, parse_policy
from jupyterhub_gpu.core.quantities import parse_quantity
from jupyterhub_gpu_dev.localcluster.dra import device_classes, render_resource_slices
from jupyterhub_gpu_dev.localcluster.nodepools import render_nodes
from jupyterhub_gpu_dev.localcluster.policy_pools import (
    MAX_NODES,
    node_pools_for,
    units_needed,
    without_nodes,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("university", "department", "enterprise")


def example(name: str) -> Policy:
    return policy_from_values([ROOT / "helm-values/base.yaml", ROOT / f"helm-values/{name}.yaml"])


def matrix_policy(scheduler: str) -> Policy:
    config = Config()
    config.GPUPolicy.update(matrix.policy(scheduler))
    return policy_from_config(config)


#: the demo's built-in example
DEMO_VALUES = ROOT / "jupyterhub-gpu-dev/jupyterhub_gpu_dev/demo_values.yaml"

POLICIES = {
    **{name: lambda name=name: example(name) for name in EXAMPLES},
    "demo": lambda: policy_from_values(
        [ROOT / "jupyterhub-gpu-dev/jupyterhub_gpu_dev/demo_values.yaml"]
    ),
    **{f"every-kind-{s}": lambda s=s: matrix_policy(s) for s in matrix.SCHEDULERS},
}


def offers(node: dict, flavor: Flavor) -> int:
    """How many units of ``flavor`` this node offers a pod (0: the pod cannot land here)."""
    labels = node["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in flavor.node_selector.items()):
        return 0
    for taint in node["spec"]["taints"]:
        if not any(t.get("key") == taint["key"] for t in flavor.tolerations):
            return 0
    allocatable = node["status"]["allocatable"]
    if flavor.kind == "fraction":
        memory = int(labels.get("nvidia.com/gpu.memory", 0))
        if flavor.gpu_memory and flavor.gpu_memory > memory:
            return 0
        return int(int(allocatable.get("nvidia.com/gpu", 0)) / flavor.unit_equivalents)
    if flavor.kind == "hami" and int(allocatable.get("nvidia.com/gpumem", 0)) < (
        flavor.gpu_memory or 0
    ):
        return 0
    return int(parse_quantity(allocatable.get(flavor.node_resource, "0")))


@pytest.mark.parametrize("name", POLICIES)
def test_every_flavor_has_nodes_enough_for_every_groups_limit(name):
    policy = POLICIES[name]()
    nodes = render_nodes(node_pools_for(policy))
    assert any("nvidia.com/gpu.present" not in n["metadata"]["labels"] for n in nodes)  # CPU
    needed = units_needed(policy)
    devices = dra_devices(node_pools_for(policy))
    for flavor in policy.flavors.values():
        if flavor.kind == "dra":
            # published in ResourceSlices on DRA nodes: enough devices the flavor's
            # DeviceClass and selectors accept (the whole cluster's count)
            capacity = flavor_capacity(policy, nodes, [], dra=devices)[flavor.name]
            assert capacity.allocatable, (flavor.name, capacity.note)
            assert capacity.allocatable >= min(needed.get(flavor.name, 1), MAX_NODES * 8)
            continue
        offering = [n for n in nodes if offers(n, flavor)]
        assert offering, f"no node offers {flavor.name}"
        total = sum(offers(n, flavor) for n in offering)
        per_node = max(offers(n, flavor) for n in offering)
        assert total >= min(needed.get(flavor.name, 1), MAX_NODES * per_node), flavor.name
        for node in offering:
            assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in (
                node["spec"]["taints"]
            )


def dra_devices(description: dict) -> DraInventory:
    return DraInventory(render_resource_slices(description), device_classes(description))


def test_flavors_the_nodes_cannot_offer_are_named_with_why():
    for name in ("university", "enterprise"):
        assert without_nodes(example(name)) == []
    assert without_nodes(matrix_policy("default")) == []
    other = parse_policy(
        flavors={
            "amd": {"kind": "dra", "device_class": "gpu.amd.com"},
            "a": {"kind": "gpu", "device_class": "gpu.nvidia.com"},
            "b": {"kind": "gpu", "resource": "example.com/gpu", "device_class": "gpu.nvidia.com"},
        }
    )
    assert without_nodes(other) == [
        "amd: the simulated DRA driver installs the DeviceClasses gpu.nvidia.com and "
        "mig.nvidia.com, not gpu.amd.com",
        "b: the simulated DeviceClass gpu.nvidia.com maps nvidia.com/gpu only",
    ]


def test_dra_flavors_get_nodes_of_nvidias_dra_driver():
    """A dra flavor gets DRA nodes of the product its selectors name (MIG partitions of
    the profile they name for mig.nvidia.com); a bridged gpu flavor gets DRA nodes and
    the DeviceClass that maps its resource, so it is served there."""
    policy = parse_policy(
        flavors={
            "h200": {
                "kind": "dra",
                "selectors": [
                    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"
                ],
            },
            "mig-3g": {
                "kind": "dra",
                "device_class": "mig.nvidia.com",
                "selectors": ["device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"],
            },
            "bridged": {"kind": "gpu", "device_class": "gpu.nvidia.com"},
        }
    )
    description = node_pools_for(policy)
    pools = description["node_pools"]
    assert pools["flavor-h200"]["dra"] is True
    assert pools["flavor-h200"]["gpu"]["product"] == "NVIDIA-H200-NVL"
    assert pools["flavor-mig-3g"]["gpu"]["mig"] == {"strategy": "mixed", "devices": {"3g.40gb": 16}}
    assert description["dra"] == {"extended_resource_name": "nvidia.com/gpu"}
    nodes = render_nodes(description)
    capacity = flavor_capacity(policy, nodes, [], dra=dra_devices(description))
    assert capacity["h200"].allocatable == 8
    assert capacity["mig-3g"].allocatable == 16
    # pods asking for nvidia.com/gpu are served by every whole GPU of the DRA nodes
    # (the MIG partitions are mig.nvidia.com's, whose class maps no resource)
    assert capacity["bridged"].allocatable == 8 + 8
    assert "through DeviceClass gpu.nvidia.com (DRA)" in capacity["bridged"].note


def test_the_hardware_is_the_flavors_own():
    department = node_pools_for(example("department"))["node_pools"]
    mig = department["flavor-a100-1g5"]["gpu"]
    assert mig["product"] == "NVIDIA-A100-SXM4-40GB"
    assert mig["memory"] == 40960
    assert mig["mig"] == {"strategy": "mixed", "devices": {"1g.5gb": 56}}  # 8 GPUs x 7

    university = node_pools_for(example("university"))["node_pools"]
    assert university["flavor-h200"]["gpu"]["product"] == "NVIDIA-H200-NVL"
    shared = university["flavor-h200-shared"]["gpu"]
    assert (shared["sharing"], shared["replicas"], shared["rename"]) == ("time-slicing", 4, True)
    # the KAI slice: whole GPUs with room for its 32,000 MiB
    assert university["flavor-slice-32g"]["gpu"]["memory"] >= 32000
