"""Cluster capacity per flavor from nodes and pods (pure)."""

from __future__ import annotations

from fractions import Fraction

import yaml

from jupyterhub_gpu.core.capacity import flavor_capacity, pod_requests
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu_dev.localcluster.nodepools import render_nodes

NODES = render_nodes(
    yaml.safe_load(
        """
node_pools:
  cpu: {count: 1, cpu: 8, memory: 32Gi}
  h200: {count: 2, cpu: 64, memory: 512Gi,
         gpu: {product: NVIDIA-H200-NVL, memory: 143771, count: 4}}
  shared: {count: 1, cpu: 64, memory: 512Gi,
           gpu: {product: NVIDIA-H200-NVL, memory: 143771, count: 4,
                 sharing: time-slicing, replicas: 4}}
  mig: {count: 1, cpu: 32, memory: 256Gi,
        gpu: {product: NVIDIA-A100-SXM4-40GB, memory: 40960, count: 2,
              mig: {strategy: mixed, devices: {1g.5gb: 7, 2g.10gb: 3}}}}
"""
    )
)

POLICY = parse_policy(
    scheduler={"name": "kai"},
    flavors={
        "h200": {"kind": "gpu", "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}},
        "any-gpu": {"kind": "gpu"},
        "shared": {"kind": "timeslice", "replicas": 4},
        "mig-1g": {"kind": "mig", "profile": "1g.5gb"},
        "slice": {
            "kind": "fraction",
            "gpu_memory": 32000,
            "device_memory": 143771,
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
        },
        "claim": {"kind": "dra"},
        "a100": {
            "kind": "gpu",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
        },
        "untolerated": {"kind": "gpu", "tolerations": []},
    },
)


def pod(name: str, node: str | None, phase: str = "Running", **requests: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": dict(requests)}}],
        },
        "status": {"phase": phase},
    }


def test_empty_cluster_offers_every_device_of_matching_nodes():
    capacity = flavor_capacity(POLICY, NODES, [])
    assert (capacity["h200"].allocatable, capacity["h200"].free, capacity["h200"].nodes) == (
        8,
        8,
        2,
    )
    # no selector: every node advertising nvidia.com/gpu (the MIG node advertises mig-* only)
    assert capacity["any-gpu"].allocatable == 8
    assert (capacity["shared"].allocatable, capacity["shared"].unit) == (16, "shared GPUs")
    assert capacity["shared"].free_gpus == 4
    assert capacity["mig-1g"].allocatable == 7
    assert capacity["mig-1g"].free_gpus == 1  # 7 x 1/7
    assert capacity["a100"].nodes == 0  # the A100 node is in MIG mode: no whole GPUs
    assert capacity["a100"].free == 0


def test_scheduled_unfinished_pods_are_subtracted_per_node():
    pods = [
        pod("a", "h200-0", **{"nvidia.com/gpu": "3"}),
        pod("b", "h200-1", phase="Pending", **{"nvidia.com/gpu": "1"}),
        pod("done", "h200-1", phase="Succeeded", **{"nvidia.com/gpu": "4"}),
        pod("unbound", None, phase="Pending", **{"nvidia.com/gpu": "4"}),
        pod("s", "shared-0", **{"nvidia.com/gpu.shared": "1"}),
        pod("m", "mig-0", **{"nvidia.com/mig-1g.5gb": "2"}),
        pod("cpu", "cpu-0", cpu="2"),
    ]
    capacity = flavor_capacity(POLICY, NODES, pods)
    assert (capacity["h200"].allocated, capacity["h200"].free) == (4, 4)
    assert capacity["shared"].free == 15
    assert capacity["mig-1g"].free == 5
    assert capacity["mig-1g"].free_gpus == Fraction(5, 7)


def test_fraction_flavor_counts_whole_devices_no_pod_holds():
    # KAI's reservation pod holds the device a fraction lives on
    pods = [pod("kai-reservation", "h200-0", **{"nvidia.com/gpu": "1"})]
    capacity = flavor_capacity(POLICY, NODES, pods)["slice"]
    assert (capacity.allocatable, capacity.free, capacity.unit) == (8, 7, "GPUs")
    assert capacity.free_gpus == 7
    assert "fractions" in capacity.note


def test_dra_capacity_is_unknown_not_zero():
    capacity = flavor_capacity(POLICY, NODES, [])["claim"]
    assert capacity.allocatable is None
    assert capacity.free is None
    assert capacity.free_gpus is None
    assert "ResourceSlices" in capacity.note


def test_cordoned_notready_and_untolerated_nodes_serve_nothing():
    nodes = [dict(n) for n in NODES]
    cordoned = next(n for n in nodes if n["metadata"]["name"] == "h200-0")
    cordoned["spec"] = {**cordoned["spec"], "unschedulable": True}
    not_ready = next(n for n in nodes if n["metadata"]["name"] == "h200-1")
    not_ready["status"] = {
        **not_ready["status"],
        "conditions": [{"type": "Ready", "status": "False"}],
    }
    capacity = flavor_capacity(POLICY, nodes, [])
    assert capacity["h200"].nodes == 0
    assert capacity["h200"].free == 0
    # GPU nodes carry the nvidia.com/gpu taint: without a toleration no node serves it
    assert flavor_capacity(POLICY, NODES, [])["untolerated"].nodes == 0


def test_pod_requests_follow_the_scheduler_rules():
    manifest = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "500m"}, "limits": {"nvidia.com/gpu": "1"}}},
                {"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
            "overhead": {"cpu": "100m"},
        }
    }
    requests = pod_requests(manifest)
    assert requests["nvidia.com/gpu"] == 2
    assert requests["cpu"] == Fraction(41, 10)  # max(1.5, 4) + 0.1


def test_a_node_over_committed_by_stale_pods_reports_zero_free_not_negative():
    pods = [pod(f"p{i}", "h200-0", **{"nvidia.com/gpu": "1"}) for i in range(6)]
    capacity = flavor_capacity(POLICY, NODES, pods)["h200"]
    assert capacity.allocated == 4  # capped at h200-0's 4 devices
    assert capacity.free == 4  # h200-1 untouched
