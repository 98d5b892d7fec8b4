"""The ``jupyterhub-gpu`` command line.

Exit status: 0 on success, 1 with a one-line message on an error the user can
fix (a bad file, a refusal).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shlex
import shutil
import sys
from typing import Any

import yaml


class UserError(Exception):
    """An error the user fixes; printed without a traceback."""


def _node_pools(path: str | None) -> dict | None:
    if path is None:
        return None
    from jupyterhub_gpu_dev.localcluster.nodepools import NodePoolError, read_node_pools

    try:
        return read_node_pools(path)
    except NodePoolError as e:
        raise UserError(f"--node-pools {e}") from None


#: what to install for ``cluster`` and ``demo``: the local cluster and the demo are a
#: distribution of their own, which a hub image does not install
DEV_INSTALL = (
    "the local cluster and the demo come with the jupyterhub-gpu-dev distribution, "
    "beside this package in its source checkout: pip install -e ./jupyterhub-gpu-dev"
)


def _dev_tools():
    """The local cluster's modules (``check``, ``profiles``, ``pod`` and ``manifests``
    work without them)."""
    try:
        from jupyterhub_gpu_dev.localcluster import build, cluster
    except ModuleNotFoundError as e:
        if e.name == "jupyterhub_gpu_dev":
            raise UserError(DEV_INSTALL) from None
        if (e.name or "").startswith("jupyterhub_gpu"):
            raise
        raise UserError(
            f"the local cluster and the demo need {e.name}, which jupyterhub-gpu-dev "
            f"depends on: {DEV_INSTALL}"
        ) from None
    return build, cluster


def _runnable_schedulers() -> list[str] | None:
    """The schedulers the local cluster can run besides kube-scheduler (``demo --scheduler``);
    None where the local cluster is not installed (the command then says what to install).
    The build module needs nothing beyond the standard library: ``--help`` works without
    the local cluster's own dependencies."""
    try:
        from jupyterhub_gpu_dev.localcluster.build import SCHEDULER_COMPONENTS
    except ModuleNotFoundError as e:
        if e.name != "jupyterhub_gpu_dev":
            raise
        return None
    return list(SCHEDULER_COMPONENTS)


@contextlib.contextmanager
def _dev_errors():
    """The local cluster's and the demo's errors, as one line each."""
    from jupyterhub_gpu_dev.demo import DemoError
    from jupyterhub_gpu_dev.localcluster.build import BuildError
    from jupyterhub_gpu_dev.localcluster.cluster import ClusterError

    try:
        yield
    except (BuildError, ClusterError, DemoError) as e:
        raise UserError(str(e)) from None


def cmd_cluster(args: argparse.Namespace) -> int:
    build, cluster = _dev_tools()
    with _dev_errors():
        return _cluster(args, build, cluster)


def _cluster(args: argparse.Namespace, build: Any, cluster: Any) -> int:
    existing = cluster.find(args.name)
    if args.action == "build":
        schedulers = tuple(args.scheduler)
        folder = build.ensure_binaries(args.bin_dir, schedulers=schedulers)
        versions = build.versions(schedulers)
        print(f"binaries in {folder}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        return 0
    if args.action == "up":
        if existing:
            if all(existing.status()["processes"].values()):
                missing = [s for s in args.scheduler if s not in existing.state.schedulers]
                if missing:
                    raise UserError(
                        f"cluster {args.name!r} is already up without {', '.join(missing)}: "
                        f"stop it with `jupyterhub-gpu cluster down --name {args.name}` first"
                    )
                print(f"cluster {args.name!r} is already up ({existing.state.server})")
                print(f"KUBECONFIG={existing.state.kubeconfig}")
                return 0
            existing.down()  # a half-dead leftover: clean it before starting again
        local = cluster.LocalCluster.create(
            name=args.name,
            bin_dir=args.bin_dir,
            node_pools=_node_pools(args.node_pools),
            schedulers=tuple(args.scheduler),
        )
        print(f"cluster {args.name!r} is up at {local.state.server}")
        print(f"KUBECONFIG={local.state.kubeconfig}")
        return 0
    if existing is None:
        if args.action == "down":
            print(f"no cluster named {args.name!r} is up")
            return 0
        raise UserError(
            f"no cluster named {args.name!r} is up: start one with `jupyterhub-gpu cluster up`"
        )
    if args.action == "down":
        existing.down()
        print(f"cluster {args.name!r} stopped and removed")
    elif args.action == "status":
        status = existing.status()
        print(json.dumps(status, indent=2))
        return 0 if status["apiserver_ready"] and all(status["processes"].values()) else 1
    elif args.action == "env":
        # shell code, like `ssh-agent` prints: eval "$(jupyterhub-gpu cluster env)"
        print(f"export KUBECONFIG={shlex.quote(str(existing.state.kubeconfig))}")
    return 0


def _groups(text: str) -> list[str]:
    return [g.strip() for g in text.split(",") if g.strip()]


def cmd_check(args: argparse.Namespace) -> int:
    from .config.deployment import deployment_warnings
    from .config.devices import device_lines
    from .config.service_form import service_form
    from .config.values import (
        checked_values,
        hub_config,
        identity_tls_warnings,
        load_values,
        spawner_setting,
    )
    from .core.model import PolicyError, hub_namespace_errors
    from .hub.classes import check_classes

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
    from .config.values import hub_config, load_values, policy_from_config

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
    from .core.objects import namespace_for
    from .core.selection import offers
    from .hub.offline import offered_profiles

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

    from .hub.offline import render_pod
    from .hub.spawner import SpawnRefused

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
    from .config.values import hub_config, load_values, spawner_setting

    return spawner_setting(hub_config(load_values(paths)), "namespace")


def _note_unchecked_claims(paths: list[str], pod: dict[str, Any]) -> None:
    """The claims a pod's datasets need: there is no cluster here to look them up in,
    and the hub refuses the spawn where one is missing (stderr: the pod stays YAML)."""
    from .core.objects import namespace_for

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

    from .config.service_form import service_deployment, service_form
    from .config.values import hub_config, load_values, policy_from_loaded, spawner_setting
    from .core.manifests import desired_objects, rbac_objects
    from .core.model import PolicyError, hub_namespace_errors
    from .core.service_deployment import service_deployment_objects

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


def _demo_servers_can_run() -> None:
    """The demo's servers run on this machine: ``jupyterhub-singleuser`` opening
    JupyterLab. Without them every spawn would end in the hub's own error; say so
    before anything starts. code-server, for VS Code, is installed (once) here too;
    if it cannot be, the demo says why and runs without it."""
    missing = [
        what
        for what, found in (
            ("jupyterhub-singleuser (JupyterHub's)", shutil.which("jupyterhub-singleuser")),
            ("JupyterLab", importlib.util.find_spec("jupyterlab")),
        )
        if not found
    ]
    if missing:
        raise UserError(
            f"the demo's servers run {' and '.join(missing)} on this machine, which "
            f"is not installed: {DEV_INSTALL}"
        )
    # VS Code: code-server (npm, built once and cached) behind jupyter-vscode-proxy. Without
    # it the rest of the demo runs, and a server opened with VS Code answers 404 at /vscode/
    from jupyterhub_gpu_dev import codeserver
    from jupyterhub_gpu_dev.localcluster.build import BuildError

    def say(text: str) -> None:
        print(f"jupyterhub-gpu demo: {text}", file=sys.stderr, flush=True)

    if importlib.util.find_spec("jupyter_vscode_proxy") is None:
        say(
            "VS Code will not open in the demo's servers: jupyter-vscode-proxy is not "
            f"installed ({DEV_INSTALL})"
        )
    try:
        if codeserver.installed_bin_dir() is None:
            codeserver.install_missing_packages(say)
        codeserver.ensure_code_server(say)
    except BuildError as e:
        say(f"VS Code will not open in the demo's servers (the rest of the demo runs): {e}")


def _demo_lab_extension() -> None:
    """The demo's JupyterLab shows GPU time: from a source checkout, the extension
    (jupyterlab-gpu/) is built (npm, cached by hash) and installed here if it is not
    yet, or changed; elsewhere it is what ``pip install jupyterhub-gpu-jupyterlab`` put."""
    from jupyterhub_gpu_dev import labextension

    if (labextension.SOURCE / "package.json").exists():
        labextension.ensure_installed(lambda text: print(f"jupyterhub-gpu demo: {text}"))
    elif importlib.util.find_spec("jupyterhub_gpu_jupyterlab") is None:
        print(
            "jupyterhub-gpu demo: JupyterLab will not show GPU time (the extension is not "
            "installed): pip install jupyterhub-gpu-jupyterlab",
            file=sys.stderr,
        )


def cmd_demo(args: argparse.Namespace) -> int:
    _dev_tools()
    from jupyterhub_gpu_dev.demo import plan_demo, print_node_pools, run_demo

    with _dev_errors():
        # every mistake in the values or the node pools stops it before anything starts
        plan = plan_demo(args.values, args.node_pools, args.scheduler, args.auth)
        if args.print_node_pools:
            print(print_node_pools(plan), end="")
            return 0
        _demo_servers_can_run()
        _demo_lab_extension()
        return run_demo(plan, bin_dir=args.bin_dir, port=args.port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyterhub-gpu",
        description="Fair, self-service GPU notebooks on a shared Kubernetes cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    bin_dir_help = (
        "a folder of prebuilt etcd, kube-apiserver, kube-controller-manager, kube-scheduler "
        "and kwok binaries to use instead of building them (also JUPYTERHUB_GPU_BIN_DIR)"
    )
    c = sub.add_parser("cluster", help="the local Kubernetes GPU cluster")
    c.add_argument("action", choices=["up", "down", "status", "env", "build"])
    c.add_argument("--name", default="default", help="which local cluster (default: default)")
    c.add_argument("--bin-dir", help=bin_dir_help)
    c.add_argument("--node-pools", help="a YAML file of simulated node pools")
    c.add_argument(
        "--scheduler",
        action="append",
        default=[],
        choices=_runnable_schedulers(),
        help="a scheduler to build (build) and run (up) besides kube-scheduler: kueue runs "
        "Kueue's manager with its CRDs and webhooks, volcano Volcano's scheduler and "
        "controller-manager with its CRDs, on 127.0.0.1 (repeatable)",
    )
    c.set_defaults(func=cmd_cluster)

    values_help = "z2jh values files, merged in order like helm -f"
    k = sub.add_parser("check", help="validate the policy in values files, offline")
    k.add_argument("values", nargs="+", help=values_help)
    k.add_argument(
        "--hub-namespace",
        help="the namespace the z2jh release runs in, which no group's namespace may be "
        "(default: the spawner's namespace in the values, if they set one)",
    )
    k.set_defaults(func=cmd_check)

    pr = sub.add_parser("profiles", help="what a member of some groups is offered")
    pr.add_argument("values", nargs="+", help=values_help)
    pr.add_argument("--groups", default="", help="comma-separated JupyterHub groups")
    pr.add_argument("--json", action="store_true", help="print the KubeSpawner profile_list")
    pr.set_defaults(func=cmd_profiles)

    po = sub.add_parser("pod", help="the Pod a spawn would create on an empty cluster")
    po.add_argument("values", nargs="+", help=values_help)
    po.add_argument("--user", required=True)
    po.add_argument("--groups", default="", help="comma-separated JupyterHub groups")
    po.add_argument("--profile", help="the profile slug, <group>--<profile> (default: the default)")
    po.add_argument(
        "--option",
        action="append",
        default=[],
        help="KEY=VALUE, e.g. gpus=2 or interface=vscode (repeatable)",
    )
    po.add_argument(
        "--hub-namespace",
        help="the namespace the z2jh release runs in, where servers without a group "
        "namespace run (default: the spawner's namespace in the values, if they set one)",
    )
    po.set_defaults(func=cmd_pod)

    m = sub.add_parser(
        "manifests", help="the Kubernetes objects the service reconciles, plus its RBAC (YAML)"
    )
    m.add_argument("values", nargs="+", help=values_help)
    m.add_argument(
        "--hub-namespace",
        help="the namespace the z2jh release (hub, proxy) runs in, where the hub's service "
        "account is bound (default: hub.config.KubeSpawner.namespace in the values; one "
        "of the two is required)",
    )
    m.add_argument(
        "--service-account",
        default="hub",
        help="the hub's service account (default: hub, z2jh's)",
    )
    m.add_argument(
        "--gpu-service-account",
        default=None,
        help="the GPU service's own service account, when it runs under one: it then "
        "gets the reconciler's rights and the hub's account only the spawner's "
        "(default: the hub's, which the service shares in the hub's pod)",
    )
    m.add_argument(
        "--for-removal",
        action="store_true",
        help="leave out the groups' namespaces, for `| kubectl delete -f -` when removing "
        "the bundle: deleting a namespace deletes the servers and volumes in it; delete "
        "each yourself once it holds no pods or persistent volume claims",
    )
    m.set_defaults(func=cmd_manifests)

    d = sub.add_parser(
        "demo",
        help="the local cluster and a real hub to try a policy on (the built-in one, or yours)",
    )
    d.add_argument(
        "values",
        nargs="*",
        help=f"{values_help}; none: the built-in example policy",
    )
    d.add_argument(
        "--node-pools",
        help="a YAML file of simulated node pools (default: derived from the policy's flavors)",
    )
    d.add_argument(
        "--print-node-pools",
        action="store_true",
        help="print the simulated node pools the demo would start, and start nothing",
    )
    d.add_argument(
        "--scheduler",
        choices=_runnable_schedulers(),
        help="run the built-in example with this scheduler (its scheduler.name), which the "
        "local cluster then runs for real (built on first use, like the control plane). "
        "Values files that name a scheduler the local cluster can run get it without this "
        "option; with values files, it must be the one they name. A scheduler the local "
        "cluster cannot run (kai) is stood in for by kube-scheduler",
    )
    d.add_argument(
        "--auth",
        choices=["demo", "values", "ldap"],
        default="demo",
        help="who logs people in: demo (default) the demo users with a shared password, "
        "their groups set by the demo; values the authenticator the values name, as they "
        "configure it (point it at a test directory); ldap a local OpenLDAP holding the "
        "demo users in their groups, read at every login",
    )
    d.add_argument("--bin-dir", help=bin_dir_help)
    d.add_argument("--port", type=int, default=8000, help="the hub's port on 127.0.0.1")
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .config.values import ValuesError
    from .core.model import PolicyError

    try:
        return args.func(args)
    except PolicyError as e:
        print(
            f"jupyterhub-gpu {args.command}: the policy has {len(e.errors)} error(s):",
            file=sys.stderr,
        )
        print(str(e), file=sys.stderr)
        return 1
    except (UserError, ValuesError) as e:
        print(f"jupyterhub-gpu {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
