"""Free DRA devices per flavor from ResourceSlices, DeviceClasses and claims (pure),
on the slices the local cluster's DRA pools publish as NVIDIA's driver does."""

from __future__ import annotations

import copy

import pytest

from jupyterhub_gpu.core.capacity import flavor_capacity
from jupyterhub_gpu.core.dra import DraInventory, UnsupportedCel, compile_selector
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu_dev.localcluster.dra import DEVICE_CLASSES, render_resource_slices
from jupyterhub_gpu_dev.localcluster.nodepools import render_nodes

POOLS = {
    "node_pools": {
        "h200": {
            "count": 2,
            "cpu": 64,
            "memory": "512Gi",
            "dra": True,
            "gpu": {"product": "NVIDIA-H200-NVL", "memory": 143771, "count": 2},
        },
        "mig": {
            "count": 1,
            "cpu": 32,
            "memory": "256Gi",
            "dra": True,
            "gpu": {
                "product": "NVIDIA-A100-SXM4-40GB",
                "memory": 40960,
                "count": 2,
                "mig": {"strategy": "mixed", "devices": {"1g.5gb": 7}},
            },
        },
    }
}
NODES = render_nodes(POOLS)
SLICES = render_resource_slices(POOLS)
H200 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"

POLICY = parse_policy(
    flavors={
        "h200": {"kind": "dra", "device_class": "gpu.nvidia.com", "selectors": [H200]},
        "any": {"kind": "dra", "device_class": "gpu.nvidia.com"},
        "mig-1g": {
            "kind": "dra",
            "device_class": "mig.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"],
        },
        "big": {
            "kind": "dra",
            "selectors": [
                "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) > 0"
            ],
        },
        "elsewhere": {"kind": "dra", "device_class": "gpu.example.com"},
        "untolerated": {"kind": "dra", "tolerations": []},
    },
)


def claim(node: str, device: str) -> dict:
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device}
    return {
        "metadata": {"name": f"{node}-{device}", "namespace": "lab"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_free_devices_per_flavor_are_the_matching_devices_no_claim_holds():
    inventory = DraInventory(SLICES, DEVICE_CLASSES, [claim("h200-0", "gpu-1")])
    capacity = flavor_capacity(POLICY, NODES, [], dra=inventory)
    h200 = capacity["h200"]
    assert (h200.allocatable, h200.allocated, h200.free, h200.nodes) == (4, 1, 3, 2)
    assert h200.unit == "devices"
    # the gpu class takes whole GPUs only: the MIG node's unpartitioned A100 too
    assert (capacity["any"].allocatable, capacity["any"].free) == (5, 4)
    assert (capacity["mig-1g"].allocatable, capacity["mig-1g"].nodes) == (7, 1)


def test_the_last_device_taken_leaves_none_free():
    claims = [claim(f"h200-{n}", f"gpu-{i}") for n in (0, 1) for i in (0, 1)]
    capacity = flavor_capacity(POLICY, NODES, [], dra=DraInventory(SLICES, DEVICE_CLASSES, claims))
    assert capacity["h200"].free == 0
    assert capacity["any"].free == 1  # the A100 on the MIG node


def test_devices_on_nodes_a_pod_cannot_land_on_do_not_count():
    nodes = copy.deepcopy(NODES)
    nodes[0]["spec"]["unschedulable"] = True  # h200-0 cordoned
    capacity = flavor_capacity(POLICY, nodes, [], dra=DraInventory(SLICES, DEVICE_CLASSES))
    assert (capacity["h200"].allocatable, capacity["h200"].nodes) == (2, 1)
    # without the GPU taint's toleration no DRA node takes the pod
    assert capacity["untolerated"].allocatable == 0


def test_what_is_not_evaluated_stays_unknown_and_says_why():
    capacity = flavor_capacity(POLICY, NODES, [], dra=DraInventory(SLICES, DEVICE_CLASSES))
    assert capacity["big"].free is None
    assert "device.capacity" in capacity["big"].note
    assert capacity["elsewhere"].free is None
    assert "DeviceClass 'gpu.example.com' does not exist" in capacity["elsewhere"].note
    # no DRA objects read (or no permission to read them): unknown, not zero
    assert flavor_capacity(POLICY, NODES, [])["h200"].free is None
    unreadable = DraInventory(problem="resourceslices: 403 forbidden")
    assert "403 forbidden" in flavor_capacity(POLICY, NODES, [], dra=unreadable)["h200"].note


def test_a_pool_republished_counts_its_newest_generation_only():
    old = copy.deepcopy(SLICES[0])
    old["metadata"]["name"] += "-old"
    new = copy.deepcopy(SLICES[0])
    new["spec"]["pool"]["generation"] = 2
    new["spec"]["devices"] = new["spec"]["devices"][:1]
    inventory = DraInventory([old, new, *SLICES[1:]], DEVICE_CLASSES)
    assert flavor_capacity(POLICY, NODES, [], dra=inventory)["h200"].allocatable == 3


GPU = {
    "driver": "gpu.nvidia.com",
    "attributes": {
        "productName": {"string": "NVIDIA H200 NVL"},
        "index": {"int": 1},
        "example.com/fast": {"bool": True},
        "driverVersion": {"version": "570.124.6"},
    },
}


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ("device.driver == 'gpu.nvidia.com'", True),
        ('device.driver == "gpu.amd.com"', False),
        ("device.attributes['gpu.nvidia.com'].index == 1", True),
        ("device.attributes['gpu.nvidia.com'].index != 1", False),
        ("device.attributes['gpu.nvidia.com'].index == '1'", False),  # no int == string
        ("device.attributes['example.com'].fast == true", True),
        ("device.attributes['example.com'].fast", True),
        ("!(device.driver == 'gpu.nvidia.com')", False),
        (
            "device.driver == 'x' || (device.attributes['gpu.nvidia.com'].index == 1 && "
            "device.attributes['gpu.nvidia.com'].productName != 'NVIDIA A100')",
            True,
        ),
        # an attribute the device lacks: no match (the scheduler would fail on it)
        ("device.attributes['gpu.nvidia.com'].profile == '1g.5gb'", False),
        ("device.attributes['gpu.nvidia.com'].profile != '1g.5gb'", False),
        # a version compares only through semver(): not evaluated as a string
        ("device.attributes['gpu.nvidia.com'].driverVersion == '570.124.6'", False),
    ],
)
def test_the_cel_subset(expression, matches):
    assert compile_selector(expression)(GPU) is matches


@pytest.mark.parametrize(
    "expression",
    [
        "'productName' in device.attributes['gpu.nvidia.com']",
        "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.0.0'))",
        "device.attributes['gpu.nvidia.com'].index > 0",
        "device.capacity['gpu.nvidia.com'].memory == quantity('80Gi')",
        "device.driver ==",
    ],
)
def test_expressions_outside_the_subset_are_refused_not_guessed(expression):
    with pytest.raises(UnsupportedCel):
        compile_selector(expression)
