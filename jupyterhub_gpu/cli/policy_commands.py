"""``check``, ``profiles``, ``pod`` and ``manifests``: the policy in values files read
offline, without a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from .errors import UserError


def _groups(text: str) -> list[str]:
    return [g.strip() for g in text.split(",") if g.strip()]


def cmd_check(args: argparse.Namespace) -> int:
    from ..config.deployment import deployment_warnings
    from ..config.devices import device_lines
    from ..config.service_form import service_form
    from ..config.values import (
        checked_values,
        hub_config,
        identity_tls_warnings,
        load_values,
        spawner_setting,
    )
    from ..core.model import PolicyError, hub_namespace_errors
    from ..hub.classes import check_classes

    # the hub's classes and every setting of theirs, beside the policy: one report
    sections = (load_values(args.values).get("hub") or {}).get("config") or {}
    classes = check_classes(sections if isinstance(sections, dict) else {})
    for warning in classes.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        values, policy = checked_values(args.values)
    except PolicyError as e:
        raise PolicyError(e.errors + classes.errors) from None
    errors = list(classes.errors)
    hub_namespace = args.hub_namespace or spawner_setting(hub_config(values), "namespace")
    if hub_namespace:
        errors += hub_namespace_errors(policy, hub_namespace)
    form = service_form(values, hub_namespace)
    errors += form.errors
    if errors:
        raise PolicyError(errors)
    warnings = identity_tls_warnings(values) + deployment_warnings(values, policy)
    for warning in warnings + form.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"policy OK: {len(policy.flavors)} flavors, {len(policy.profiles)} profiles, "
        f"{len(policy.groups)} groups, scheduler {policy.scheduler.name}"
    )
    print(f"GPU service: {form.words}")
    for line in device_lines(policy):
        print(line)
    for extra, why in classes.extras:
        install = f"pip install 'jupyterhub-gpu[{extra}]'"
        print(f"the hub image needs the [{extra}] extra ({why}): {install}")
    return 0


def _policy(paths: list[str]) -> Any:
    from ..config.values import hub_config, load_values, policy_from_config

    return policy_from_config(hub_config(load_values(paths)))


def _opens_line(offer: Any) -> str:
    """What a profile's servers open: ``lab (JupyterLab, /lab; the default), ...``."""
    if not offer.interfaces:
        return "opens: the chart's singleuser.defaultUrl (GPUPolicy.interfaces is not set)"
    words = [f"{i.name} ({i.display_name}, {i.url})" for i in offer.interfaces]
    if len(words) > 1:
        words[0] = words[0][:-1] + "; the default)"
    return "opens: " + ", ".join(words)


def _source_words(dataset: Any, namespace: str | None) -> str:
    """Where a dataset's data comes from, as an admin would look for it."""
    if dataset.kind == "nfs":
        nfs = dataset.source["nfs"]
        return f"NFS {nfs['server']}:{nfs['path']}"
    if dataset.kind == "claim":
        where = f" in namespace {namespace}" if namespace else ""
        return f"PersistentVolumeClaim {dataset.claim}{where}"
    csi = dataset.source["csi"]
    attributes = ", ".join(f"{k}={v}" for k, v in (csi.get("volumeAttributes") or {}).items())
    return f"CSI driver {csi['driver']}" + (f" ({attributes})" if attributes else "")


def _mounts_line(dataset: Any, namespace: str | None) -> str:
    """``mounts /data/x (read-only): X, from NFS server:/export``."""
    read_only = " (read-only)" if dataset.read_only else ""
    return (
        f"mounts {dataset.mount_path}{read_only}: {dataset.display_name}, "
        f"from {_source_words(dataset, namespace)}"
    )


def cmd_profiles(args: argparse.Namespace) -> int:
    from ..core.objects import namespace_for
    from ..core.selection import offers
    from ..hub.offline import offered_profiles

    groups = _groups(args.groups)
    profiles = offered_profiles(args.values, groups)
    if args.json:
        print(json.dumps(profiles, indent=2))
        return 0
    if not profiles:
        print("no profiles: a member of these groups cannot start a server")
        return 0
    policy = _policy(args.values)
    by_slug = {offer.slug: offer for offer in offers(policy, groups)}
    for entry in profiles:
        offer = by_slug[entry["slug"]]
        print(f"{entry['slug']}: {entry['display_name']}")
        print(f"    {entry['description']}")
        for name, option in entry.get("profile_options", {}).items():
            if name != "interface":  # the opens line says it, with where each opens
                print(f"    {name}: {', '.join(option['choices'])}")
        print(f"    {_opens_line(offer)}")
        # a claim is looked up in the server's namespace: the group's own, or the hub's
        namespace = namespace_for(policy, offer.group.name)
        for dataset in policy.datasets_of(offer.group.name):
            print(f"    {_mounts_line(dataset, namespace)}")
    return 0


def cmd_pod(args: argparse.Namespace) -> int:
    import asyncio

    from ..hub.offline import render_pod
    from ..hub.spawner import SpawnRefused

    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--option {item!r}: expected KEY=VALUE")
        options[key] = value
    try:
        pod = asyncio.run(
            render_pod(
                args.values,
                args.user,
                _groups(args.groups),
                args.profile,
                options,
                hub_namespace=args.hub_namespace,
            )
        )
    except SpawnRefused as e:
        raise UserError(f"refused: {e}") from None
    print(yaml.safe_dump(pod, sort_keys=False), end="")
    if not args.hub_namespace and not _spawner_namespace(args.values):
        print(
            "note: the namespace the z2jh release runs in is not known, so the pod shows "
            f"KubeSpawner's default ({pod['metadata']['namespace']}); pass --hub-namespace "
            "to see the pod as that release creates it",
            file=sys.stderr,
        )
    _note_unchecked_claims(args.values, pod)
    return 0


def _spawner_namespace(paths: list[str]) -> str | None:
    from ..config.values import hub_config, load_values, spawner_setting

    return spawner_setting(hub_config(load_values(paths)), "namespace")


def _note_unchecked_claims(paths: list[str], pod: dict[str, Any]) -> None:
    """The claims a pod's datasets need: there is no cluster here to look them up in,
    and the hub refuses the spawn where one is missing (stderr: the pod stays YAML)."""
    from ..core.objects import namespace_for

    group = pod["metadata"].get("labels", {}).get("gpu.jupyterhub.org/group")
    if not group:
        return
    policy = _policy(paths)
    claims = [d.claim for d in policy.datasets_of(group) if d.claim]
    if claims:
        namespace = namespace_for(policy, group)
        where = f"namespace {namespace}" if namespace else "the hub's namespace"
        print(
            f"note: not checked offline: the PersistentVolumeClaim(s) {', '.join(claims)} "
            f"must exist in {where}; the hub refuses the spawn where one does not",
            file=sys.stderr,
        )


def cmd_manifests(args: argparse.Namespace) -> int:
    import dataclasses

    from ..config.service_form import service_deployment, service_form
    from ..config.values import hub_config, load_values, policy_from_loaded, spawner_setting
    from ..core.manifests import desired_objects, rbac_objects
    from ..core.model import PolicyError, hub_namespace_errors
    from ..core.service_deployment import service_deployment_objects

    values = load_values(args.values)
    policy = policy_from_loaded(values)
    # the RBAC binds the hub's service account in the release's namespace: a guessed
    # namespace would bind an account that does not exist, and every spawn would fail
    hub_namespace = args.hub_namespace or spawner_setting(hub_config(values), "namespace")
    if not hub_namespace:
        raise UserError(
            "the namespace the z2jh release runs in is not known: pass --hub-namespace "
            "NAMESPACE (the one `helm upgrade --install --namespace` installs into), or set "
            "hub.config.KubeSpawner.namespace in the values"
        )
    form = service_form(values, hub_namespace)
    if errors := hub_namespace_errors(policy, hub_namespace) + form.errors:
        raise PolicyError(errors)
    desired = desired_objects(policy, hub_namespace)
    # in its own Deployment the service has its own account (unless one is named) and
    # elects a leader on a Lease named like the Deployment
    own = form.settings if form.form == "deployment" else None
    gpu_account = args.gpu_service_account or (own.deployment_name if own else None)
    lease = own.deployment_name if own else None
    deployment = []
    if own is not None:
        try:
            spec = service_deployment(values, hub_namespace, own)
        except ValueError as e:
            raise UserError(str(e)) from None
        if args.gpu_service_account:
            spec = dataclasses.replace(spec, account=args.gpu_service_account)
        deployment = service_deployment_objects(spec)
    # the namespaces first: the RoleBindings that follow live in them
    objects = [
        *(o for o in desired if o["kind"] == "Namespace"),
        *rbac_objects(policy, hub_namespace, args.service_account, gpu_account, lease),
        *(o for o in desired if o["kind"] != "Namespace"),
        *deployment,
    ]
    if args.for_removal:
        # `... | kubectl delete -f -` must never take a group's namespace with it: that
        # would delete its running servers and their volumes
        objects = [o for o in objects if o.get("kind") != "Namespace"]

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data):  # a GitOps reader wants each object whole
            return True

    print(yaml.dump_all(objects, Dumper=NoAliases, sort_keys=False), end="")
    return 0
