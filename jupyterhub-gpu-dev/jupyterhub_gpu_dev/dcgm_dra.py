"""The simulated DCGM exporter's DRA devices: what dcgm-exporter reports for the GPUs
NVIDIA's DRA driver publishes, with its DRA mapping on (``--kubernetes-enable-dra``,
which reads claims from the kubelet's pod-resources API). See ``dcgm_exporter``.

Pure: the slices, claims and pods in, the samples out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dcgm_exporter import PodOnNode

#: dcgm-exporter's metrics: GPU utilisation in percent, and the graphics engine's
#: active ratio (what MIG instances report)
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
DRIVER_VERSION = "570.133.20"
#: NVIDIA's DRA driver, whose slices publish a DRA node's GPUs
DRA_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class DraObjects:
    """The DRA driver's slices and the cluster's claims, in the API's JSON form."""

    slices: list[Mapping[str, Any]] = field(default_factory=list)
    claims: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def nodes(self) -> set[str]:
        """Nodes whose GPUs NVIDIA's DRA driver publishes (no device plugin there)."""
        return {
            spec["nodeName"]
            for s in self.slices
            if (spec := s.get("spec") or {}).get("driver") == DRA_DRIVER and spec.get("nodeName")
        }


def _value(attributes: Mapping[str, Any], name: str) -> Any:
    value = attributes.get(name) or attributes.get(f"{DRA_DRIVER}/{name}") or {}
    return next((value[k] for k in ("string", "int", "bool") if k in value), None)


def dra_samples(
    pods: list[PodOnNode],
    dra: DraObjects,
    percent: Callable[[PodOnNode], float],
    with_pod: Callable[[dict[str, str], PodOnNode], dict[str, str]],
) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of every DRA device dcgm-exporter reports (pure): each
    whole GPU, and each MIG partition a claim holds; a pod's claims' devices with the
    pod's labels and the claim's."""
    by_uid = {p.uid: p for p in pods}
    held: dict[tuple[str, str], tuple[PodOnNode, Mapping[str, Any]]] = {}
    for claim in dra.claims:
        metadata = claim.get("metadata") or {}
        owner = next(
            (o for o in metadata.get("ownerReferences") or [] if o.get("kind") == "Pod"), None
        )
        pod = by_uid.get((owner or {}).get("uid", ""))
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if pod is not None and result.get("driver") == DRA_DRIVER:
                held[(result.get("pool", ""), result.get("device", ""))] = (pod, claim)
    samples: list[tuple[str, dict[str, str], float]] = []
    for resource_slice in sorted(dra.slices, key=lambda s: s["metadata"]["name"]):
        spec = resource_slice.get("spec") or {}
        if spec.get("driver") != DRA_DRIVER:
            continue
        node, pool = spec.get("nodeName", ""), (spec.get("pool") or {}).get("name", "")
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            mig = _value(attributes, "type") == "mig"
            gpu = _value(attributes, "parentIndex" if mig else "index")
            labels = {
                "gpu": str(gpu),
                "UUID": str(_value(attributes, "parentUUID" if mig else "uuid")),
                "pci_bus_id": f"00000000:{0x18 + int(gpu or 0):02X}:00.0",
                "device": f"nvidia{gpu}",
                "modelName": str(_value(attributes, "productName")),
            }
            if mig:
                labels["GPU_I_PROFILE"] = str(_value(attributes, "profile"))
                labels["GPU_I_ID"] = str(_value(attributes, "index"))
            labels["Hostname"] = node
            labels["DCGM_FI_DRIVER_VERSION"] = DRIVER_VERSION
            holder = held.get((pool, device.get("name", "")))
            if holder is None:
                if not mig:  # a MIG partition nobody holds reports nothing here
                    samples.append((GPU_UTIL, labels, 0.0))
                continue
            pod, claim = holder
            value = percent(pod)
            mapped = with_pod(labels, pod)
            if "pod" in mapped:  # the exporter maps DRA devices to their claims too
                mapped.update(
                    {
                        "dra_claim_name": claim["metadata"].get("name", ""),
                        "dra_claim_namespace": claim["metadata"].get("namespace", ""),
                        "dra_driver_name": DRA_DRIVER,
                        "dra_pool_name": pool,
                        "dra_device_name": device.get("name", ""),
                    }
                )
            if mig:
                samples.append((ENGINE_ACTIVE, mapped, value / 100))
            else:
                samples.append((GPU_UTIL, mapped, value))
    return samples
