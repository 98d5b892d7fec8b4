"""Simulated node pools render the resources and labels real GPU nodes carry."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from jupyterhub_gpu_dev.localcluster.nodepools import NodePoolError, render_nodes

DEFAULT = yaml.safe_load(
    (
        Path(__file__).parents[2]
        / "jupyterhub-gpu-dev/jupyterhub_gpu_dev/localcluster/nodepools.yaml"
    ).read_text()
)


def pool(**gpu) -> dict:
    return {"node_pools": {"p": {"count": 1, "cpu": 8, "memory": "64Gi", "gpu": gpu}}}


def test_default_pools_cover_every_gpu_kind_with_loopback_addresses():
    nodes = render_nodes(DEFAULT)
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert by_name["h200-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert by_name["a100-mig-0"]["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] == "7"
    assert by_name["a100-mig-0"]["status"]["allocatable"]["nvidia.com/mig-2g.10gb"] == "3"
    assert "nvidia.com/gpu" not in by_name["a100-mig-0"]["status"]["allocatable"]
    shared = by_name["h200-shared-0"]
    assert shared["status"]["allocatable"]["nvidia.com/gpu.shared"] == "16"
    assert shared["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert shared["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200-NVL-SHARED"
    assert by_name["cpu-0"]["spec"]["taints"] == []
    for node in nodes:
        for address in node["status"]["addresses"]:
            if address["type"] == "InternalIP":
                assert ipaddress.ip_address(address["address"]).is_loopback
        if "nvidia.com/gpu.present" in node["metadata"]["labels"]:
            assert node["spec"]["taints"] == [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
            ]
    ips = [n["status"]["addresses"][0]["address"] for n in nodes]
    assert len(set(ips)) == len(ips)


def test_mig_single_strategy_exposes_slices_as_gpus_with_product_suffix():
    (node,) = render_nodes(
        pool(
            product="NVIDIA-A100-SXM4-40GB",
            memory=40960,
            count=1,
            mig={"strategy": "single", "devices": {"1g.5gb": 7}},
        )
    )
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "7"
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/mig.strategy"] == "single"


def test_time_slicing_without_rename_multiplies_nvidia_gpu():
    (node,) = render_nodes(
        pool(product="T4", memory=15360, count=2, sharing="time-slicing", replicas=4, rename=False)
    )
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"product": "X", "memory": 1, "count": "two"}, "node_pools.p.gpu.count: expected int"),
        ({"product": "X", "memory": 1, "count": 1, "sharing": "magic"}, "sharing: expected none"),
        ({"product": "X", "memory": 1, "count": 1, "replicas": 4}, "replicas: only with sharing"),
        (
            {"product": "X", "memory": 1, "count": 1, "mig": {"strategy": "single", "devices": {}}},
            "mig.devices: name at least one",
        ),
        ({"product": "X", "memory": 1, "count": 1, "colour": "red"}, "gpu.colour: unknown key"),
    ],
)
def test_bad_descriptions_name_the_key(gpu, message):
    with pytest.raises(NodePoolError, match=message.replace(".", r"\.")):
        render_nodes(pool(**gpu))
