"""The demo planned before anything starts: the values checked, the users and their
groups, the node pools, the scheduler, the hub's configuration and who logs people
in (a mistake in any stops it here)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jupyterhub_gpu.config.values import checked_values
from jupyterhub_gpu.core.model import Group, Policy

from .demo_objects import dataset_notes
from .demo_settings import DEMO_ADMIN, DEMO_VALUES, SCHEDULER_ROLES, STAND_IN_SCHEDULERS, DemoError
from .ldap import ADMIN_DN, GROUPS, PEOPLE, LocalDirectory
from .localcluster import build
from .localcluster.cluster import DEFAULT_NODE_POOLS
from .localcluster.nodepools import NodePoolError, read_node_pools
from .localcluster.policy_pools import node_pools_for, without_nodes
from .prometheus import PrometheusNotFound, prometheus_binary


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
