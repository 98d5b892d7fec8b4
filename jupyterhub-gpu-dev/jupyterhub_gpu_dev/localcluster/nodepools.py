"""Simulated GPU node pools: a declarative description rendered into Node objects.

The description mirrors what the NVIDIA GPU Operator and GPU Feature Discovery
(GFD) publish on real nodes, so that everything the spawner and the scheduler
read (resource names, ``nvidia.com/gpu.*`` labels, the ``nvidia.com/gpu`` taint)
looks the way it does on a real cluster::

    node_pools:
      a100-mig:
        count: 1
        cpu: 64
        memory: 512Gi
        gpu:
          product: NVIDIA-A100-SXM4-40GB
          memory: 40960           # MiB per device
          count: 2                # physical devices per node
          mig: {strategy: mixed, devices: {1g.5gb: 7, 2g.10gb: 3}}

``sharing: time-slicing`` with ``replicas`` (and ``rename: true`` for
``nvidia.com/gpu.shared``) or ``sharing: mps`` model the device plugin's sharing
modes; ``mig.strategy: single`` exposes slices as ``nvidia.com/gpu``;
``hami_split: N`` models HAMi's device plugin (each device as N shares, with
``nvidia.com/gpumem`` and ``nvidia.com/gpucores``).

``dra: true`` on a pool models NVIDIA's DRA driver in place of the device
plugin: the nodes keep GFD's labels and the GPU taint but advertise no GPU
resource; their GPUs (and MIG partitions) are published as ResourceSlices
(see ``dra``).

Pure functions, but for ``read_node_pools``, which reads a description from a file
and names the line of a mistake.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Nodes carrying this annotation are the ones kwok manages.
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

# GPU models that can run MIG, as GFD reports through nvidia.com/mig.capable.
_MIG_CAPABLE = ("A100", "A30", "H100", "H200", "H20", "B200", "GB200")


class NodePoolError(ValueError):
    """A node pool description is wrong; the message names the key and the fix."""


@dataclass(frozen=True)
class NodeAddressing:
    """How node addresses are handed out: all inside 127.0.0.0/8."""

    node_network: ipaddress.IPv4Network = field(
        default_factory=lambda: ipaddress.IPv4Network("127.0.16.0/20")
    )

    def node_ip(self, index: int) -> str:
        # skip .0 and .1 of the range: .1 is where the control plane binds
        return str(self.node_network.network_address + 2 + index)


def _require(pool: str, spec: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in spec:
        raise NodePoolError(f"node_pools.{pool}.{key}: required")
    value = spec[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise NodePoolError(
            f"node_pools.{pool}.{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}"
        )
    return value


def _check_keys(path: str, spec: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise NodePoolError(
            f"{path}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(allowed))})"
        )


def gpu_resources_and_labels(
    pool: str, gpu: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, str]]:
    """The extended resources and GFD labels one node of a GPU pool advertises."""
    path = f"node_pools.{pool}.gpu"
    _check_keys(
        path,
        gpu,
        {"product", "memory", "count", "sharing", "replicas", "rename", "mig", "hami_split"},
    )
    product = _require(f"{pool}.gpu", gpu, "product", str)
    memory = _require(f"{pool}.gpu", gpu, "memory", int)
    count = _require(f"{pool}.gpu", gpu, "count", int)
    sharing = gpu.get("sharing", "none")
    if sharing not in ("none", "time-slicing", "mps"):
        raise NodePoolError(f"{path}.sharing: expected none, time-slicing or mps, got {sharing!r}")
    replicas = gpu.get("replicas", 1)
    if sharing == "none" and replicas != 1:
        raise NodePoolError(f"{path}.replicas: only with sharing: time-slicing or mps")
    if not isinstance(replicas, int) or replicas < 1:
        raise NodePoolError(f"{path}.replicas: expected a whole number >= 1, got {replicas!r}")

    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": sharing,
        "nvidia.com/mig.capable": str(any(m in product for m in _MIG_CAPABLE)).lower(),
        "nvidia.com/cuda.driver.major": "570",
    }
    resources: dict[str, str] = {}
    mig = gpu.get("mig")
    if mig is not None:
        if sharing != "none":
            raise NodePoolError(f"{path}.mig: MIG and {sharing} sharing cannot be combined here")
        _check_keys(f"{path}.mig", mig, {"strategy", "devices"})
        strategy = mig.get("strategy")
        devices = mig.get("devices") or {}
        if strategy not in ("single", "mixed"):
            raise NodePoolError(f"{path}.mig.strategy: expected single or mixed, got {strategy!r}")
        if not devices:
            raise NodePoolError(f"{path}.mig.devices: name at least one MIG profile and its count")
        if strategy == "single" and len(devices) != 1:
            raise NodePoolError(f"{path}.mig.devices: the single strategy has exactly one profile")
        labels["nvidia.com/mig.strategy"] = strategy
        for profile, n in devices.items():
            slices = int(str(profile).split("g.", 1)[0])
            labels[f"nvidia.com/mig-{profile}.count"] = str(n)
            labels[f"nvidia.com/mig-{profile}.slices.gi"] = str(slices)
            if strategy == "mixed":
                resources[f"nvidia.com/mig-{profile}"] = str(n)
            else:
                resources["nvidia.com/gpu"] = str(n)
                labels["nvidia.com/gpu.product"] = f"{product}-MIG-{profile}"
                labels["nvidia.com/gpu.count"] = str(n)
        labels["nvidia.com/mig.config"] = "custom"
    elif gpu.get("hami_split") is not None:
        # HAMi's device plugin: each device split in shares, with its memory and cores
        split = gpu["hami_split"]
        if sharing != "none" or not isinstance(split, int) or split < 1:
            raise NodePoolError(
                f"{path}.hami_split: expected a whole number >= 1 without sharing, got {split!r}"
            )
        resources["nvidia.com/gpu"] = str(count * split)
        resources["nvidia.com/gpumem"] = str(count * memory)
        resources["nvidia.com/gpucores"] = str(count * 100)
        labels["gpu"] = "on"  # the label HAMi's scheduler extender selects nodes by
    elif sharing == "none":
        resources["nvidia.com/gpu"] = str(count)
    elif gpu.get("rename", True):
        # renameByDefault: true advertises the shared replicas under their own name
        resources["nvidia.com/gpu.shared"] = str(count * replicas)
        labels["nvidia.com/gpu.product"] = f"{product}-SHARED"
    else:
        resources["nvidia.com/gpu"] = str(count * replicas)
        labels["nvidia.com/gpu.product"] = f"{product}-SHARED"
    return resources, labels


def render_nodes(
    description: Mapping[str, Any], addressing: NodeAddressing | None = None
) -> list[dict]:
    """Node manifests for every node of every pool, in a stable order."""
    addressing = addressing or NodeAddressing()
    pools = description.get("node_pools")
    if not isinstance(pools, Mapping) or not pools:
        raise NodePoolError("node_pools: expected a mapping of pool name to pool")
    nodes: list[dict] = []
    for pool, spec in pools.items():
        if not isinstance(spec, Mapping):
            raise NodePoolError(f"node_pools.{pool}: expected a mapping, got {spec!r}")
        _check_keys(
            f"node_pools.{pool}", spec, {"count", "cpu", "memory", "pods", "gpu", "labels", "dra"}
        )
        dra = spec.get("dra", False)
        if not isinstance(dra, bool):
            raise NodePoolError(f"node_pools.{pool}.dra: expected true or false, got {dra!r}")
        count = _require(pool, spec, "count", int)
        capacity = {
            "cpu": str(_require(pool, spec, "cpu", (int, str))),
            "memory": str(_require(pool, spec, "memory", str)),
            "pods": str(spec.get("pods", 110)),
            "ephemeral-storage": "500Gi",
        }
        labels = {"jupyterhub-gpu.local/pool": str(pool), **dict(spec.get("labels") or {})}
        taints: list[dict] = []
        if spec.get("gpu") is not None:
            resources, gpu_labels = gpu_resources_and_labels(pool, spec["gpu"])
            if not dra:  # under DRA the devices are in ResourceSlices, not allocatable
                capacity.update(resources)
            labels.update(gpu_labels)
            taints.append(dict(GPU_TAINT))
        for i in range(count):
            name = f"{pool}-{i}"
            ip = addressing.node_ip(len(nodes))
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {
                            KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1],
                            "node.alpha.kubernetes.io/ttl": "0",
                        },
                        "labels": {
                            **labels,
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "type": "kwok",
                        },
                    },
                    "spec": {"taints": [dict(t) for t in taints]},
                    "status": {
                        "capacity": dict(capacity),
                        "allocatable": dict(capacity),
                        "addresses": [
                            {"type": "InternalIP", "address": ip},
                            {"type": "Hostname", "address": name},
                        ],
                        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
                    },
                }
            )
    return nodes


def _line_of(text: str, key_path: str) -> int | None:
    """The line (1-based) of the deepest key of ``key_path`` found in the YAML text."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in key_path.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if key_node.value == key:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            break
    return line


def read_node_pools(path: str | Path) -> dict[str, Any]:
    """A node pool description from a YAML file, checked; ``NodePoolError`` names the
    file and the line of the first mistake."""
    try:
        text = Path(path).read_text()
        description = yaml.safe_load(text)
    except OSError as e:
        raise NodePoolError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise NodePoolError(f"{where}: not YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(description, Mapping):
        raise NodePoolError(f"{path}:1: expected a mapping with node_pools, got {description!r}")
    from .dra import render_resource_slices

    try:
        render_nodes(description)
        render_resource_slices(description)
    except NodePoolError as e:
        key_path = str(e).split(":", 1)[0]
        line = _line_of(text, key_path)
        raise NodePoolError(f"{path}:{line or 1}: {e}") from None
    return dict(description)
