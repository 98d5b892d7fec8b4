"""``jupyterhub-gpu demo [VALUES...]``: the local cluster and a real hub with a GPU policy.

With no values files it runs the built-in example (``demo_values.yaml``); with
them, the admin's own values, merged in order like ``helm -f`` and checked like
``jupyterhub-gpu check`` before anything starts. It builds (or reuses) the local
cluster with simulated nodes that offer every flavor of the policy (or the
``--node-pools`` file's) and runs the scheduler the policy names when the local
cluster can run it (Kueue or Volcano; ``--scheduler`` runs the built-in example
with it; KAI is stood in for by kube-scheduler), creates the cluster objects the policy
implies, starts a real JupyterHub with configurable-http-proxy and ``GPUKubeSpawner``
configured from ``hub.config`` the way z2jh does, and the GPU service at
/services/gpu/, with two demo users in each group who log in with a shared
password. GPU time is recorded in a usage database in the demo's state folder;
for the built-in example (and values with an ``idle`` rule) a simulated NVIDIA
DCGM exporter reports the servers' GPU use to a local Prometheus, which the
service's idle rule asks (``GPUService.prometheus_url``). Datasets: the exports of
a loopback NFS server are folders the demo makes in its state folder (with a README
and a sample file), and each claim a group's servers mount is an empty stand-in,
bound to a PersistentVolume of an empty folder there; the pod runner links both
into the servers' homes at their mount paths. VS Code (code-server, installed by
``jupyterhub-gpu demo`` before it starts) opens where the policy offers it. Prints the URL, the
logins, an admin API token and what to try; Ctrl-C (or SIGTERM, or closing the
terminal) stops the hub, its servers, Prometheus, the exporter and the cluster,
and removes their folders; what a demo killed outright left, the next demo removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jupyterhub_gpu.config.values import checked_values
from jupyterhub_gpu.core import words
from jupyterhub_gpu.core.budgets import BudgetState, format_cap, format_period
from jupyterhub_gpu.core.manifests import desired_objects
from jupyterhub_gpu.core.model import Budget, Dataset, Flavor, Group, Interface, Policy, Profile
from jupyterhub_gpu.core.objects import all_groups
from jupyterhub_gpu.core.profiles import budget_line
from jupyterhub_gpu.core.quantities import format_duration
from jupyterhub_gpu.core.selection import base_request, offers
from jupyterhub_gpu.core.shaping import namespace_for
from jupyterhub_gpu.kube.reconciler import Reconciler

from . import codeserver
from .dcgm_exporter import SimulatedDCGMExporter
from .ldap import ADMIN_DN, GROUPS, PEOPLE, LocalDirectory, SlapdMissing
from .localcluster import build, crds
from .localcluster.cluster import (
    DEFAULT_NODE_POOLS,
    ClusterState,
    LocalCluster,
    _alive,
    _stop_group,
    state_root,
)
from .localcluster.hub import LocalHub
from .localcluster.nodepools import NodePoolError, read_node_pools, render_nodes
from .localcluster.podrunner import is_loopback_server
from .localcluster.policy_pools import node_pools_for, without_nodes
from .prometheus import LocalPrometheus, PrometheusNotFound, prometheus_binary

#: The demo's policy: a z2jh values file (``jupyterhub-gpu check`` works on it).
DEMO_VALUES = Path(__file__).with_name("demo_values.yaml")

DEMO_ADMIN = "admin"
#: where the hub runs and spawns (a policy's namespace per group is kept)
HUB_NAMESPACE = "default"
#: the schedulers the local cluster does not run: kube-scheduler answers to their
#: name (``schedulerName``), and the pods keep every label and annotation. One the
#: local cluster can run (``build.SCHEDULER_COMPONENTS``) runs for real instead.
STAND_IN_SCHEDULERS = {"kai": "kai-scheduler"}
#: the objects to list to see a scheduler the local cluster runs at work (the banner's hint)
SCHEDULER_OBJECTS = {
    "kueue": "clusterqueues,localqueues,workloads",
    "volcano": "queues.scheduling.volcano.sh,podgroups",
}
#: what each scheduler the local cluster runs does with a server's pod
SCHEDULER_ROLES = {
    "kueue": "the policy's Kueue queues admit each server's pod, then kube-scheduler places it",
    "volcano": "each server's pod waits in its group's Volcano queue until there is room, "
    "then Volcano places it",
}
#: the process whose log the banner names, where it is not the scheduler's own name
SCHEDULER_LOGS = {"volcano": "vc-scheduler"}
#: the usage database (GPU time), in the demo cluster's state folder
USAGE_DATABASE = "jupyterhub-gpu-usage.sqlite"
#: seconds between Prometheus's scrapes of the simulated DCGM exporter (each scrape
#: lists the cluster's pods and nodes: more often would only cost CPU)
SCRAPE_INTERVAL = 5.0
#: in the demo cluster's state folder: the folders serving loopback NFS exports
#: (``nfs/<server><path>``) and those behind the stand-in claims (``claims/<ns>/<claim>``)
NFS_FOLDER = "nfs"
CLAIMS_FOLDER = "claims"
#: the label of the PersistentVolumes and claims the demo stands in
STAND_IN_LABEL = {"jupyterhub-gpu.local/stand-in": "true"}


class DemoError(RuntimeError):
    """The demo cannot start; the message says what to do."""


def demo_users(policy: Policy) -> dict[str, list[str]]:
    """``<group>-1`` and ``<group>-2`` in each group, ``admin`` (a hub admin, and in
    the policy's admin groups) and ``nogroup`` (in none): user -> JupyterHub groups."""
    users: dict[str, list[str]] = {}
    for name in policy.groups:
        # JupyterHub names users in lower case; group names stay as the policy has them
        for n in (1, 2):
            users[f"{name.lower()}-{n}"] = [name]
    users[DEMO_ADMIN] = [g.name for g in policy.groups.values() if g.admin]
    users["nogroup"] = []
    return users


#: hub.config.JupyterHub settings the demo keeps for itself: where the hub and its
#: proxy listen, its database and files, its services and roles, who may log in
_HUB_OWNED = frozenset(
    [
        "ip",
        "port",
        "bind_url",
        "base_url",
        "hub_ip",
        "hub_port",
        "hub_bind_url",
        "hub_connect_ip",
        "hub_connect_url",
        "db_url",
        "cookie_secret_file",
        "pid_file",
        "cleanup_servers",
        "services",
        "load_roles",
        "load_groups",
        "authenticator_class",
        "proxy_class",
        "internal_ssl",
        "ssl_cert",
        "ssl_key",
    ]
)

#: singleuser.* settings the demo honours, as the chart maps them to KubeSpawner
_SINGLEUSER = {
    "defaultUrl": "default_url",
    "extraEnv": "environment",
    "extraLabels": "extra_labels",
    "nodeSelector": "node_selector",
    "extraTolerations": "tolerations",
    "startTimeout": "start_timeout",
    "image": "image",
}


def _singleuser_setting(key: str, value: Any) -> Any:
    if key == "image" and isinstance(value, dict):
        return f"{value.get('name')}:{value.get('tag', 'latest')}"
    if key == "extraEnv" and isinstance(value, dict):
        # z2jh takes a string, or an EnvVar's {value: ...}; valueFrom needs the cluster's
        return {
            k: v if isinstance(v, str) else v.get("value")
            for k, v in value.items()
            if isinstance(v, str) or (isinstance(v, dict) and "value" in v)
        }
    return value


@dataclass
class DemoPlan:
    """What a demo runs, decided and checked before anything starts."""

    #: the values files (the built-in example when none was given)
    values_files: list[Path]
    policy: Policy
    #: hub.config.GPUPolicy as the values have it
    policy_values: dict[str, Any]
    #: the rest of hub.config as the hub runs it (GPUService apart)
    hub_config: dict[str, Any]
    service_settings: dict[str, Any]
    users: dict[str, list[str]]
    node_pools: dict[str, Any]
    #: where the nodes came from, in words
    node_pools_source: str
    #: scheduler names kube-scheduler answers to for schedulers the cluster lacks
    stand_ins: tuple[str, ...] = ()
    #: the scheduler whose CRDs the cluster gets (its queues are created for real)
    crds: str | None = None
    #: the schedulers the local cluster runs for real besides kube-scheduler (the
    #: policy's, when the cluster can run it): built on first use, then started
    schedulers: tuple[str, ...] = ()
    #: ``--scheduler``: the scheduler the built-in example runs with instead of its own
    scheduler_option: str | None = None
    #: one line each: what the demo does differently from a real deployment
    notes: list[str] = field(default_factory=list)
    #: start a simulated DCGM exporter and a Prometheus scraping it, for the idle rule
    gpu_metrics: bool = False
    #: ``--auth``: who logs people in and where their groups come from (AUTH_MODES)
    auth: str = "demo"


def runnable_schedulers() -> list[str]:
    """The schedulers the local cluster can run for real besides kube-scheduler."""
    return list(build.SCHEDULER_COMPONENTS)


def plan_demo(
    values: list[str] | None = None,
    node_pools_file: str | None = None,
    scheduler: str | None = None,
    auth: str = "demo",
) -> DemoPlan:
    """The demo of these values files (none: the built-in example); ``PolicyError``
    with every mistake, or ``DemoError``, before anything starts.

    ``scheduler`` (``--scheduler``): one the local cluster runs for real. The
    built-in example runs with it as ``scheduler.name``; values files must name it
    already (a demo runs the admin's policy as it is, never another one). Values
    whose scheduler the local cluster can run get it without ``--scheduler``.
    """
    files = [Path(v) for v in values] if values else [DEMO_VALUES]
    if scheduler is not None and scheduler not in build.SCHEDULER_COMPONENTS:
        raise DemoError(
            f"--scheduler {scheduler}: the local cluster cannot run it; "
            f"choose from {', '.join(runnable_schedulers())}"
        )
    overrides = None
    if scheduler is not None and not values:
        overrides = {"hub": {"config": {"GPUPolicy": {"scheduler": {"name": scheduler}}}}}
    merged, policy = checked_values(files, overrides)
    if scheduler is not None and policy.scheduler.name != scheduler:
        raise DemoError(
            f"--scheduler {scheduler}: the policy in {' '.join(map(str, files))} names "
            f"scheduler {policy.scheduler.name} (hub.config.GPUPolicy.scheduler.name); "
            f"drop --scheduler to demo the values as they are, or set scheduler.name: "
            f"{scheduler} in them"
        )
    sections = dict((merged.get("hub") or {}).get("config") or {})
    if not sections.get("GPUPolicy"):
        raise DemoError(
            f"{' '.join(map(str, files))}: no hub.config.GPUPolicy to demo; "
            "start from helm-values/base.yaml and an example under helm-values/"
        )
    policy_values = dict(sections.pop("GPUPolicy"))
    service_settings = dict(sections.pop("GPUService", None) or {})
    notes: list[str] = []
    if auth not in AUTH_MODES:
        raise DemoError(f"--auth {auth}: choose from {', '.join(AUTH_MODES)}")
    if auth == "values":
        hub_config, authenticator = _values_authenticator(sections, values)
        notes.append(
            f"logins: the values' authenticator ({authenticator}); the users and their "
            "groups are whoever it lets in"
        )
    else:
        hub_config, replaced = _demo_hub_config(sections)
        if replaced:
            notes.append(
                "logins: the demo's password instead of " + ", ".join(replaced) + " (they need "
                "an identity provider); the rest of hub.config is the values'"
            )
        if auth == "ldap":
            notes.append(
                "logins: a local OpenLDAP holds the demo users in their groups; the hub reads "
                "their groups from it at every login (ldap-groups)"
            )
    spawner, honoured, ignored = _singleuser(merged.get("singleuser") or {})
    if spawner:
        hub_config.setdefault("KubeSpawner", {}).update(spawner)
    if honoured:
        notes.append("singleuser: honoured " + ", ".join(honoured))
    if ignored:
        notes.append(
            "singleuser: not honoured " + ", ".join(ignored) + " (policy profiles set the "
            "resources; the local pod runner runs this machine's jupyterhub-singleuser)"
        )
    if node_pools_file:
        try:
            node_pools = read_node_pools(node_pools_file)
        except NodePoolError as e:
            raise DemoError(f"--node-pools {e}") from None
        source = node_pools_file
    elif not values:
        # the built-in example is fitted to the local cluster's own node pools
        node_pools = read_node_pools(DEFAULT_NODE_POOLS)
        source = f"the local cluster's own ({DEFAULT_NODE_POOLS.name})"
    else:
        node_pools = node_pools_for(policy)
        source = "derived from the policy's flavors"
        notes += [f"no simulated nodes for {line}" for line in without_nodes(policy)]
        selector = spawner.get("node_selector") or {}
        for pool in node_pools["node_pools"].values() if selector else ():
            # singleuser.nodeSelector applies to every server: every node carries it
            pool["labels"] = {**pool.get("labels", {}), **selector}
    gpu_metrics = not values or any(g.idle for g in policy.all_groups)
    if gpu_metrics:
        try:
            prometheus_binary()
        except PrometheusNotFound as e:
            gpu_metrics = False
            notes.append(
                f"idle rule: GPU use is not measured: {e}; idle servers are found by "
                "notebook activity alone"
            )
    if gpu_metrics and service_settings.get("prometheus_url"):
        notes.append(
            "idle rule: the demo's Prometheus (scraping a simulated DCGM exporter) instead of "
            f"hub.config.GPUService.prometheus_url ({service_settings['prometheus_url']})"
        )
    if policy_values.get("accounting_url"):
        notes.append(
            "GPU time: the demo's usage database in its state folder instead of "
            f"hub.config.GPUPolicy.accounting_url ({policy_values['accounting_url']})"
        )
    notes += dataset_notes(policy)
    policy_scheduler = policy.scheduler.name
    runs = policy_scheduler in build.SCHEDULER_COMPONENTS
    names = {f.scheduler_name for f in policy.flavors.values() if f.scheduler_name}
    if policy_scheduler in STAND_IN_SCHEDULERS and not runs:
        names.add(STAND_IN_SCHEDULERS[policy_scheduler])
    stand_ins = tuple(sorted(names))
    if runs:
        version = build.SCHEDULER_COMPONENTS[policy_scheduler].version
        notes.append(
            f"scheduler: {policy_scheduler} {version} runs for real in the local cluster "
            f"(built on first use): {SCHEDULER_ROLES[policy_scheduler]}"
        )
    elif policy_scheduler != "default":
        notes.append(
            f"scheduler: the local cluster runs no {policy_scheduler}; kube-scheduler places "
            f"the pods, which keep every {policy_scheduler} label and annotation, and the "
            f"{policy_scheduler} queues are created from its CRDs"
        )
    return DemoPlan(
        values_files=files,
        policy=policy,
        policy_values=policy_values,
        hub_config=hub_config,
        service_settings=service_settings,
        users=demo_users(policy),
        node_pools=node_pools,
        node_pools_source=source,
        stand_ins=stand_ins,
        # a scheduler the cluster runs brings its own CRDs (with its conversion webhooks)
        crds=policy_scheduler if policy_scheduler != "default" and not runs else None,
        schedulers=(policy_scheduler,) if runs else (),
        scheduler_option=scheduler,
        notes=notes,
        gpu_metrics=gpu_metrics,
        auth=auth,
    )


def _demo_hub_config(sections: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """hub.config without what the demo owns (logins, addresses, files); what it
    replaced, as key paths."""
    kept: dict[str, Any] = {}
    replaced: list[str] = []
    for section, settings in sections.items():
        if "Authenticator" in section or section == "ConfigurableHTTPProxy":
            replaced.append(f"hub.config.{section}")
            continue
        if section == "JupyterHub" and isinstance(settings, dict):
            if "authenticator_class" in settings:
                replaced.append(
                    f"hub.config.JupyterHub.authenticator_class ({settings['authenticator_class']})"
                )
            settings = {k: v for k, v in settings.items() if k not in _HUB_OWNED}
        kept[section] = settings
    return kept, replaced


#: ``--auth``: the demo's own logins (a shared password, groups set by the demo), the
#: values' own authenticator, or the demo users in a local OpenLDAP directory
AUTH_MODES = ("demo", "values", "ldap")


def _values_authenticator(
    sections: dict[str, Any], values: list[str] | None
) -> tuple[dict[str, Any], str]:
    """hub.config with the values' authenticator kept (``--auth values``); its class."""
    authenticator = ((sections.get("JupyterHub") or {}).get("authenticator_class")) or None
    if not values or not authenticator:
        raise DemoError(
            "--auth values keeps the authenticator the values name, and "
            + ("no values files were given" if not values else "they name none")
            + " (hub.config.JupyterHub.authenticator_class); point it at a test directory "
            "in a values file of your own, or use --auth ldap"
        )
    kept: dict[str, Any] = {}
    for section, settings in sections.items():
        if section == "ConfigurableHTTPProxy":
            continue
        if section == "JupyterHub" and isinstance(settings, dict):
            owned = _HUB_OWNED - {"authenticator_class"}
            settings = {k: v for k, v in settings.items() if k not in owned}
        kept[section] = settings
    if not (kept.get("CryptKeeper") or {}).get("keys"):
        # z2jh generates the key that encrypts auth state (an OIDC refresh needs it)
        kept["CryptKeeper"] = {"keys": [os.urandom(32).hex()]}
    return kept, str(authenticator)


def directory_group_name(group: Group) -> str:
    """The directory group that makes a member of ``group`` in the demo's directory:
    the first plain name its ``directory_groups`` list (a DN, path or ID would need
    a directory of the site's shape), else its own name."""
    plain = [g for g in group.directory_groups if not any(c in g for c in "=/,")]
    return plain[0] if plain else group.name


def fill_directory(directory: LocalDirectory, plan: DemoPlan, password: str) -> dict[str, Any]:
    """The demo users, with ``password``, in the directory groups of their policy
    groups; the LDAPGroupsAuthenticator settings that read them."""
    for user in plan.users:
        directory.add_person(user, password)
    members: dict[str, list[str]] = {}
    for user, groups in plan.users.items():
        for name in groups:
            members.setdefault(directory_group_name(plan.policy.groups[name]), []).append(user)
    for group, users in members.items():
        directory.add_group(group, users)
    return {
        "server_address": "127.0.0.1",
        "server_port": directory.port,
        "tls_strategy": "insecure",  # a loopback directory without TLS
        "bind_dn_template": [f"uid={{username}},{PEOPLE}"],
        "group_search_base": GROUPS,
        # groups are read again before spawns (group_refresh_age), bound as this account
        "lookup_dn_search_user": ADMIN_DN,
        "lookup_dn_search_password": directory.admin_password,
        "allow_all": True,
    }


def _singleuser(singleuser: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """KubeSpawner settings from singleuser.* as the chart maps them; the keys
    honoured and the keys set but not honoured, as key paths."""
    settings: dict[str, Any] = {}
    honoured: list[str] = []
    ignored: list[str] = []
    for key, value in singleuser.items():
        if key == "profileList" and not value:
            continue  # the chart's default, and what base.yaml sets
        if key in _SINGLEUSER and value not in (None, {}, []):
            settings[_SINGLEUSER[key]] = _singleuser_setting(key, value)
            honoured.append(f"singleuser.{key}")
        else:
            ignored.append(f"singleuser.{key}")
    return settings, honoured, ignored


def print_node_pools(plan: DemoPlan) -> str:
    """The node pools a demo of this plan starts, as YAML (``--print-node-pools``)."""
    header = f"# simulated node pools, {plan.node_pools_source}\n"
    return header + yaml.safe_dump(plan.node_pools, sort_keys=False)


# ---- cluster objects ------------------------------------------------------------


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


# ---- running it -------------------------------------------------------------------


def user_table(plan: DemoPlan) -> list[tuple[str, str, str]]:
    """(user, groups, what they are offered) for each demo user."""
    rows = []
    for user, groups in plan.users.items():
        slugs = [o.slug for o in offers(plan.policy, groups)]
        role = " (hub admin)" if user == DEMO_ADMIN else ""
        rows.append((user, ", ".join(groups) or "-", (", ".join(slugs) or "nothing") + role))
    return rows


@dataclass
class GPUMetrics:
    """What measures the simulated GPUs' use: the exporter and the Prometheus scraping it."""

    exporter: SimulatedDCGMExporter
    prometheus: LocalPrometheus


def _minutes(budget: Budget, gpus: float) -> str:
    """How long one server holding ``gpus`` GPU-equivalents takes to use ``budget`` up."""
    minutes = float(budget.gpu_hours) / gpus * 60
    return f"{minutes:.0f} minutes" if minutes >= 2 else f"{minutes * 60:.0f} seconds"


def _first_gpu_server(plan: DemoPlan, group: Group) -> tuple[str, str, float] | None:
    """A demo user of ``group``, the display name of the group's first GPU profile and
    its GPU-equivalents; None if the group offers no GPU profile."""
    for name in group.profiles:
        profile = plan.policy.profiles[name]
        gpus = float(base_request(plan.policy, profile).gpus)
        if gpus:
            return f"{group.name.lower()}-1", profile.display_name, gpus
    return None


def _per(seconds: int) -> str:
    """ "hour", "7 days": what a budget's window reads as after "per"."""
    window = format_period(seconds)
    return window.removeprefix("1 ")


def _when_used_up(budget: Budget) -> str:
    if budget.when_exhausted == "stop":
        return (
            f"a notice on the dashboard, and {format_duration(budget.grace)} later "
            "the server is stopped"
        )
    return "a notice on the dashboard; the server keeps running"


#: one step of the walkthrough: paragraphs, and (in a tuple) a command to run
_Step = list[str | tuple[str]]


def _group_step(plan: DemoPlan, group: Group, metrics: GPUMetrics | None) -> _Step | None:
    """What to try in ``group``: its budgets and its idle rule, with one server."""
    server = _first_gpu_server(plan, group)
    owners = [
        (owner, budget)
        for owner, budget in (
            ("the group's", group.budget),
            (f"{server[0] if server else ''}'s own", group.user_budget),
        )
        if budget is not None
    ]
    if server is None or not (owners or group.idle):
        return None
    user, profile, gpus = server
    text = f"Log in as {user}"
    if owners:
        shown = [
            budget_line(BudgetState(owner, budget, used=0.0))
            for owner, budget in (
                (group.display_name, group.budget),
                (f"{user} in {group.display_name}", group.user_budget),
            )
            if budget is not None
        ]
        text += ": the spawn form shows " + " and ".join(f'"{line}"' for line in shown)
    text += f'. Start "{profile}".'
    step: _Step = []
    if group.idle is not None:
        after = format_duration(group.idle.after)
        notice = format_duration(int(plan.service_settings.get("idle_notice", 600)))
        namespace = namespace_for(plan.policy, group.name) or HUB_NAMESPACE
        if metrics is not None:
            text += (
                " Idle reclaim: the simulated GPUs report 0% use until told otherwise, so "
                f"after {after} below {group.idle.gpu_utilization_below:g}% the dashboard "
                f"shows a notice, and {notice} later the server is stopped. Keep it busy "
                '(and {"percent": null} to idle again):'
            )
            step += [
                text,
                (
                    f"curl -X PUT {metrics.exporter.url}/utilization/{namespace}/"
                    f"""jupyter-{user} -d '{{"percent": 80}}'""",
                ),
            ]
        else:
            text += (
                f" Idle reclaim: after {after} without notebook activity the dashboard "
                f"shows a notice, and {notice} later the server is stopped."
            )
            step.append(text)
        text = "Kept busy, it" if owners else ""
    else:
        text += " It"
    for number, (owner, budget) in enumerate(owners):
        text += (
            f"{' It' if number else ''} uses {owner} {format_cap(float(budget.gpu_hours))} "
            f"GPU-hours per {_per(budget.period)} in about "
            f"{_minutes(budget, gpus)}: then {_when_used_up(budget)}."
        )
        if budget is group.budget:
            cap = format_cap(float(budget.gpu_hours))
            text += (
                f' A GPU server started then is refused with the numbers ("{group.display_name}'
                f" used ... of {cap} GPU-hours in the last {format_period(budget.period)}: "
                'GPU servers can start again at ...").'
            )
    if text:
        step.append(text)
    return step


#: the GPU-hours the built-in example's two members of a GPU group are given as history
#: (ended ``HISTORY_ENDED_AGO`` seconds before the demo starts): fair share has
#: something to weigh from the first minute
FAIR_SHARE_HISTORY = (2.0, 0.25)
#: before the shortest budget window of the built-in example (an hour): the history
#: weighs in fair share, and no budget counts it
HISTORY_ENDED_AGO = 3 * 3600


def _history_group(plan: DemoPlan) -> Group | None:
    """The group whose members get a fair-share history: with fair share on and the
    built-in example only (a site's own values are for rehearsing its own numbers), the
    first group offering GPU profiles."""
    if plan.policy.fair_share is None or plan.values_files != [DEMO_VALUES]:
        return None
    return next((g for g in plan.policy.groups.values() if _first_gpu_server(plan, g)), None)


def seed_fair_share_history(plan: DemoPlan, url: str, now: float) -> list[str]:
    """Earlier GPU time of ``<group>-1`` (more) and ``<group>-2`` (less) in the usage
    database at ``url``, as rows a day of real use would leave; what was written, in
    words (nothing without ``_history_group``)."""
    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.core.budgets import UsageRecord

    group = _history_group(plan)
    if group is None:
        return []
    profile = next(o.profile for o in offers(plan.policy, [group.name]) if o.profile.gpu)
    assert profile.gpu is not None
    ended = now - HISTORY_ENDED_AGO
    records, said = [], []
    for n, hours in enumerate(FAIR_SHARE_HISTORY, 1):
        user = f"{group.name.lower()}-{n}"
        records.append(
            UsageRecord(
                uid=f"demo-history-{user}",
                key=f"demo-history/jupyter-{user}",
                user=user,
                group=group.name,
                profile=profile.name,
                flavor=profile.gpu.flavor,
                gpus=1.0,
                started=ended - hours * 3600,
                last_seen=ended,
                ended=ended,
            )
        )
        said.append(f"{user} {hours:g} GPU-hours")
    store = UsageStore(url)
    try:
        store.open(records, now=now)
    finally:
        store.dispose()
    return [f"fair share: an earlier day of {group.display_name} stood in ({', '.join(said)})"]


def _fair_share_step(plan: DemoPlan) -> _Step | None:
    group = _history_group(plan)
    if group is None or plan.policy.fair_share is None:
        return None
    heavy, light = (f"{group.name.lower()}-{n}" for n in (1, 2))
    half_life = words.duration(plan.policy.fair_share.half_life)
    text = (
        f"Fair share (half-life {half_life}): {heavy} held a GPU {FAIR_SHARE_HISTORY[0]:g} "
        f"hours a few hours ago, {light} {FAIR_SHARE_HISTORY[1]:g}. Each sees their "
        f'standing on the spawn form ("{group.display_name} fair share: you used ... x '
        'your share") and on the dashboard, where admin sees every group and member by '
        "standing. Their over-quota servers get PriorityClasses by standing, so the "
        "heaviest users' bursts are preempted first."
    )
    line = _waiting_line(plan, group)
    if line is None:
        return [text]
    profile, flavor = line
    return [
        text,
        f"The line: {group.display_name} may hold one {flavor.display_name} at a time "
        "and waits for it. "
        f"As {heavy}, start a {profile.display_name} server on it (it runs), then a named "
        "server on it too: it waits. "
        f'As {light}, start one on it: the spawn page says "position 1 of 2: you used '
        f"less GPU time recently than others waiting\". Stop {heavy}'s first server: "
        f"{light}'s starts though it asked second, and {heavy}'s waits on.",
    ]


def _waiting_line(plan: DemoPlan, group: Group) -> tuple[Profile, Flavor] | None:
    """A profile of ``group`` whose flavor the group may hold one of at a time, and that
    flavor, where the group's spawns wait when full: two members asking for it stand in
    one line (None where there is none)."""
    if plan.policy.when_full_of(group.name) != "wait":
        return None
    for name, cap in group.limit.flavors.items():
        if cap != 1:
            continue
        for profile_name in group.profiles:
            profile = plan.policy.profiles[profile_name]
            flavor_option = profile.options.get("flavor")
            choices = dict(flavor_option.choices).values() if flavor_option else ()
            if profile.gpu is not None and name in (profile.gpu.flavor, *choices):
                return profile, plan.policy.flavors[name]
    return None


def walkthrough(plan: DemoPlan, hub: LocalHub, metrics: GPUMetrics | None) -> str:
    """What to try with GPU time (budgets, showback, idle reclaim), for this policy."""
    steps = [
        step
        for group in plan.policy.groups.values()
        if (step := _group_step(plan, group, metrics)) is not None
    ]
    if (lab := _lab_step(plan)) is not None:
        steps.append(lab)
    if (fair := _fair_share_step(plan)) is not None:
        steps.append(fair)
    if (dra := _dra_step(plan)) is not None:
        steps.append(dra)
    if not steps:
        return ""
    steps.append(
        [
            f"The dashboard ({hub.service_url}): each group's GPU use over the last day, "
            "week or month, this month's showback table (GPU-hours by group, user and "
            "flavor) with its CSV download, and the notices."
        ]
    )
    lines = ["  GPU time, what to try (budgets, showback, idle reclaim):"]
    for number, step in enumerate(steps, 1):
        for index, part in enumerate(step):
            if isinstance(part, tuple):  # a command: on one line, to copy
                lines.append(f"         {part[0]}")
                continue
            first = f"    {number}. " if index == 0 else " " * 7
            lines += textwrap.wrap(
                part,
                width=88,
                initial_indent=first,
                subsequent_indent=" " * 7,
                break_on_hyphens=False,
            )
    return "\n".join(lines) + "\n\n"


def _dra_step(plan: DemoPlan) -> _Step | None:
    """A server on DRA devices: the first group offering a profile of a dra flavor."""
    for group in plan.policy.groups.values():
        for name in group.profiles:
            profile = plan.policy.profiles[name]
            flavor = plan.policy.flavors[profile.gpu.flavor] if profile.gpu else None
            if flavor is None or flavor.kind != "dra":
                continue
            return [
                f'DRA: as {group.name.lower()}-1, start "{profile.display_name}". No node '
                f"advertises it: the spawn form counts the free {flavor.device_class} devices "
                "in the DRA node's ResourceSlices, kube-scheduler allocates one to the "
                "server's ResourceClaim, and the dashboard names it beside the server. See "
                "what the DRA driver publishes and what was allocated:",
                ("kubectl get resourceslices -o yaml; kubectl get resourceclaims -A",),
            ]
    return None


def _lab_step(plan: DemoPlan) -> _Step | None:
    """GPU time in JupyterLab (the extension), with a group whose budget stops servers."""
    if importlib.util.find_spec("jupyterhub_gpu_jupyterlab") is None:
        return None
    for group in plan.policy.groups.values():
        budget = group.budget or group.user_budget
        server = _first_gpu_server(plan, group)
        if budget is None or budget.when_exhausted != "stop" or server is None:
            continue
        user, profile, _ = server
        return [
            f'GPU time in JupyterLab: as {user}, start "{profile}" and open a notebook. '
            "The status bar shows the group, the GPU, the GPU-hours left and the next stop "
            "(click it for the details). Leave an edit unsaved: when the budget is used up "
            "a notification gives the stop time, the edit is saved before the stop, and "
            "afterwards the page says why the server stopped."
        ]
    return None


def _vscode_offer(plan: DemoPlan) -> tuple[Group, str, Interface] | None:
    """The first group offering VS Code (an interface served at /vscode/), the
    display name of the first profile it offers it with, and the interface."""
    for group in plan.policy.groups.values():
        for offer in offers(plan.policy, [group.name]):
            for interface in offer.interfaces if offer.group is group else ():
                if interface.url.rstrip("/") == "/vscode":
                    return group, offer.profile.display_name, interface
    return None


def vscode_section(plan: DemoPlan, hub: LocalHub) -> str:
    """The banner's lines on VS Code and the data its explorer shows, where the
    policy offers VS Code."""
    offer = _vscode_offer(plan)
    if offer is None:
        return ""
    group, profile, interface = offer
    name, url = interface.display_name, interface.url
    if codeserver.installed_bin_dir() is None:
        return (
            f"  {name}: code-server is not installed on this machine (the demo said why as "
            f"it started): servers opened with {name} answer 404 at {url}\n\n"
        )
    exports = loopback_exports(plan.policy)
    seen = [
        f"{d.display_name} in {d.mount_path.lstrip('/')}"
        for d in plan.policy.datasets_of(group.name)
        if d in exports or d.claim
    ]
    user = f"{group.name.lower()}-1"
    text = (
        f'{name} in the browser: as {user}, start "{profile}" with Open: {name}. The server '
        f"opens at {hub.url}/user/{user}{url}: code-server {codeserver.version()}, installed "
        "on this machine and served by jupyter-vscode-proxy (on a real cluster, the image's: "
        "images/singleuser/Dockerfile.vscode)"
        + (f"; its explorer shows {', '.join(seen)}." if seen else ".")
    )
    lines = textwrap.wrap(
        text, width=88, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False
    )
    return "\n".join(lines) + "\n\n"


def scheduler_line(plan: DemoPlan, cluster: LocalCluster) -> str:
    """The banner's lines saying which scheduler runs for real."""
    name = plan.policy.scheduler.name
    if name in plan.schedulers:
        version = cluster.state.versions.get(name, "")
        hints = [f"kubectl get {SCHEDULER_OBJECTS[name]} -A"] if name in SCHEDULER_OBJECTS else []
        log = cluster.state.path / "logs" / f"{SCHEDULER_LOGS.get(name, name)}.log"
        if log.is_file():
            hints.append(f"its log: {log}")
        return (
            f"  scheduler: {name} {version}, running for real\n"
            f"             ({SCHEDULER_ROLES[name]})\n"
            + "".join(f"             {hint}\n" for hint in hints)
        )
    if name != "default":
        return (
            f"  scheduler: kube-scheduler, standing in for {name} "
            f"(the local cluster runs no {name})\n"
        )
    return "  scheduler: kube-scheduler\n"


def banner(
    plan: DemoPlan,
    hub: LocalHub,
    cluster: LocalCluster,
    metrics: GPUMetrics | None = None,
) -> str:
    rows = user_table(plan)
    width = max(len(r[0]) for r in rows)
    group_width = max(9, *(len(r[1]) for r in rows))
    table = "\n".join(
        f"    {user:<{width}}  {groups:<{group_width}}  {sees}" for user, groups, sees in rows
    )
    values = " ".join(str(v) for v in plan.values_files)
    policy_line = f"  policy:  {values}\n"
    if plan.scheduler_option:
        policy_line = (
            f"  policy:  {values}\n"
            f"           with scheduler: {{name: {plan.scheduler_option}}} (--scheduler)\n"
        )
    logins = (
        f"  log in as (password for all: {hub.password}):\n"
        f"    {'user':<{width}}  {'groups':<{group_width}}  offered\n{table}\n\n"
    )
    if plan.auth == "values":
        authenticator = plan.hub_config["JupyterHub"]["authenticator_class"]
        logins = (
            f"  logins:  the values' authenticator ({authenticator}, --auth values); "
            "the users and their groups are its own\n\n"
        )
    elif plan.auth == "ldap":
        logins = (
            "  logins:  a local OpenLDAP directory (--auth ldap), groups read at every login\n"
            + logins
        )
    return (
        f"\nJupyterHub with the GPU policy is running at {hub.url}/hub/login\n\n"
        + logins
        + f"  usage dashboard: {hub.service_url}\n"
        + walkthrough(plan, hub, metrics)
        + vscode_section(plan, hub)
        + f"  REST API as an admin (the demo-admin service's token):\n"
        f"    export JUPYTERHUB_API_URL={hub.url}/hub/api\n"
        f"    export JUPYTERHUB_API_TOKEN={hub.api_token}\n"
        # it has the usage scope a billing job's token has: every group's numbers
        f'    curl -H "Authorization: token $JUPYTERHUB_API_TOKEN" '
        f"'{hub.service_url}api/showback?format=csv'\n\n"
        + policy_line
        + f"           (`jupyterhub-gpu profiles {values} --groups GROUP`)\n"
        + scheduler_line(plan, cluster)
        + f"  nodes:   {len(render_nodes(plan.node_pools))} simulated, {plan.node_pools_source}\n"
        f"  kubectl: export KUBECONFIG={cluster.state.kubeconfig}\n"
        f"  hub log: {hub.directory / 'jupyterhub.log'}\n"
        f"  GPU time: {cluster.state.path / USAGE_DATABASE}\n"
        + (
            f"  prometheus: {metrics.prometheus.url} (scrapes the simulated DCGM exporter "
            f"every {SCRAPE_INTERVAL:g} s)\n"
            f"  dcgm-exporter: {metrics.exporter.url}/metrics (simulated)\n"
            if metrics
            else ""
        )
        + "\nPress Ctrl-C to stop everything.\n"
    )


# ---- what a killed demo leaves behind ----------------------------------------------
# Ctrl-C, SIGTERM and a closed terminal (SIGHUP) clean up; kill -9 cannot. The
# cluster and hub run in sessions of their own and outlive the demo, so each demo
# notes in its cluster's state folder who it is and where its hub lives, and the
# next demo removes what a demo that is no longer running left.

MARKER = "demo.json"


def _mark(
    cluster: LocalCluster, hub: LocalHub | None, prometheus: LocalPrometheus | None = None
) -> None:
    marker = {"pid": os.getpid(), "hub_directory": str(hub.directory) if hub else None}
    if prometheus is not None and prometheus.process is not None:
        # Prometheus runs in a session of its own (the exporter is a thread of the demo)
        marker["prometheus"] = {
            "pid": prometheus.process.pid,
            "directory": str(prometheus.directory),
        }
    (cluster.state.path / MARKER).write_text(json.dumps(marker))


def stop_leftover_prometheus(prometheus: dict[str, Any]) -> None:
    try:
        pid = int(prometheus["pid"])
    except (KeyError, TypeError, ValueError):
        return
    if _alive(pid):
        _stop_group(pid, grace=10)
    if prometheus.get("directory"):
        shutil.rmtree(prometheus["directory"], ignore_errors=True)


def stop_leftover_hub(directory: Path) -> None:
    # the hub and its proxy each lead a session of their own: stop both groups
    for pid_file in ("jupyterhub.pid", "jupyterhub-proxy.pid"):
        try:
            pid = int((directory / pid_file).read_text().strip())
        except (OSError, ValueError):
            continue  # never written: that process never started
        if _alive(pid):
            _stop_group(pid, grace=10)
    shutil.rmtree(directory, ignore_errors=True)


def clean_leftovers(say) -> None:
    """Stop and remove what demos that are no longer running left behind."""
    root = state_root()
    for directory in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            marker = json.loads((directory / MARKER).read_text())
            pid = int(marker["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a demo's cluster, or one still starting
        if _alive(pid):
            continue  # a demo that is still running (on another port)
        say(f"stopping what an earlier demo (pid {pid}) left running")
        if marker.get("hub_directory"):
            stop_leftover_hub(Path(marker["hub_directory"]))
        if marker.get("prometheus"):
            stop_leftover_prometheus(marker["prometheus"])
        LocalCluster(ClusterState.load(directory)).down()


def _check_port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise DemoError(
                f"port {port} on 127.0.0.1 is in use ({e.strerror}): "
                "stop what uses it, or pass another with --port"
            ) from None


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run_demo(plan: DemoPlan, bin_dir: str | None = None, port: int = 8000) -> int:
    def say(message: str) -> None:
        print(f"[demo] {message}", file=sys.stderr, flush=True)

    for note in plan.notes:
        say(note)
    clean_leftovers(say)  # before the port check: a leftover hub may hold the port
    _check_port_free(port)
    # SIGTERM and a closed terminal (SIGHUP) stop the demo as cleanly as Ctrl-C does
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    cluster: LocalCluster | None = None
    hub: LocalHub | None = None
    exporter: SimulatedDCGMExporter | None = None
    prometheus: LocalPrometheus | None = None
    directory: LocalDirectory | None = None
    try:
        # a Ctrl-C while it starts: create() removes what it started, then re-raises
        cluster = LocalCluster.create(
            name="demo",
            bin_dir=bin_dir,
            progress=say,
            node_pools=plan.node_pools,
            stand_in_schedulers=plan.stand_ins,
            schedulers=plan.schedulers,
            # a policy with fair share: Kueue's own fair sharing on, as a site sets it
            kueue_fair_sharing=plan.policy.fair_share is not None,
        )
        _mark(cluster, None)
        created = asyncio.run(reconcile_once(cluster, plan.policy, plan.crds))
        say(f"reconciled the policy's cluster objects: created {', '.join(created) or 'none'}")
        # GPU time outlives hub restarts in a real deployment; here it lives as long as
        # the demo's cluster, in its state folder (an absolute path: the hub and the
        # service each read it)
        policy_values = {
            **serve_loopback_exports(
                plan.policy_values, plan.policy, cluster.state.path / NFS_FOLDER
            ),
            "accounting_url": f"sqlite:///{cluster.state.path / USAGE_DATABASE}",
        }
        for line in seed_fair_share_history(plan, policy_values["accounting_url"], time.time()):
            say(line)
        service_settings = dict(plan.service_settings)
        metrics: GPUMetrics | None = None
        if plan.gpu_metrics:
            exporter = SimulatedDCGMExporter(cluster.state.kubeconfig)
            exporter.start()
            say(f"started the simulated DCGM exporter at {exporter.url}/metrics")
            prometheus = LocalPrometheus([exporter.target], scrape_interval=SCRAPE_INTERVAL)
            say(f"starting Prometheus at {prometheus.url}, scraping the exporter")
            try:
                prometheus.start()
            except RuntimeError as e:
                raise DemoError(str(e)) from None
            _mark(cluster, None, prometheus)
            metrics = GPUMetrics(exporter, prometheus)
            service_settings["prometheus_url"] = prometheus.url
        else:
            # the values' own Prometheus is the site's, never reached from here (loopback
            # only): without the demo's, the idle rule falls back to notebook activity
            service_settings.pop("prometheus_url", None)
        hub_config = plan.hub_config
        if plan.auth == "ldap":
            try:
                # entered here and closed with the rest below (it cleans up after itself
                # when it fails to start)
                directory = LocalDirectory().__enter__()
            except (SlapdMissing, RuntimeError) as e:
                raise DemoError(f"--auth ldap: {e}") from None
            settings = fill_directory(directory, plan, LocalHub.password)
            say(f"started OpenLDAP at {directory.url} with the demo users in their groups")
            hub_config = {
                **hub_config,
                "JupyterHub": {
                    **hub_config.get("JupyterHub", {}),
                    "authenticator_class": "ldap-groups",
                },
                "LDAPGroupsAuthenticator": settings,
            }
        hub = LocalHub(
            cluster,
            namespace=HUB_NAMESPACE,
            # with --auth ldap or values, the groups come from the logins alone
            users=plan.users if plan.auth == "demo" else {},
            admin_users=(DEMO_ADMIN,) if plan.auth != "values" else (),
            port=port,
            policy=policy_values,
            hub_config=hub_config,
            service_settings=service_settings,
            # hub.config as z2jh lays it out in a hub pod, read through its helper
            z2jh_layout=True,
            # the GPU service at /services/gpu/: dashboard, usage API, runtime rules,
            # and the reconciler keeping the policy's objects in the cluster
            gpu_service=True,
        )
        _mark(cluster, hub, prometheus)
        say(f"starting JupyterHub with GPUKubeSpawner and the policy on port {port}")
        try:
            hub.start(timeout=180)
        except RuntimeError as e:
            raise DemoError(str(e)) from None
        if prometheus is not None:
            try:
                prometheus.wait_for_targets()
            except RuntimeError as e:
                raise DemoError(f"{e}; its log: {prometheus.log_path}") from None
            say("Prometheus scrapes the exporter")
        print(banner(plan, hub, cluster, metrics), flush=True)
        while hub.process.poll() is None:
            time.sleep(0.5)
        tail = hub.log_path.read_text(errors="replace")[-3000:]
        say(f"the hub exited on its own; its log ends:\n{tail}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # a second Ctrl-C must not cut the clean-up short and leave processes behind
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        say(
            "stopping the hub, its servers, "
            + ("Prometheus, the DCGM exporter " if prometheus or exporter else "")
            + "and the cluster"
        )
        # the callbacks run last first: the hub, Prometheus, the exporter, the cluster
        with contextlib.ExitStack() as cleanup:
            if cluster:
                cleanup.callback(cluster.down)
            if exporter:
                cleanup.callback(exporter.stop)
            if prometheus:
                cleanup.callback(prometheus.stop)
            if directory:
                cleanup.callback(directory.close)
            if hub:
                cleanup.callback(hub.stop)  # first: it stops the servers' pods
        say("stopped; nothing is left running")
