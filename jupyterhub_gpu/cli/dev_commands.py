"""``cluster`` and ``demo``: the commands of the local cluster and the demo, which are
the jupyterhub-gpu-dev distribution (imported only here, and only when one of them runs).
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

from .errors import UserError


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


def runnable_schedulers() -> list[str] | None:
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
