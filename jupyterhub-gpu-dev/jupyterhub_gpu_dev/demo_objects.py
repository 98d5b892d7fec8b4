"""What the demo adds to its cluster beside what the policy implies: the stand-ins for
a scheduler it does not run, the datasets' loopback NFS exports and stand-in claims,
and the policy's objects reconciled once before the hub starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyterhub_gpu.core.manifests import desired_objects
from jupyterhub_gpu.core.model import Dataset, Policy
from jupyterhub_gpu.core.objects import all_groups
from jupyterhub_gpu.core.shaping import namespace_for
from jupyterhub_gpu.kube.reconciler import Reconciler

from .demo_settings import CLAIMS_FOLDER, HUB_NAMESPACE, STAND_IN_LABEL, DemoError
from .localcluster import crds
from .localcluster.cluster import LocalCluster
from .localcluster.podrunner import is_loopback_server

#: the PriorityClasses KAI's installation brings (its values), which KAI policies name
KAI_PRIORITY_CLASSES = {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}


def stand_in_objects(policy: Policy) -> list[dict[str, Any]]:
    """Cluster-wide objects the policy's pods name that the reconciler does not create
    and a real cluster already has: the PriorityClasses a scheduler's installation
    brings (KAI's ``build``...) or a group names (``priority_class``), with the
    scheduler's value where known, and the RuntimeClasses flavors name (the GPU
    Operator's ``nvidia``)."""
    ours = {
        obj["metadata"]["name"]
        for obj in desired_objects(policy, HUB_NAMESPACE)
        if obj["kind"] == "PriorityClass"
    }
    named = {policy.scheduler.in_quota_priority_class, policy.scheduler.over_quota_priority_class}
    named |= {g.priority_class for g in policy.all_groups if g.priority_class}
    metadata = {"labels": {"jupyterhub-gpu.local/stand-in": "true"}}
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, **metadata},
            "value": KAI_PRIORITY_CLASSES.get(name, 0),
            "description": "made by jupyterhub-gpu demo: on a real cluster it is the "
            "scheduler's or the admin's",
        }
        for name in sorted(named - ours)
    ]
    runtime_classes = {f.runtime_class_name for f in policy.flavors.values()}
    objects += [
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name, **metadata},
            "handler": name,
        }
        for name in sorted(n for n in runtime_classes if n)
    ]
    return objects


# ---- datasets: loopback NFS exports and stand-in claims ------------------------------


def loopback_exports(policy: Policy) -> list[Dataset]:
    """The NFS datasets of a server on this machine, which the demo serves itself."""
    return [
        d
        for d in policy.datasets.values()
        if d.kind == "nfs" and is_loopback_server(d.source["nfs"]["server"])
    ]


def stand_in_claims(policy: Policy) -> list[tuple[str, str]]:
    """(namespace, claim) for each claim a group's servers mount, in the namespace
    they run in: the hub's, or the group's own with ``namespace_per_group``."""
    found = {
        (namespace_for(policy, group.name) or HUB_NAMESPACE, dataset.claim): None
        for group in all_groups(policy)
        for dataset in policy.datasets_of(group.name)
        if dataset.claim
    }
    return sorted(found)


def dataset_notes(policy: Policy) -> list[str]:
    """What the demo does with the policy's datasets, one line each."""
    notes = []
    exports = loopback_exports(policy)
    if exports:
        notes.append(
            "datasets: the demo serves the exports of loopback NFS servers ("
            + ", ".join(f"{d.name}: {_export(d)}" for d in exports)
            + ") from folders it makes in its state folder, with a README and a sample file"
        )
    claims = stand_in_claims(policy)
    if claims:
        notes.append(
            "datasets: empty stand-in PersistentVolumeClaims "
            + ", ".join(f"{claim} (namespace {namespace})" for namespace, claim in claims)
            + ", each bound to a PersistentVolume of an empty folder in the demo's state "
            "folder (on a real cluster they are the storage team's)"
        )
    elsewhere = [
        d
        for d in policy.datasets.values()
        if d.kind == "csi" or (d.kind == "nfs" and d not in exports)
    ]
    if elsewhere:
        notes.append(
            "datasets: not reached, their mounts simulated (servers do not see them): "
            + ", ".join(f"{d.name} ({_source_words(d)})" for d in elsewhere)
        )
    return notes


def _export(dataset: Dataset) -> str:
    nfs = dataset.source["nfs"]
    return f"{nfs['server']}:{nfs['path']}"


def _source_words(dataset: Dataset) -> str:
    if dataset.kind == "nfs":
        return f"NFS {_export(dataset)}"
    if dataset.kind == "csi":
        return f"CSI {dataset.source['csi']['driver']}"
    return f"claim {dataset.claim}"


#: what the demo puts in each loopback NFS export it serves
SAMPLE_CSV = "image,label\nimg-0001.png,cat\nimg-0002.png,dog\nimg-0003.png,cat\n"


def serve_loopback_exports(
    policy_values: dict[str, Any], policy: Policy, root: Path
) -> dict[str, Any]:
    """``policy_values`` (hub.config.GPUPolicy) with each loopback NFS export's path
    the folder under ``root`` that serves it, made with a README and a sample file.
    A values file cannot name a folder of this machine's per-run state folder."""
    exports = loopback_exports(policy)
    if not exports:
        return policy_values
    datasets = dict(policy_values["datasets"])
    for dataset in exports:
        nfs = dataset.source["nfs"]
        folder = root / nfs["server"] / nfs["path"].lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        read_only = ", read-only" if dataset.read_only else ""
        (folder / "README.md").write_text(
            f"# {dataset.display_name}\n\n"
            f"The NFS export {_export(dataset)}, stood in for by `jupyterhub-gpu demo`\n"
            f"with this folder of its state folder:\n{folder}\n\n"
            f"Servers of the groups that mount the dataset {dataset.name} have it at "
            f"{dataset.mount_path}{read_only}:\nin the demo, {dataset.mount_path.lstrip('/')} "
            "in the home (a link). It is removed when the demo stops.\n"
        )
        (folder / "sample.csv").write_text(SAMPLE_CSV)
        spec = dict(datasets[dataset.name])
        spec["nfs"] = {**spec["nfs"], "path": str(folder)}
        datasets[dataset.name] = spec
    return {**policy_values, "datasets": datasets}


def claim_objects(namespace: str, claim: str, folder: Path) -> tuple[dict, dict]:
    """A PersistentVolume of ``folder`` (hostPath) bound to an empty claim ``claim``."""
    name = f"demo-{namespace}-{claim}"[:253]
    metadata = {"labels": dict(STAND_IN_LABEL)}
    size = {"storage": "1Gi"}
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, **metadata},
        "spec": {
            "capacity": size,
            "accessModes": ["ReadWriteMany"],
            # no class: bound to this claim alone, never provisioned
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    claim_object = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace, **metadata},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": size},
        },
    }
    return volume, claim_object


async def create_stand_in_claims(api, policy: Policy, root: Path) -> list[str]:
    """The claims the policy's groups mount, each bound to a volume of an empty folder
    under ``root``; what it created. A claim already there is left as it is."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    created = []
    for namespace, claim in stand_in_claims(policy):
        folder = root / namespace / claim
        folder.mkdir(parents=True, exist_ok=True)
        volume, claim_object = claim_objects(namespace, claim, folder)
        try:
            await core.read_namespaced_persistent_volume_claim(claim, namespace)
            continue
        except ApiException as e:
            if e.status != 404:
                raise
        try:
            await core.create_persistent_volume(volume)
        except ApiException as e:
            if e.status != 409:  # left by an earlier claim of that name: bind it again
                raise
        await core.create_namespaced_persistent_volume_claim(namespace, claim_object)
        created.append(f"PersistentVolumeClaim/{namespace}/{claim}")
    return created


async def reconcile_once(
    cluster: LocalCluster, policy: Policy, crds_of: str | None = None
) -> list[str]:
    """Create the objects the policy implies (priority classes, namespaces, quotas,
    queues: what its pods need) with the service's reconciler, once; what it created.
    The CRDs of ``crds_of`` (a scheduler) come first, so its queues are real objects,
    and what a real cluster's installations would bring stands in for them
    (``stand_in_objects``)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    created = []
    async with cluster.api() as api:
        if crds_of:
            await crds.install(api, crds_of)
        create = {
            "PriorityClass": client.SchedulingV1Api(api).create_priority_class,
            "RuntimeClass": client.NodeV1Api(api).create_runtime_class,
        }
        for obj in stand_in_objects(policy):
            try:
                await create[obj["kind"]](obj)
            except ApiException as e:
                if e.status != 409:  # already there
                    raise
            created.append(f"{obj['kind']}/{obj['metadata']['name']}")
        report = await Reconciler(api, hub_namespace=HUB_NAMESPACE).reconcile(policy)
        if not report.ok:
            raise DemoError(f"the cluster refused objects the policy needs: {report.summary()}")
        # in the namespaces the reconciler made
        claims = await create_stand_in_claims(api, policy, cluster.state.path / CLAIMS_FOLDER)
    return created + report.created + claims
