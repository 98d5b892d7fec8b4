"""One policy per scheduler with one profile per GPU kind, and what each pod must carry.

Shared by the offline tests (the spawner code in-process) and the `k8s` tests
(a real hub creating real pods), so both assert the same expectations.
"""

from __future__ import annotations

from typing import Any

SCHEDULERS = ("default", "kai", "volcano", "kueue")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

FLAVORS: dict[str, dict[str, Any]] = {
    "gpu": {
        "kind": "gpu",
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
        "runtime_class_name": "nvidia",
    },
    "mig": {"kind": "mig", "profile": "1g.5gb", "strategy": "mixed"},
    "mig-single": {
        "kind": "mig",
        "profile": "1g.5gb",
        "strategy": "single",
        "product": "NVIDIA-A100-SXM4-40GB",
    },
    "timeslice": {"kind": "timeslice", "replicas": 4},
    "mps": {"kind": "mps", "replicas": 2, "resource": "nvidia.com/gpu"},
    "fraction": {"kind": "fraction", "gpu_memory": 20000, "device_memory": 80000},
    "hami": {"kind": "hami", "gpu_memory": 10240, "gpucores": 30, "device_memory": 40960},
    "dra": {"kind": "dra", "device_class": "gpu.nvidia.com"},
}


def kinds(scheduler: str) -> list[str]:
    return [k for k in FLAVORS if k != "fraction" or scheduler == "kai"]


def policy(scheduler: str, **extra: Any) -> dict[str, Any]:
    names = kinds(scheduler)
    return {
        "scheduler": {"name": scheduler},
        "flavors": {k: FLAVORS[k] for k in names},
        "profiles": {
            "cpu": {"cpu": "500m", "memory": "512Mi"},
            **{f"p-{k}": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": k}} for k in names},
        },
        "everyone": {"profiles": ["cpu"]},
        "groups": {"lab": {"quota": {"gpus": 100}, "profiles": [f"p-{k}" for k in names]}},
        **extra,
    }


def expected(kind: str, scheduler: str) -> dict[str, Any]:
    """The parts of the pod a (kind, scheduler) pair determines."""
    resources: dict[str, str] = {
        "gpu": {"nvidia.com/gpu": "1"},
        "mig": {"nvidia.com/mig-1g.5gb": "1"},
        "mig-single": {"nvidia.com/gpu": "1"},
        "timeslice": {"nvidia.com/gpu.shared": "1"},
        "mps": {"nvidia.com/gpu": "1"},
        "fraction": {},
        "hami": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"},
        "dra": {},
    }[kind]
    node_selector = {
        "gpu": {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"},
        "mig-single": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"},
        "mps": {"nvidia.com/gpu.sharing-strategy": "mps"},
    }.get(kind, {})
    scheduler_name = {"kai": "kai-scheduler", "volcano": "volcano"}.get(scheduler)
    if kind == "hami":
        scheduler_name = "hami-scheduler"
    labels = {
        "gpu.jupyterhub.org/group": "lab",
        "gpu.jupyterhub.org/profile": f"p-{kind}",
        "gpu.jupyterhub.org/flavor": kind,
        "gpu.jupyterhub.org/tier": "in-quota",
    }
    annotations: dict[str, str] = {}
    if scheduler == "kai":
        labels["kai.scheduler/queue"] = "lab"
    if scheduler == "kueue":
        labels["kueue.x-k8s.io/queue-name"] = "lab"
    if scheduler == "volcano":
        annotations["scheduling.volcano.sh/queue-name"] = "lab"
    if kind == "fraction":
        annotations["gpu-memory"] = "20000"
    return {
        "resources": resources,
        "node_selector": node_selector,
        "scheduler_name": scheduler_name,
        "priority_class": "build" if scheduler == "kai" else "jupyterhub-gpu-in-quota",
        "runtime_class": "nvidia" if kind == "gpu" else None,
        "labels": labels,
        "annotations": annotations,
        "resource_claims": (
            [{"name": "gpu", "resourceClaimTemplateName": "jupyterhub-gpu-dra-x1"}]
            if kind == "dra"
            else None
        ),
    }


def assert_pod_matches(pod: dict[str, Any], kind: str, scheduler: str) -> None:
    """``pod`` in API (camelCase) form."""
    want = expected(kind, scheduler)
    spec = pod["spec"]
    container = spec["containers"][0]
    requests = container["resources"].get("requests", {})
    limits = container["resources"].get("limits", {})
    gpu_requests = {k: v for k, v in requests.items() if k not in ("cpu", "memory")}
    gpu_limits = {k: v for k, v in limits.items() if k not in ("cpu", "memory")}
    assert gpu_requests == want["resources"]
    assert gpu_limits == want["resources"]
    assert (spec.get("nodeSelector") or {}) == want["node_selector"]
    if want["resources"] or kind in ("fraction", "dra"):
        assert GPU_TOLERATION in (spec.get("tolerations") or [])
    assert spec.get("schedulerName") in (
        (want["scheduler_name"],) if want["scheduler_name"] else (None, "default-scheduler")
    )
    assert spec.get("priorityClassName") == want["priority_class"]
    assert spec.get("runtimeClassName") == want["runtime_class"]
    labels = pod["metadata"]["labels"]
    for key, value in want["labels"].items():
        assert labels.get(key) == value, key
    # no other scheduler's queue label leaks in
    for key in ("kai.scheduler/queue", "kueue.x-k8s.io/queue-name"):
        if key not in want["labels"]:
            assert key not in labels
    annotations = pod["metadata"].get("annotations") or {}
    for key, value in want["annotations"].items():
        assert annotations.get(key) == value, key
    assert spec.get("resourceClaims") == want["resource_claims"]
    if want["resource_claims"]:
        assert container["resources"]["claims"] == [{"name": "gpu"}]
