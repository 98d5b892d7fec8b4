"""How the cluster gives each flavor its GPUs, as the values say: ``jupyterhub-gpu
check``'s lines, one per flavor, and what Kueue's own Configuration must say for a
policy with DRA devices.

- a device plugin advertises the flavor's extended resource in node allocatable
  (``gpu``, ``mig``, ``timeslice``, ``mps``, ``hami``);
- a DRA driver serves a ``gpu`` flavor's extended resource through a DeviceClass's
  ``extendedResourceName`` when the flavor names that ``device_class`` (Kubernetes'
  extended-resource bridge: pods still ask for ``nvidia.com/gpu``, kube-scheduler
  allocates a device from the ResourceSlices on a node without that resource);
- a ``dra`` flavor's servers claim devices of its DeviceClass from a
  ResourceClaimTemplate;
- KAI places ``fraction`` flavors by annotation, with no device request.

The values are the only source here (``check`` is offline); on a running cluster
the capacity each flavor shows counts what kube-scheduler can really use.
"""

from __future__ import annotations

from ..core.model import Flavor, Policy
from ..core.objects import device_class_resource, serving_classes
from ..core.schedulers.kueue import device_class_mappings


def device_form(flavor: Flavor, policy: Policy) -> str:
    """How a flavor's servers get their GPUs, in words."""
    if flavor.kind == "dra":
        return (
            f"DRA claims of DeviceClass {flavor.device_class} (a ResourceClaimTemplate "
            "per count; kube-scheduler allocates from ResourceSlices; Kubernetes 1.34 on)"
        )
    if flavor.bridged:
        return (
            f"{flavor.resource} served by DRA (the extended-resource bridge: DeviceClass "
            f"{flavor.device_class} must set extendedResourceName: {flavor.resource}; "
            "kube-scheduler allocates from ResourceSlices on nodes that do not advertise "
            "it; Kubernetes 1.36 on, or 1.34-1.35 with the DRAExtendedResource feature gate)"
        )
    if flavor.kind == "fraction":
        return "KAI's GPU sharing by annotation (no device request)"
    plugin = f"a device plugin's {flavor.resource} (node allocatable)"
    classes = serving_classes(policy, flavor.resource or "")
    if not classes:
        return plugin
    # the class serves every pod that asks for the resource, whatever its flavor says
    return (
        f"{plugin}, or on nodes without it DeviceClass {', '.join(classes)}'s devices "
        f"through the extended-resource bridge (a flavor says it serves {flavor.resource})"
    )


def kueue_bridge_line(policy: Policy, flavor: Flavor) -> str | None:
    """Where Kueue counts a flavor that does not name the class that serves its
    resource, though another flavor does; None for any other flavor."""
    if flavor.bridged or flavor.kind == "dra":
        return None
    classes = serving_classes(policy, flavor.resource or "")
    if not classes:
        return None
    names = ", ".join(device_class_resource(c) for c in classes)
    return (
        f"flavor {flavor.name}: Kueue counts its {flavor.resource} under {names} once its "
        f"Configuration maps DeviceClass {', '.join(classes)} (it counts every request of "
        "a resource a mapped class serves there); the ClusterQueues cap the flavor under "
        "both names"
    )


def device_lines(policy: Policy) -> list[str]:
    """``check``'s lines: each flavor's form, and Kueue's DRA mappings where needed."""
    lines = [f"flavor {name}: {device_form(f, policy)}" for name, f in policy.flavors.items()]
    if policy.scheduler.name == "kueue":
        lines += [
            line
            for f in policy.flavors.values()
            if (line := kueue_bridge_line(policy, f)) is not None
        ]
        mappings = device_class_mappings(policy)
        if mappings:
            entries = ", ".join(
                f"{{name: {m['name']}, deviceClassNames: [{m['deviceClassNames'][0]}]}}"
                for m in mappings
            )
            lines.append(
                "Kueue counts DRA devices only where its own Configuration maps their "
                f"DeviceClass: resources.deviceClassMappings: [{entries}]"
            )
    return lines
