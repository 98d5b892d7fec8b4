"""The kinds of object the reconciler manages, in the order it creates them, and how an
object of one is named in a report and removed by hand."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..core.schedulers import object_kinds


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool
    #: what to do when the API server does not know the kind
    fix: str = ""

    @property
    def base(self) -> str:
        return (
            f"/api/{self.api_version}"
            if "/" not in self.api_version
            else (f"/apis/{self.api_version}")
        )

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        path = self.base
        if self.namespaced and namespace:
            path += f"/namespaces/{quote(namespace)}"
        path += f"/{self.plural}"
        if name:
            path += f"/{quote(name)}"
        return path


def _kinds(namespaced: bool) -> list[Kind]:
    """The schedulers' kinds (``core.schedulers``), cluster-wide or namespaced."""
    return [
        Kind(k.api_version, k.kind, k.plural, k.namespaced, k.fix)
        for k in object_kinds()
        if k.namespaced == namespaced
    ]


#: every kind the reconciler may own, in creation order (pruned in reverse): the
#: schedulers' cluster-wide ones (queues) after PriorityClasses, their namespaced ones
#: (Kueue's LocalQueues) after what a group namespace holds
KINDS = (
    Kind("v1", "Namespace", "namespaces", False),
    Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False),
    *_kinds(namespaced=False),
    Kind("v1", "ResourceQuota", "resourcequotas", True),
    Kind("v1", "LimitRange", "limitranges", True),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", True),
    *_kinds(namespaced=True),
    Kind(
        "resource.k8s.io/v1",
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
        True,
        "the cluster needs Dynamic Resource Allocation (resource.k8s.io/v1, Kubernetes >= 1.34)",
    ),
)
KIND_BY_TYPE = {(k.api_version, k.kind): k for k in KINDS}


def object_name(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def delete_command(kind: Kind, obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    where = f" -n {meta['namespace']}" if meta.get("namespace") else ""
    return f"kubectl delete {kind.plural} {meta['name']}{where}"


def namespace_of(obj: Mapping[str, Any]) -> str | None:
    """The namespace an object is, or is in (None: cluster-wide)."""
    meta = obj["metadata"]
    return meta["name"] if obj["kind"] == "Namespace" else meta.get("namespace")


def kind_text(kind: Kind) -> str:
    return f"{kind.api_version} {kind.kind}"
