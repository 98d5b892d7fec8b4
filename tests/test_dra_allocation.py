"""Servers on DRA devices, pure: capacity through the extended-resource bridge, what a
server's claims were allocated and what it is charged, how its GPU use is read, what
Kueue and a ResourceQuota count, and what ``check`` says of each flavor's form."""

from __future__ import annotations

import copy
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
import yaml

from jupyterhub_gpu.config.devices import device_lines
from jupyterhub_gpu.core.admission import Charge
from jupyterhub_gpu.core.capacity import flavor_capacity
from jupyterhub_gpu.core.dra import DraInventory, device_equivalents, pod_allocation
from jupyterhub_gpu.core.manifests import desired_objects
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.schedulers.kueue import device_class_mappings
from jupyterhub_gpu.core.selection import Request, request_for
from jupyterhub_gpu.core.usage import UsageRecord
from jupyterhub_gpu.service.dra_charges import ALLOCATION_WAIT, AllocationCharges
from jupyterhub_gpu.service.idle import ENGINE_ACTIVE, GPU_UTIL, candidates, shares_its_device
from jupyterhub_gpu.service.state import ServerPod
from jupyterhub_gpu.service.views import Server
from jupyterhub_gpu_dev.dcgm_dra import DraObjects, dra_samples
from jupyterhub_gpu_dev.dcgm_exporter import PodOnNode
from jupyterhub_gpu_dev.localcluster.dra import device_classes, render_resource_slices
from jupyterhub_gpu_dev.localcluster.nodepools import NodePoolError, render_nodes

H200 = "NVIDIA-H200-NVL"
#: a DRA node of four H200s (GPU 0 as two 3g.71gb partitions) whose class maps
#: nvidia.com/gpu, and a device-plugin node of two A100s
POOLS = {
    "dra": {"extended_resource_name": "nvidia.com/gpu"},
    "node_pools": {
        "h200dra": {
            "count": 1,
            "cpu": 64,
            "memory": "512Gi",
            "dra": True,
            "gpu": {
                "product": H200,
                "memory": 143771,
                "count": 4,
                "mig": {"strategy": "mixed", "devices": {"3g.71gb": 2}},
            },
        },
        "a100": {
            "count": 1,
            "cpu": 32,
            "memory": "128Gi",
            "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "count": 2},
        },
    },
}
NODES = render_nodes(POOLS)
SLICES = render_resource_slices(POOLS)
CLASSES = device_classes(POOLS)
PRODUCT = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200 NVL'"
POLICY = parse_policy(
    flavors={
        # pods ask for nvidia.com/gpu; the H200s are the DRA driver's
        "h200": {
            "kind": "gpu",
            "device_class": "gpu.nvidia.com",
            "node_selector": {"nvidia.com/gpu.product": H200},
        },
        # any node: the A100s' device plugin, or the H200s through the bridge
        "any": {"kind": "gpu"},
        "h200-claim": {"kind": "dra", "selectors": [PRODUCT]},
        "mig-3g": {
            "kind": "dra",
            "device_class": "mig.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].profile == '3g.71gb'"],
        },
        "weighted": {"kind": "dra", "gpu_equivalents": 0.5},
    },
    profiles={"p": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}},
    groups={
        "lab": {
            "quota": {"gpus": 2},
            "profiles": ["p"],
            "idle": {"after": "1h"},
        }
    },
)


def claim(pod_uid: str, *devices: str, node: str = "h200dra-0", name: str = "c") -> dict:
    """A claim owned by the pod ``pod_uid``, allocated ``devices`` of the node's pool."""
    results = [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d} for d in devices
    ]
    return {
        "metadata": {
            "name": name,
            "namespace": "lab",
            "ownerReferences": [
                {"kind": "Pod", "name": f"pod-{pod_uid}", "uid": pod_uid, "controller": True}
            ],
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


def inventory(*claims: dict) -> DraInventory:
    return DraInventory(SLICES, CLASSES, claims)


# ---- the simulated driver's DeviceClass and the description's dra: key ---------------


def test_the_simulated_class_maps_the_extended_resource_only_when_asked():
    assert "extendedResourceName" not in device_classes({"node_pools": {}})[0]["spec"]
    gpu, mig = CLASSES
    assert gpu["metadata"]["name"] == "gpu.nvidia.com"
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in mig["spec"]
    with pytest.raises(NodePoolError, match=r"dra.extended_resource_name: expected an extended"):
        device_classes({"dra": {"extended_resource_name": "cpu"}})
    with pytest.raises(NodePoolError, match=r"dra.colour: unknown key"):
        render_resource_slices({"dra": {"colour": "red"}, "node_pools": {}})


# ---- capacity through the bridge -----------------------------------------------------


def test_a_bridged_flavor_counts_the_dra_gpus_its_pods_can_land_on():
    capacity = flavor_capacity(POLICY, NODES, [], dra=inventory(claim("u1", "gpu-2")))
    h200 = capacity["h200"]
    # the three whole H200s (GPU 0 is in MIG mode: mig.nvidia.com's), one allocated
    assert (h200.allocatable, h200.allocated, h200.free, h200.nodes) == (3, 1, 2, 1)
    assert h200.note == "3 of them through DeviceClass gpu.nvidia.com (DRA)"
    # without a node selector both forms serve it: the A100s' plugin and the H200s
    assert (capacity["any"].allocatable, capacity["any"].free) == (2 + 3, 2 + 2)
    # the claims' own flavor sees the same devices taken
    assert capacity["h200-claim"].free == 2


def test_a_bridged_flavor_says_when_no_class_maps_its_resource_or_dra_is_unknown():
    unmapped = copy.deepcopy(CLASSES)
    del unmapped[0]["spec"]["extendedResourceName"]
    capacity = flavor_capacity(POLICY, NODES, [], dra=DraInventory(SLICES, unmapped))
    assert capacity["h200"].allocatable == 0
    assert capacity["h200"].note == (
        "no DeviceClass maps nvidia.com/gpu (extendedResourceName), so no DRA device serves "
        "it: is gpu.nvidia.com's extendedResourceName set?"
    )
    # a flavor that does not say it is bridged is counted from its device plugin alone
    assert capacity["any"].allocatable == 2
    # unreadable DRA objects: the bridged flavor is unknown, the other its plugin's count
    capacity = flavor_capacity(POLICY, NODES, [], dra=DraInventory(problem="403 Forbidden"))
    assert capacity["h200"].free is None
    assert capacity["h200"].note == "DRA devices unknown: 403 Forbidden"
    assert capacity["any"].allocatable == 2


def test_a_class_serves_its_implicit_extended_resource_name_too():
    policy = parse_policy(
        flavors={
            "implicit": {
                "kind": "gpu",
                "resource": "deviceclass.resource.kubernetes.io/mig.nvidia.com",
            }
        }
    )
    capacity = flavor_capacity(policy, NODES, [], dra=inventory())
    assert capacity["implicit"].allocatable == 2  # the two 3g.71gb partitions


# ---- what a server was allocated, and what it is charged -----------------------------


def test_a_servers_allocation_is_what_its_claims_hold_and_what_each_device_is():
    found = inventory(claim("u1", "gpu-1", "gpu-2"), claim("u2", "gpu-0-mig-3g71gb-1"))
    whole = pod_allocation(found, "u1")
    assert whole.gpus == 2
    assert whole.words == (
        "gpu-1 (NVIDIA H200 NVL) on h200dra-0",
        "gpu-2 (NVIDIA H200 NVL) on h200dra-0",
    )
    mig = pod_allocation(found, "u2")
    assert mig.gpus == Fraction(3, 7)
    assert mig.words == ("gpu-0-mig-3g71gb-1 (NVIDIA H200 NVL 3g.71gb) on h200dra-0",)
    # a flavor's own gpu_equivalents, per device, overrides what the device is
    assert pod_allocation(found, "u1", Fraction(1, 2)).gpus == 1
    assert pod_allocation(found, "nobody") is None
    assert device_equivalents({"driver": "x", "attributes": {}}) is None


def record(uid: str, flavor: str, started: float = 1000.0, gpus: float = 1.0) -> UsageRecord:
    return UsageRecord(
        uid=uid,
        key=f"lab/pod-{uid}",
        user="ann",
        group="lab",
        profile="p",
        flavor=flavor,
        gpus=gpus,
        started=started,
        last_seen=started,
    )


def test_a_dra_server_is_charged_its_allocation_once_seen_and_keeps_it():
    charges = AllocationCharges(POLICY)
    asked = record("u2", "mig-3g", gpus=1.0)  # as if admitted at a whole GPU
    # its claim not seen yet, just after its start: not recorded yet
    assert charges.charged(asked, inventory(), now=1000 + 5) is None
    charged = charges.charged(asked, inventory(claim("u2", "gpu-0-mig-3g71gb-0")), now=1010)
    assert charged.gpus == pytest.approx(3 / 7)
    assert charged.started == asked.started
    # fixed once seen: the claim going with the pod changes nothing
    assert charges.charged(asked, inventory(), now=1020).gpus == pytest.approx(3 / 7)
    charges.keep_only([])
    # never seen within the wait, or DRA unreadable past it: what it asked for
    late = 1000 + ALLOCATION_WAIT + 1
    assert charges.charged(asked, inventory(), now=late) == asked
    unreadable = DraInventory(problem="403 Forbidden")
    assert charges.charged(asked, unreadable, now=1001) is None
    assert charges.charged(asked, unreadable, now=late) == asked
    # a device-plugin server is recorded at once, as it asked
    plugin = record("u3", "any")
    assert charges.charged(plugin, inventory(), now=1001) == plugin
    # ... unless the bridge gave it DRA devices: then those
    assert charges.charged(plugin, inventory(claim("u3", "gpu-3")), now=1001).gpus == 1


def test_a_mig_partition_claimed_through_dra_is_admitted_quoted_and_counted_at_its_slices():
    """A dra flavor whose selector requires the 3g profile: admission, the group's
    ResourceQuota and Kueue's ClusterQueue count each partition 3/7 of a GPU, as GPU
    time does once it is allocated (and as a mig flavor of the device plugin is)."""
    flavors = {
        "mig-3g": {
            "kind": "dra",
            "device_class": "mig.nvidia.com",
            "selectors": ["device.attributes['gpu.nvidia.com'].profile == '3g.71gb'"],
        },
        # any partition of the class: which one is chosen at scheduling, so a whole GPU
        "mig-any": {"kind": "dra", "device_class": "mig.nvidia.com"},
        # a selector that also accepts whole GPUs says nothing of the size
        "either": {
            "kind": "dra",
            "selectors": [
                "device.attributes['gpu.nvidia.com'].profile == '3g.71gb' || "
                "device.attributes['gpu.nvidia.com'].type == 'gpu'"
            ],
        },
        "not-3g": {
            "kind": "dra",
            "selectors": ["!(device.attributes['gpu.nvidia.com'].profile == '3g.71gb')"],
        },
    }
    policy = parse_policy(
        scheduler={"name": "kueue"},
        namespace_per_group=True,
        flavors=flavors,
        profiles={"p": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "mig-3g"}}},
        groups={"lab": {"quota": {"gpus": 2}, "profiles": ["p"]}},
    )
    units = {name: f.unit_equivalents for name, f in policy.flavors.items()}
    assert units == {
        "mig-3g": Fraction(3, 7),
        "mig-any": 1,
        "either": 1,
        "not-3g": 1,
    }
    # admission: a server of two partitions is charged 6/7 of a GPU
    profile = policy.profiles["p"]
    assert request_for(profile, policy.flavors["mig-3g"], 2).gpus == Fraction(6, 7)
    # the quota of 2 GPUs is four 3g partitions, for the API server and for Kueue
    devices = "mig.nvidia.com.deviceclass.resource.k8s.io/devices"
    objects = desired_objects(policy, "jhub")
    (resource_quota,) = [o for o in objects if o["kind"] == "ResourceQuota"]
    assert resource_quota["spec"]["hard"][devices] == "4"
    (queue,) = [o for o in objects if o["kind"] == "ClusterQueue"]
    nominal = {
        r["name"]: r["nominalQuota"]
        for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    }
    assert nominal[devices] == "4"
    # GPU time: the partition it was allocated, the same 3/7
    allocated = inventory(claim("u1", "gpu-0-mig-3g71gb-0"))
    per_device = policy.flavors["mig-3g"].dra_equivalents
    assert pod_allocation(allocated, "u1", per_device).gpus == Fraction(3, 7)
    # a gpu_equivalents of its own is what admission and GPU time both charge
    weighted = parse_policy(flavors={"w": {**flavors["mig-3g"], "gpu_equivalents": 0.5}})
    assert weighted.flavors["w"].unit_equivalents == Fraction(1, 2)
    assert pod_allocation(allocated, "u1", weighted.flavors["w"].dra_equivalents).gpus == Fraction(
        1, 2
    )


# ---- how its GPU use is read (the idle rule) -----------------------------------------


NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def idle_candidate(flavor: str, found: DraInventory | None):
    charge = Charge("lab/pod-u1", "ann", "lab", Request(devices=((flavor, 1),)), "in-quota")
    pod = ServerPod(key=charge.key, charge=charge, user="ann", servername="", created=NOW, uid="u1")
    server = Server("ann", "", "lab", None, NOW - timedelta(hours=2), True, None)
    (candidate,) = candidates(POLICY, [server], {"p": pod}, found)
    return candidate


def test_a_dra_server_is_judged_by_the_metric_of_the_devices_it_holds():
    mig = inventory(claim("u1", "gpu-0-mig-3g71gb-0"))
    assert idle_candidate("mig-3g", mig).metric == ENGINE_ACTIVE
    assert idle_candidate("h200-claim", inventory(claim("u1", "gpu-1"))).metric == GPU_UTIL
    # a bridged server on a DRA GPU, and one whose allocation is not known
    assert idle_candidate("h200", inventory(claim("u1", "gpu-1"))).metric == GPU_UTIL
    assert idle_candidate("h200-claim", None).metric == GPU_UTIL
    shared = parse_policy(
        flavors={"ts": {"kind": "dra", "sharing": "TimeSlicing"}},
        profiles={"p": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "ts"}}},
        groups={"lab": {"quota": {"gpus": 1}, "profiles": ["p"], "idle": {"after": "1h"}}},
    )
    charge = Charge("lab/pod-u1", "ann", "lab", Request(devices=(("ts", 1),)), "in-quota")
    pod = ServerPod(key=charge.key, charge=charge, user="ann", servername="", created=NOW)
    server = Server("ann", "", "lab", None, NOW - timedelta(hours=2), True, None)
    (candidate,) = candidates(shared, [server], {"p": pod}, None)
    assert candidate.metric is None  # a shared device: notebook activity
    # and showback's utilisation tells nothing of one server's use of it
    assert shares_its_device(shared.flavors["ts"])
    assert not shares_its_device(POLICY.flavors["h200-claim"])


def test_the_simulated_exporter_reports_dra_devices_as_dcgm_exporter_does():
    pods = [PodOnNode("lab", "jupyter-ann", "u1", "h200dra-0", "notebook", {})]
    objects = DraObjects(SLICES, [claim("u1", "gpu-1", name="jupyter-ann-gpu-x")])
    samples = dra_samples(
        pods, objects, lambda p: 40.0, lambda labels, p: {**labels, "pod": p.name}
    )
    util = {s[1]["gpu"]: s for s in samples if s[0] == GPU_UTIL}
    assert sorted(util) == ["1", "2", "3"]  # the whole GPUs; GPU 0's partitions unheld
    _, labels, value = util["1"]
    assert value == 40.0
    assert labels["pod"] == "jupyter-ann"
    assert labels["dra_claim_name"] == "jupyter-ann-gpu-x"
    assert (labels["dra_pool_name"], labels["dra_device_name"]) == ("h200dra-0", "gpu-1")
    assert labels["modelName"] == "NVIDIA H200 NVL"
    assert labels["UUID"].startswith("GPU-")
    assert util["2"][1].get("pod") is None
    assert util["2"][2] == 0.0
    # a MIG partition reports its engine's activity, with its profile and instance
    objects = DraObjects(SLICES, [claim("u1", "gpu-0-mig-3g71gb-1")])
    (engine,) = [
        s
        for s in dra_samples(pods, objects, lambda p: 40.0, lambda lb, p: lb)
        if s[0] == ENGINE_ACTIVE
    ]
    assert engine[1]["GPU_I_PROFILE"] == "3g.71gb"
    assert engine[1]["GPU_I_ID"] == "1"
    assert engine[2] == 0.4
    assert "pod" not in engine[1]  # reported as by an exporter that does not map DRA


# ---- what Kueue and a ResourceQuota count, and what check says -----------------------


def test_kueue_and_the_resource_quota_count_dra_devices_by_their_class():
    policy = parse_policy(**{**POLICY_ARGS, "scheduler": {"name": "kueue"}})
    objects = desired_objects(policy, "jhub")
    (queue,) = [o for o in objects if o["kind"] == "ClusterQueue"]
    group = queue["spec"]["resourceGroups"][0]
    gpu_class = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    assert gpu_class in group["coveredResources"]
    assert "mig.nvidia.com.deviceclass.resource.k8s.io/devices" in group["coveredResources"]
    quota = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert quota[gpu_class] == "2"
    assert quota["nvidia.com/gpu"] == "2"
    assert device_class_mappings(policy) == [
        {"name": gpu_class, "deviceClassNames": ["gpu.nvidia.com"]},
        {
            "name": "mig.nvidia.com.deviceclass.resource.k8s.io/devices",
            "deviceClassNames": ["mig.nvidia.com"],
        },
    ]
    # a bridged server's claim counts as any claim of its class in the namespace's quota
    namespaced = parse_policy(**{**POLICY_ARGS, "namespace_per_group": True})
    (resource_quota,) = [
        o for o in desired_objects(namespaced, "jhub") if o["kind"] == "ResourceQuota"
    ]
    assert resource_quota["spec"]["hard"][gpu_class] == "2"
    assert resource_quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "2"


def test_a_flavor_of_a_resource_a_class_serves_is_capped_in_the_classs_devices_too():
    """ops reaches only ``any`` (nvidia.com/gpu, no device_class); h200 says DeviceClass
    gpu.nvidia.com serves nvidia.com/gpu. The class serves ``any``'s pods on the DRA
    nodes too (a claim kube-scheduler makes, which the ResourceQuota counts), and Kueue,
    mapping the class, counts every nvidia.com/gpu request under the class's name: ops
    gets its quota there, not 0 (which would hold every server of ops forever)."""
    args = {
        "scheduler": {"name": "kueue"},
        "namespace_per_group": True,
        "flavors": {
            "h200": {"kind": "gpu", "device_class": "gpu.nvidia.com"},
            "any": {"kind": "gpu"},
            "a100-1g": {"kind": "mig", "profile": "1g.5gb", "product": "NVIDIA-A100"},
        },
        "profiles": {
            "h200": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}},
            "any": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "any"}},
            "mig": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "a100-1g"}},
        },
        "groups": {
            "lab": {"quota": {"gpus": 1}, "profiles": ["h200"]},
            "ops": {"quota": {"gpus": 2}, "profiles": ["any"]},
            "mig": {"quota": {"gpus": 1}, "profiles": ["mig"]},
        },
    }
    objects = desired_objects(parse_policy(**args), "jhub")
    gpu_class = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"

    def nominal(group: str) -> dict[str, str]:
        (queue,) = [
            o for o in objects if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == group
        ]
        (flavor,) = queue["spec"]["resourceGroups"][0]["flavors"]
        return {r["name"]: r["nominalQuota"] for r in flavor["resources"]}

    def hard(group: str) -> dict[str, str]:
        (quota,) = [
            o
            for o in objects
            if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"].endswith(group)
        ]
        return quota["spec"]["hard"]

    assert nominal("ops")[gpu_class] == "2"
    assert nominal("ops")["nvidia.com/gpu"] == "2"
    assert hard("ops")[gpu_class] == "2"
    assert nominal("lab")[gpu_class] == "1"
    # a resource no class serves is counted in its own name alone
    assert nominal("mig")["nvidia.com/gpu"] == "0"
    assert nominal("mig")[gpu_class] == "0"
    assert nominal("mig")["nvidia.com/mig-1g.5gb"] == "7"
    # check says where Kueue counts the flavor that does not name the class
    lines = device_lines(parse_policy(**args))
    assert (
        "flavor any: Kueue counts its nvidia.com/gpu under gpu.nvidia.com.deviceclass."
        "resource.k8s.io/devices once its Configuration maps DeviceClass gpu.nvidia.com "
        "(it counts every request of a resource a mapped class serves there); the "
        "ClusterQueues cap the flavor under both names"
    ) in lines
    assert not [
        line for line in lines if line.startswith(("flavor h200: Kueue", "flavor a100-1g: Kueue"))
    ]


POLICY_ARGS = {
    "flavors": {
        "h200": {"kind": "gpu", "device_class": "gpu.nvidia.com"},
        "mig-3g": {"kind": "dra", "device_class": "mig.nvidia.com"},
    },
    "profiles": {"p": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}},
    "groups": {"lab": {"quota": {"gpus": 2}, "profiles": ["p"]}},
}


def test_check_says_which_form_serves_each_flavor(tmp_path):
    assert device_lines(POLICY)[:3] == [
        "flavor h200: nvidia.com/gpu served by DRA (the extended-resource bridge: DeviceClass "
        "gpu.nvidia.com must set extendedResourceName: nvidia.com/gpu; kube-scheduler "
        "allocates from ResourceSlices on nodes that do not advertise it; Kubernetes 1.36 "
        "on, or 1.34-1.35 with the DRAExtendedResource feature gate)",
        "flavor any: a device plugin's nvidia.com/gpu (node allocatable), or on nodes "
        "without it DeviceClass gpu.nvidia.com's devices through the extended-resource "
        "bridge (a flavor says it serves nvidia.com/gpu)",
        "flavor h200-claim: DRA claims of DeviceClass gpu.nvidia.com (a ResourceClaimTemplate "
        "per count; kube-scheduler allocates from ResourceSlices; Kubernetes 1.34 on)",
    ]
    values = tmp_path / "values.yaml"
    policy = {**POLICY_ARGS, "scheduler": {"name": "kueue"}}
    config = {"JupyterHub": {"spawner_class": "gpu-kubespawner"}, "GPUPolicy": policy}
    values.write_text(yaml.safe_dump({"hub": {"config": config}}))
    result = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.cli", "check", str(values)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        "flavor h200: nvidia.com/gpu served by DRA (the extended-resource bridge" in result.stdout
    )
    assert lines[-1] == (
        "Kueue counts DRA devices only where its own Configuration maps their DeviceClass: "
        "resources.deviceClassMappings: [{name: gpu.nvidia.com.deviceclass.resource.k8s.io/"
        "devices, deviceClassNames: [gpu.nvidia.com]}, {name: mig.nvidia.com.deviceclass."
        "resource.k8s.io/devices, deviceClassNames: [mig.nvidia.com]}]"
    )
