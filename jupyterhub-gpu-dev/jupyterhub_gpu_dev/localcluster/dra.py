"""What NVIDIA's DRA driver publishes for a pool with ``dra: true``.

On a node where the GPU Operator runs the DRA driver (``dra-driver-nvidia-gpu``)
instead of the device plugin, the node advertises no ``nvidia.com/gpu``; the
driver's kubelet plugin publishes one ResourceSlice per node, driver
``gpu.nvidia.com``, with one device per GPU (``type: gpu``) and, on a GPU in
MIG mode, one device per MIG partition (``type: mig``) instead of the GPU.
kube-scheduler allocates claims from these slices itself; kwok stands in for
the kubelet and the driver's node side (nothing prepares a device).

MIG partitions are the static ones the pool names (``mig.devices``), each GPU
filled with whole profiles in turn, as ``nvidia-smi mig`` left them; the
driver's dynamic partitioning (every possible placement with shared counters)
is not simulated.

A description may also say how the cluster's DeviceClass ``gpu.nvidia.com`` maps
a classic extended resource onto DRA (Kubernetes 1.34's DRAExtendedResource, beta
and on by default from 1.36): ``dra: {extended_resource_name: nvidia.com/gpu}``
at the top level, beside ``node_pools``. kube-scheduler then serves a pod's
``nvidia.com/gpu`` request from the devices of that class on a node that does not
advertise it (a DRA node), through a ResourceClaim it creates for the pod itself.

Pure functions: the local cluster creates what they return.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Mapping
from typing import Any

from .nodepools import NodePoolError

DRIVER = "gpu.nvidia.com"
#: the slices' devices' attribute names are qualified by the driver's domain
_NAMESPACE = uuid.UUID("6a1f3c9e-3c1b-4a7e-9c55-0b5e1f1d2a77")
#: compute slices of one GPU (MIG's seven-slice GPUs: A100, H100, H200)
_GPU_SLICES = 7

#: the DeviceClasses the driver's Helm chart installs
DEVICE_CLASSES: list[dict[str, Any]] = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                    }
                }
            ]
        },
    },
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "mig.nvidia.com"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].type == 'mig'"
                    }
                }
            ]
        },
    },
]


#: what a description may say under its top-level ``dra:``
_DRA_KEYS = {"extended_resource_name"}
_EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def device_classes(description: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The driver's DeviceClasses for this description: ``DEVICE_CLASSES``, with
    ``gpu.nvidia.com`` mapping ``dra.extended_resource_name`` where one is given."""
    settings = description.get("dra") or {}
    if not isinstance(settings, Mapping):
        raise NodePoolError(
            f"dra: expected a mapping such as {{extended_resource_name: nvidia.com/gpu}}, "
            f"got {settings!r}"
        )
    unknown = sorted(set(settings) - _DRA_KEYS)
    if unknown:
        raise NodePoolError(
            f"dra.{unknown[0]}: unknown key (known: {', '.join(sorted(_DRA_KEYS))})"
        )
    name = settings.get("extended_resource_name")
    classes = copy.deepcopy(DEVICE_CLASSES)
    if name is None:
        return classes
    if not isinstance(name, str) or not _EXTENDED_RESOURCE.match(name) or "kubernetes.io/" in name:
        raise NodePoolError(
            "dra.extended_resource_name: expected an extended resource name such as "
            f"nvidia.com/gpu, got {name!r}"
        )
    classes[0]["spec"]["extendedResourceName"] = name
    return classes


def _product_name(product: str) -> str:
    # GFD's label has dashes for spaces ("NVIDIA-H200-NVL"); nvidia-smi, and the
    # driver's productName, the marketing name ("NVIDIA H200 NVL")
    return product.replace("-", " ")


def _gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}"


def _mig_layout(pool: str, count: int, devices: Mapping[str, int]) -> list[list[str]]:
    """The MIG profiles on each of ``count`` GPUs: profiles in order, each GPU filled
    until its seven compute slices are used up."""
    layout: list[list[str]] = [[] for _ in range(count)]
    used = [0] * count
    gpu = 0
    for profile, n in devices.items():
        size = int(str(profile).split("g.", 1)[0])
        for _ in range(int(n)):
            while gpu < count and used[gpu] + size > _GPU_SLICES:
                gpu += 1
            if gpu >= count:
                raise NodePoolError(
                    f"node_pools.{pool}.gpu.mig.devices: the profiles need more than "
                    f"{count} GPUs of {_GPU_SLICES} compute slices each"
                )
            layout[gpu].append(str(profile))
            used[gpu] += size
    return layout


def node_devices(pool: str, node: str, gpu: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The devices the driver publishes for one node of a DRA pool."""
    product = str(gpu["product"])
    memory = int(gpu["memory"])
    count = int(gpu["count"])
    if gpu.get("sharing", "none") != "none" or gpu.get("hami_split") is not None:
        raise NodePoolError(
            f"node_pools.{pool}.gpu: under DRA sharing is a claim's configuration, "
            "not the node's: drop sharing/hami_split from a pool with dra: true"
        )
    mig = gpu.get("mig") or {}
    layout = _mig_layout(pool, count, mig.get("devices") or {}) if mig else [[]] * count
    common = {
        "productName": {"string": _product_name(product)},
        "brand": {"string": "Nvidia"},
        "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"},
    }
    devices: list[dict[str, Any]] = []
    for index in range(count):
        gpu_uuid = _gpu_uuid(node, index)
        if not layout[index]:
            devices.append(
                {
                    "name": f"gpu-{index}",
                    "attributes": {
                        **common,
                        "type": {"string": "gpu"},
                        "index": {"int": index},
                        "minor": {"int": index},
                        "uuid": {"string": gpu_uuid},
                    },
                    "capacity": {"memory": {"value": f"{memory}Mi"}},
                }
            )
            continue
        for k, profile in enumerate(layout[index]):
            size = int(profile.split("g.", 1)[0])
            devices.append(
                {
                    "name": f"gpu-{index}-mig-{profile.replace('.', '')}-{k}",
                    "attributes": {
                        **common,
                        "type": {"string": "mig"},
                        "profile": {"string": profile},
                        "parentIndex": {"int": index},
                        "parentUUID": {"string": gpu_uuid},
                        "index": {"int": k},
                        "uuid": {"string": f"MIG-{uuid.uuid5(_NAMESPACE, f'{gpu_uuid}/{k}')}"},
                    },
                    "capacity": {
                        "memory": {"value": f"{memory * size // 8}Mi"},
                        "multiprocessors": {"value": str(size * 14)},
                    },
                }
            )
    return devices


def render_resource_slices(description: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ResourceSlice per node of every pool with ``dra: true`` (node names as
    ``nodepools.render_nodes`` gives them)."""
    device_classes(description)  # a mistake under dra: fails before anything starts
    slices = []
    for pool, spec in (description.get("node_pools") or {}).items():
        if not spec.get("dra"):
            continue
        if spec.get("gpu") is None:
            raise NodePoolError(f"node_pools.{pool}.dra: a DRA pool needs gpu: to publish")
        for i in range(int(spec["count"])):
            node = f"{pool}-{i}"
            slices.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{node}-{DRIVER}"},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": node_devices(str(pool), node, spec["gpu"]),
                    },
                }
            )
    return slices
