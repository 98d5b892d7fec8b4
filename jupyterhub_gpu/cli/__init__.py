"""The ``jupyterhub-gpu`` command line: its arguments and its exit status. The
commands are in ``policy_commands`` (``check``, ``profiles``, ``pod``, ``manifests``)
and ``dev_commands`` (``cluster``, ``demo``).

Exit status: 0 on success, 1 with a one-line message on an error the user can
fix (a bad file, a refusal).
"""

from __future__ import annotations

import argparse
import sys

from .dev_commands import cmd_cluster, cmd_demo, runnable_schedulers
from .errors import UserError
from .policy_commands import cmd_check, cmd_manifests, cmd_pod, cmd_profiles

__all__ = ["UserError", "build_parser", "main"]


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
        choices=runnable_schedulers(),
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
        choices=runnable_schedulers(),
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
    from ..config.values import ValuesError
    from ..core.model import PolicyError

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
