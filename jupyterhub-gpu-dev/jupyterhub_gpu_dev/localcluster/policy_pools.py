"""Simulated node pools derived from a policy: the hardware its flavors describe.

For every flavor, a pool of nodes that offers it the way real hardware would,
in the node pool format of ``nodepools`` (which renders GPU Feature Discovery's
labels and the device plugins' resources): whole GPUs under their product label,
MIG slices in the mixed or the single strategy, time-sliced or MPS replicas
(renamed to ``nvidia.com/gpu.shared`` or not), whole GPUs with their device
memory for KAI fractions, HAMi's split devices with their memory and cores. A
``dra`` flavor, or a ``gpu`` flavor a DRA driver serves (its ``device_class``),
gets a pool run by NVIDIA's DRA driver: its GPUs, or the MIG partitions its
selectors name for the ``mig.nvidia.com`` class, published as ResourceSlices.
Each pool has enough devices for every group that may use the flavor to reach its
limit at once (up to ``MAX_NODES`` nodes a pool); every GPU node carries the
usual ``nvidia.com/gpu`` taint. A CPU pool holds the CPU-only servers.

Pure: the policy in, a node pool description out.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from jupyterhub_gpu.core.model import Flavor, Group, Policy
from jupyterhub_gpu.core.selection import units_per_server

from .dra import DEVICE_CLASSES

#: GPUs on one simulated node, as on the usual 8-GPU servers
GPUS_PER_NODE = 8
#: a pool never grows past this many nodes, however large the limits
MAX_NODES = 16
#: device memory (MiB) of a GPU whose model the policy does not name: an 80 GB part
DEFAULT_MEMORY = 81920
DEFAULT_PRODUCT = "NVIDIA-H100-80GB-HBM3"
#: HAMi splits each device into this many shares by default (deviceSplitCount)
HAMI_SPLIT = 10
#: node_selector keys the pool's GPU description sets itself (GFD's labels)
_GFD_KEYS = ("nvidia.com/gpu.product", "nvidia.com/gpu.sharing-strategy")


def _largest_requests(policy: Policy, group: Group) -> dict[str, int]:
    """Per flavor, the most units one server of this group can ask for."""
    largest: dict[str, int] = defaultdict(int)
    for name in group.profiles:
        profile = policy.profiles[name]
        if profile.gpu is None:
            continue
        counts = [profile.gpu.count]
        flavors = [profile.gpu.flavor]
        for option_name, option in profile.options.items():
            if option_name == "gpus":
                counts += [int(value) for _, value in option.choices]
            elif option_name == "flavor":
                flavors += [str(value) for _, value in option.choices]
        for flavor in flavors:
            units = units_per_server(policy.flavors[flavor], max(counts))
            largest[flavor] = max(largest[flavor], units)
    return largest


def units_needed(policy: Policy) -> dict[str, int]:
    """Per flavor, the units every group that may use it can hold at once: its
    limit (in this flavor's units), or one largest server for an unlimited group."""
    needed: dict[str, int] = defaultdict(int)
    for group in policy.all_groups:
        for name, largest in _largest_requests(policy, group).items():
            flavor = policy.flavors[name]
            caps = []
            if not group.unlimited:
                for level in policy.ancestors(group.name):
                    if level.limit.gpus is not None:
                        caps.append(math.floor(level.limit.gpus / flavor.unit_equivalents))
                    if name in level.limit.flavors:
                        caps.append(level.limit.flavors[name])
            needed[name] += max(min(caps), largest) if caps else largest
    return dict(needed)


def _product(flavor: Flavor) -> str:
    product = flavor.product or flavor.node_selector.get("nvidia.com/gpu.product")
    if not product:
        if flavor.kind == "mig" and flavor.mig_profile:
            # a GPU model that has this MIG profile
            return MIG_PRODUCTS[_mig_memory(flavor.mig_profile)]
        return DEFAULT_PRODUCT
    # the labels GFD gives shared and single-strategy MIG devices are the product's
    # own with a suffix; the pool describes the product, and nodepools adds it back
    for suffix in ("-SHARED", f"-MIG-{flavor.mig_profile}"):
        if product.endswith(suffix):
            return product[: -len(suffix)]
    return product


def _device_memory(flavor: Flavor, product: str) -> int:
    """MiB of one device: the flavor's ``device_memory``, else what the model has."""
    if flavor.device_memory:
        return flavor.device_memory
    if flavor.kind == "mig" and flavor.mig_profile:
        return _mig_memory(flavor.mig_profile)
    size = re.search(r"(\d+)GB", product)
    if size:
        return int(size.group(1)) * 1024
    if "H200" in product:
        return 143771  # H200 NVL, as GFD reports it
    return DEFAULT_MEMORY


def _mig_memory(profile: str) -> int:
    """The device memory (MiB) of the GPU a MIG profile comes from: 7g.80gb -> 80 GB."""
    slices, size = profile.split("g.", 1)
    gigabytes = int(size.split("gb", 1)[0])
    return 40960 if gigabytes / int(slices) * 7 <= 40 else 81920


#: a GPU model with MIG, by its device memory
MIG_PRODUCTS = {40960: "NVIDIA-A100-SXM4-40GB", 81920: "NVIDIA-H100-80GB-HBM3"}


#: what a DRA flavor's selectors may say of the devices it wants (NVIDIA's attributes)
_PRODUCT_SELECTOR = re.compile(r"\.productName\s*==\s*['\"]([^'\"]+)['\"]")
_PROFILE_SELECTOR = re.compile(r"\.profile\s*==\s*['\"](\d+g\.\d+gb)['\"]")


def _dra_pool(flavor: Flavor, units: int) -> dict[str, Any]:
    """A pool run by NVIDIA's DRA driver with ``units`` devices a claim of the flavor
    matches: GPUs of the product its selectors name, or MIG partitions of the profile
    they name for the ``mig.nvidia.com`` class."""
    text = " ".join(flavor.selectors)
    named = _PRODUCT_SELECTOR.search(text)
    product = named.group(1).replace(" ", "-") if named else _product(flavor)
    gpu: dict[str, Any] = {"product": product, "count": GPUS_PER_NODE}
    per_node = GPUS_PER_NODE
    profile = _PROFILE_SELECTOR.search(text)
    if flavor.device_class == "mig.nvidia.com":
        mig = profile.group(1) if profile else "1g.10gb"
        gpu["memory"] = _mig_memory(mig)
        gpu["product"] = product if named else MIG_PRODUCTS[_mig_memory(mig)]
        per_node = GPUS_PER_NODE * (7 // int(mig.split("g.", 1)[0]))
        gpu["mig"] = {"strategy": "mixed", "devices": {mig: per_node}}
    else:
        gpu["memory"] = _device_memory(flavor, product)
    nodes = min(max(math.ceil(units / per_node), 1), MAX_NODES)
    pool: dict[str, Any] = {"count": nodes, "cpu": 64, "memory": "512Gi", "dra": True}
    labels = {k: v for k, v in flavor.node_selector.items() if k not in _GFD_KEYS}
    if labels:
        pool["labels"] = labels
    pool["gpu"] = gpu
    return pool


def pool_for(flavor: Flavor, units: int) -> dict[str, Any] | None:
    """One pool that offers ``units`` of this flavor."""
    if flavor.kind == "dra" or flavor.bridged:
        return _dra_pool(flavor, units)
    product = _product(flavor)
    gpu: dict[str, Any] = {
        "product": product,
        "memory": _device_memory(flavor, product),
        "count": GPUS_PER_NODE,
    }
    per_node = GPUS_PER_NODE
    if flavor.kind == "mig":
        assert flavor.mig_profile is not None
        instances = GPUS_PER_NODE * (7 // int(flavor.mig_profile[0]))
        gpu["mig"] = {
            "strategy": flavor.mig_strategy or "mixed",
            "devices": {flavor.mig_profile: instances},
        }
        per_node = instances
    elif flavor.kind in ("timeslice", "mps"):
        gpu["sharing"] = "time-slicing" if flavor.kind == "timeslice" else "mps"
        gpu["replicas"] = flavor.replicas
        gpu["rename"] = flavor.resource == "nvidia.com/gpu.shared"
        per_node = GPUS_PER_NODE * flavor.replicas
    elif flavor.kind == "fraction":
        # pods ask for no device: units are fractions of whole GPUs
        per_node = math.floor(GPUS_PER_NODE / flavor.unit_equivalents)
        gpu["memory"] = max(gpu["memory"], flavor.gpu_memory or 0)
    elif flavor.kind == "hami":
        gpu["hami_split"] = HAMI_SPLIT
        per_node = GPUS_PER_NODE * HAMI_SPLIT
    labels = {k: v for k, v in flavor.node_selector.items() if k not in _GFD_KEYS}
    nodes = min(max(math.ceil(units / per_node), 1), MAX_NODES)
    pool: dict[str, Any] = {"count": nodes, "cpu": 64, "memory": "512Gi", "gpu": gpu}
    if labels:
        pool["labels"] = labels
    return pool


def node_pools_for(policy: Policy) -> dict[str, Any]:
    """The node pool description (``node_pools: {...}``) that offers every flavor; a
    bridged flavor's DeviceClass maps its resource (``dra.extended_resource_name``)."""
    needed = units_needed(policy)
    pools: dict[str, Any] = {"cpu": {"count": 2, "cpu": 32, "memory": "128Gi"}}
    for name, flavor in policy.flavors.items():
        pools[f"flavor-{name}"] = pool_for(flavor, needed.get(name, 0))
    description: dict[str, Any] = {"node_pools": pools}
    bridged = _bridged_resource(policy)
    if bridged:
        description["dra"] = {"extended_resource_name": bridged}
    return description


def _bridged_resource(policy: Policy) -> str | None:
    """The extended resource the simulated DeviceClass maps: the first bridged flavor's
    (a DeviceClass maps one)."""
    return next((f.resource for f in policy.flavors.values() if f.bridged), None)


def without_nodes(policy: Policy) -> list[str]:
    """The flavors the derived pools cannot offer, each with why."""
    bridged = _bridged_resource(policy)
    classes = [c["metadata"]["name"] for c in DEVICE_CLASSES]
    missing = []
    for name, flavor in policy.flavors.items():
        if (flavor.kind == "dra" or flavor.bridged) and flavor.device_class not in classes:
            missing.append(
                f"{name}: the simulated DRA driver installs the DeviceClasses "
                f"{' and '.join(classes)}, not {flavor.device_class}"
            )
        elif flavor.bridged and flavor.resource != bridged:
            missing.append(f"{name}: the simulated DeviceClass gpu.nvidia.com maps {bridged} only")
    return missing
