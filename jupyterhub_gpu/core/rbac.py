"""The RBAC the bundle needs beyond the z2jh chart's, rendered for one policy.

Pure: ``rbac_objects(policy, hub_namespace)`` is what ``jupyterhub-gpu manifests``
prints for an admin to apply (or commit to GitOps); the hub never writes RBAC.

Least privilege, by construction:

- **Cluster-wide grants only for what is cluster-wide, or read-only where nothing
  narrower exists.** Read: nodes (free capacity per flavor), pods in every namespace
  (a node's free capacity is its allocatable minus the pods bound to it, whoever's
  they are; Kubernetes has no narrower grant for that), DRA's ResourceSlices,
  DeviceClasses and ResourceClaims (free devices, by the same reasoning),
  namespaces and the scheduler's queue kinds (to compare with the policy). Write: only the cluster
  objects the policy names, by ``resourceNames`` (its namespaces, PriorityClasses,
  queues); a name the policy does not list cannot be changed or deleted.
- **Namespaced rights only in the namespaces servers run in** (the policy's group
  namespaces, or the hub's), through RoleBindings this file renders: the spawner's
  pods, claims, secrets and services for the hub, the group's quota, limit range,
  network policies, DRA claim templates and Kueue LocalQueue for the GPU service.
  No Secret outside those namespaces, ever.
- **No RBAC writes at all**: no ``rolebindings`` create, no ``bind`` or ``escalate``,
  so a stolen hub token cannot grant itself anything. A namespace added to the policy
  gets its RoleBindings when the admin applies the rendered manifests again.
- **Two accounts, separable**: the hub's (z2jh's ``hub``) spawns; the GPU service's
  reconciles, sights pods and deletes orphaned servers. They default to the same
  account (the service runs in the hub's pod); naming the service's own account gives
  each only its half.
- **One Lease, by name**: the service's replicas in a Deployment of their own elect a
  leader on one ``coordination.k8s.io`` Lease in the hub's namespace: get and update
  on that Lease alone, and create (which Kubernetes cannot restrict by name) of Leases
  in that one namespace.
"""

from __future__ import annotations

from typing import Any

from .model import Policy
from .objects import OWNER, OWNER_LABEL
from .schedulers import SCHEDULERS, object_kinds

#: bound in each namespace servers run in: what KubeSpawner needs there (the hub)
SPAWNER_ROLE = "jupyterhub-gpu-spawner"
#: bound in each namespace servers run in: what the GPU service keeps there
SERVICE_NAMESPACE_ROLE = "jupyterhub-gpu-service"
#: in the hub's namespace: the GPU service replicas' Lease (``form: deployment``)
LEASE_ROLE = "jupyterhub-gpu-service-lease"
#: the prefix of the per-hub ClusterRoles (their rules name this hub's objects)
CLUSTER_ROLE_PREFIX = "jupyterhub-gpu"

_READ = ["get", "list", "watch"]
_CHANGE = ["update", "patch", "delete"]
_RBAC_API = "rbac.authorization.k8s.io"


def _rule(
    group: str, resources: list[str], verbs: list[str], names: list[str] | None = None
) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [group], "resources": resources, "verbs": verbs}
    if names is not None:
        rule["resourceNames"] = names
    return rule


def _api_group(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def _cluster_names(objects: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """The names of the cluster-scoped objects among ``objects``, by (API group, plural)."""
    plurals = {(k.api_version, k.kind): k.plural for k in object_kinds()}
    plurals[("v1", "Namespace")] = "namespaces"
    plurals[("scheduling.k8s.io/v1", "PriorityClass")] = "priorityclasses"
    names: dict[tuple[str, str], list[str]] = {}
    for obj in objects:
        if obj["metadata"].get("namespace"):
            continue
        key = (_api_group(obj["apiVersion"]), plurals[(obj["apiVersion"], obj["kind"])])
        names.setdefault(key, []).append(obj["metadata"]["name"])
    return {k: sorted(set(v)) for k, v in names.items()}


def cluster_read_rules() -> list[dict[str, Any]]:
    """What the hub's capacity views and the service's watches read, cluster wide."""
    rules = [
        _rule("", ["nodes", "pods", "namespaces"], _READ),
        _rule("scheduling.k8s.io", ["priorityclasses"], _READ),
        # DRA capacity, as nodes and pods for device-plugin capacity: the devices
        # published (resourceslices) and what selects them (deviceclasses) are cluster
        # scoped; a device is free unless a claim in any namespace holds it, whoever's,
        # so claims are read cluster wide like pods (no narrower grant exists)
        _rule("resource.k8s.io", ["deviceclasses", "resourceclaims", "resourceslices"], _READ),
    ]
    # every scheduler's cluster-scoped kinds, whichever the policy names: the reconciler
    # lists them to find its own after a change of scheduler
    for scheduler in SCHEDULERS.values():
        cluster_kinds = [k for k in scheduler.kinds if not k.namespaced]
        if cluster_kinds:
            group = _api_group(cluster_kinds[0].api_version)
            rules.append(_rule(group, sorted({k.plural for k in cluster_kinds}), _READ))
        if scheduler.queue_states:
            group, _, plural = scheduler.queue_states
            rules.append(_rule(group, [plural], _READ))
    return _merge(rules)


def cluster_write_rules(policy: Policy, hub_namespace: str) -> list[dict[str, Any]]:
    """What the reconciler writes cluster wide: only the objects this policy names.

    ``create`` carries the names too: the reconciler creates by server-side apply,
    which names the object, and the API server authorizes that create by name."""
    from .manifests import desired_objects

    rules = []
    for (group, plural), names in sorted(
        _cluster_names(desired_objects(policy, hub_namespace)).items()
    ):
        rules.append(_rule(group, [plural], ["create", *_CHANGE], names))
    return rules


def spawner_rules() -> list[dict[str, Any]]:
    """What KubeSpawner (and the spawn page) needs in a namespace servers run in."""
    rules = [
        _rule(
            "",
            ["pods", "persistentvolumeclaims", "secrets", "services"],
            ["get", "list", "watch", "create", "delete"],
        ),
        _rule("", ["events"], _READ),
        _rule("", ["pods/log"], ["get"]),
    ]
    return rules + _queue_entry_rules()


def service_namespace_rules() -> list[dict[str, Any]]:
    """What the GPU service keeps and reads in a namespace servers run in."""
    namespaced_kinds = [
        _rule(_api_group(k.api_version), [k.plural], ["create", "get", "list", "watch", *_CHANGE])
        for s in SCHEDULERS.values()
        for k in s.kinds
        if k.namespaced
    ]
    rules = [
        # sightings and orphaned servers (deleted with the pod's uid as precondition)
        _rule("", ["pods"], ["get", "list", "watch", "delete"]),
        _rule("", ["events"], _READ),
        # whether the claims the groups' datasets name exist
        _rule("", ["persistentvolumeclaims"], _READ),
        _rule(
            "",
            ["resourcequotas", "limitranges"],
            ["create", "get", "list", "watch", *_CHANGE],
        ),
        _rule(
            "networking.k8s.io",
            ["networkpolicies"],
            ["create", "get", "list", "watch", *_CHANGE],
        ),
        _rule(
            "resource.k8s.io",
            ["resourceclaimtemplates"],
            ["create", "get", "list", "watch", *_CHANGE],
        ),
        *namespaced_kinds,
    ]
    return _merge(rules + _queue_entry_rules())


def lease_rules(lease: str) -> list[dict[str, Any]]:
    """What the service's replicas need for their leader election: the one Lease."""
    return [
        # create cannot be restricted by name (the object does not exist yet)
        _rule("coordination.k8s.io", ["leases"], ["create"]),
        _rule("coordination.k8s.io", ["leases"], ["get", "update"], [lease]),
    ]


def _queue_entry_rules() -> list[dict[str, Any]]:
    """Where a server waits in its Kueue or Volcano queue (Workloads, PodGroups): read in
    the namespace it waits in, for the spawn page and the dashboard."""
    entries = sorted(s.queue_objects for s in SCHEDULERS.values() if s.queue_objects)
    return [_rule(group, [plural], _READ) for group, _, plural in entries]


def _merge(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rules of the same API group, verbs and names as one (a shorter role to review)."""
    merged: dict[tuple, dict[str, Any]] = {}
    for rule in rules:
        key = (
            tuple(rule["apiGroups"]),
            tuple(rule["verbs"]),
            tuple(rule.get("resourceNames", ())),
        )
        if key in merged:
            resources = merged[key]["resources"]
            resources += [r for r in rule["resources"] if r not in resources]
        else:
            merged[key] = {**rule, "resources": list(rule["resources"])}
    return list(merged.values())


def server_namespaces(policy: Policy, hub_namespace: str) -> list[str]:
    """Every namespace servers of this policy run in, the hub's first (its servers from
    before the policy, and every server without ``namespace_per_group``)."""
    from .manifests import server_namespaces as namespaces

    return list(dict.fromkeys([hub_namespace, *namespaces(policy, hub_namespace)]))


def rbac_objects(
    policy: Policy,
    hub_namespace: str,
    service_account: str = "hub",
    gpu_service_account: str | None = None,
    lease: str | None = None,
) -> list[dict[str, Any]]:
    """The ClusterRoles, Roles' bindings and their subjects, for one policy and hub.

    ``service_account`` is the hub's (z2jh: ``hub``); ``gpu_service_account`` the GPU
    service's when it runs under an account of its own (default: the hub's); ``lease``
    the name of its replicas' Lease when they elect a leader (none in the hub's pod)."""
    labels = {OWNER_LABEL: OWNER}
    hub = {"kind": "ServiceAccount", "name": service_account, "namespace": hub_namespace}
    gpu = {
        "kind": "ServiceAccount",
        "name": gpu_service_account or service_account,
        "namespace": hub_namespace,
    }
    both = [hub] if gpu == hub else [hub, gpu]
    read_role = f"{CLUSTER_ROLE_PREFIX}-read-{hub_namespace}"
    write_role = f"{CLUSTER_ROLE_PREFIX}-reconcile-{hub_namespace}"

    def cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": f"{_RBAC_API}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": rules,
        }

    def binding(
        kind: str,
        name: str,
        role: str,
        subjects: list,
        namespace: str | None,
        role_kind: str = "ClusterRole",
    ):
        meta: dict[str, Any] = {"name": name, "labels": labels}
        if namespace:
            meta["namespace"] = namespace
        return {
            "apiVersion": f"{_RBAC_API}/v1",
            "kind": kind,
            "metadata": meta,
            "roleRef": {"apiGroup": _RBAC_API, "kind": role_kind, "name": role},
            "subjects": subjects,
        }

    objects = [
        cluster_role(read_role, cluster_read_rules()),
        binding("ClusterRoleBinding", read_role, read_role, both, None),
        cluster_role(write_role, cluster_write_rules(policy, hub_namespace)),
        binding("ClusterRoleBinding", write_role, write_role, [gpu], None),
        # the same two roles for every hub (their rules name nothing of one hub's), bound
        # only where this hub's servers run
        cluster_role(SPAWNER_ROLE, spawner_rules()),
        cluster_role(SERVICE_NAMESPACE_ROLE, service_namespace_rules()),
    ]
    for namespace in server_namespaces(policy, hub_namespace):
        objects.append(binding("RoleBinding", SPAWNER_ROLE, SPAWNER_ROLE, [hub], namespace))
        objects.append(
            binding("RoleBinding", SERVICE_NAMESPACE_ROLE, SERVICE_NAMESPACE_ROLE, [gpu], namespace)
        )
    if lease is not None:
        objects.append(
            {
                "apiVersion": f"{_RBAC_API}/v1",
                "kind": "Role",
                "metadata": {"name": LEASE_ROLE, "namespace": hub_namespace, "labels": labels},
                "rules": lease_rules(lease),
            }
        )
        objects.append(binding("RoleBinding", LEASE_ROLE, LEASE_ROLE, [gpu], hub_namespace, "Role"))
    return objects
