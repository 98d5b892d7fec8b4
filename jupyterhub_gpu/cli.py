"""The ``jupyterhub-gpu`` command line.

Exit status: 0 on success, 1 with a one-line message on an error the user can
fix (a bad file, a refusal), as DESIGN §6 asks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


class UserError(Exception):
    """An error the user fixes; printed without a traceback."""


def _node_pools(path: str | None) -> dict | None:
    if path is None:
        return None
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"--node-pools {path}: {e}") from e


def cmd_cluster(args: argparse.Namespace) -> int:
    from .localcluster import build, cluster

    existing = cluster.find(args.name)
    if args.action == "build":
        folder = build.ensure_binaries(args.bin_dir)
        print(
            f"binaries in {folder}: " + ", ".join(f"{k} {v}" for k, v in build.versions().items())
        )
        return 0
    if args.action == "up":
        if existing:
            if all(existing.status()["processes"].values()):
                print(f"cluster {args.name!r} is already up ({existing.state.server})")
                print(f"KUBECONFIG={existing.state.kubeconfig}")
                return 0
            existing.down()  # a half-dead leftover: clean it before starting again
        local = cluster.LocalCluster.create(
            name=args.name, bin_dir=args.bin_dir, node_pools=_node_pools(args.node_pools)
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
        print(f"KUBECONFIG={existing.state.kubeconfig}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(bin_dir=args.bin_dir, port=args.port)


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
    c = sub.add_parser("cluster", help="the local Kubernetes GPU cluster (DESIGN §7)")
    c.add_argument("action", choices=["up", "down", "status", "env", "build"])
    c.add_argument("--name", default="default", help="which local cluster (default: default)")
    c.add_argument("--bin-dir", help=bin_dir_help)
    c.add_argument("--node-pools", help="a YAML file of simulated node pools")
    c.set_defaults(func=cmd_cluster)

    d = sub.add_parser("demo", help="the local cluster and a real hub to try it on")
    d.add_argument("--bin-dir", help=bin_dir_help)
    d.add_argument("--port", type=int, default=8000, help="the hub's port on 127.0.0.1")
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .localcluster.build import BuildError
    from .localcluster.cluster import ClusterError

    try:
        return args.func(args)
    except (UserError, BuildError, ClusterError) as e:
        print(f"jupyterhub-gpu {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
