"""``jupyterhub-gpu demo``: the local cluster and a real hub with the GPU policy.

Builds (or reuses) the local cluster, creates the cluster objects the policy's
pods need, starts a real JupyterHub with configurable-http-proxy and
``GPUKubeSpawner`` configured from ``demo_values.yaml`` through the same
``hub.config`` path z2jh uses, and the GPU service (``jupyterhub-gpu-service``
at /services/gpu/) hub-managed, with demo users in each group who log in with a
shared password. Prints the URL and the logins; Ctrl-C (or SIGTERM, or closing
the terminal) stops the hub, its servers and the cluster, and removes their
folders; what a demo killed outright left, the next demo removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..config.values import load_values, policy_from_values
from ..core.model import Policy
from ..kube.reconciler import Reconciler
from .localcluster.cluster import (
    ClusterState,
    LocalCluster,
    _alive,
    _stop_group,
    state_root,
)
from .localcluster.hub import LocalHub

#: The demo's policy: a z2jh values file (``jupyterhub-gpu check`` works on it).
DEMO_VALUES = Path(__file__).with_name("demo_values.yaml")

#: user -> JupyterHub groups; one user per role of the university policy
DEMO_USERS: dict[str, list[str]] = {
    "researcher": ["research"],
    "student1": ["students"],
    "student2": ["students"],
    "admin": ["test"],
    "nogroup": [],
}
DEMO_ADMINS = ("admin",)
#: where the hub runs and spawns (the policy has no namespace per group)
HUB_NAMESPACE = "default"
#: what each login shows off, for the banner
DEMO_ROLES = {
    "researcher": "research profiles: 1, 2 or 4 H200s, an A100 or a MIG slice",
    "student1": "the student GPU (a time-sliced H200 replica)",
    "student2": "...and is refused: the students' quota fits one server",
    "admin": "every profile, unlimited (the test queue); hub admin",
    "nogroup": "in no group: only everyone's CPU profile",
}


class DemoError(RuntimeError):
    """The demo cannot start; the message says what to do."""


def demo_policy(values: Path = DEMO_VALUES) -> tuple[dict[str, Any], Policy]:
    """``hub.config.GPUPolicy`` from the values file, and the checked policy it gives."""
    policy = policy_from_values([values])  # a PolicyError stops the demo before anything starts
    return load_values([values])["hub"]["config"]["GPUPolicy"], policy


# ---- cluster objects ------------------------------------------------------------


async def reconcile_once(cluster: LocalCluster, policy: Policy) -> list[str]:
    """Create the objects the policy implies (for this policy: the PriorityClasses its
    pods name) with the service's reconciler, once; what it created."""
    async with cluster.api() as api:
        report = await Reconciler(api, hub_namespace=HUB_NAMESPACE).reconcile(policy)
    if not report.ok:
        raise DemoError(f"the cluster refused objects the policy needs: {report.summary()}")
    return report.created


# ---- running it -------------------------------------------------------------------


def banner(hub: LocalHub, cluster: LocalCluster) -> str:
    width = max(map(len, DEMO_USERS))
    rows = "\n".join(
        f"    {user:<{width}}  {', '.join(groups) or '-':<9}  {DEMO_ROLES[user]}"
        for user, groups in DEMO_USERS.items()
    )
    return (
        f"\nJupyterHub with the GPU policy is running at {hub.url}/hub/login\n\n"
        f"  log in as (password for all: {hub.password}):\n"
        f"    {'user':<{width}}  {'groups':<9}  sees\n{rows}\n\n"
        f"  usage dashboard: {hub.service_url}\n\n"
        f"  policy:  {DEMO_VALUES}\n"
        f"           (`jupyterhub-gpu profiles {DEMO_VALUES} --groups students`)\n"
        f"  kubectl: export KUBECONFIG={cluster.state.kubeconfig}\n"
        f"  hub log: {hub.directory / 'jupyterhub.log'}\n\n"
        "Press Ctrl-C to stop everything.\n"
    )


# ---- what a killed demo leaves behind ----------------------------------------------
# Ctrl-C, SIGTERM and a closed terminal (SIGHUP) clean up; kill -9 cannot. The
# cluster and hub run in sessions of their own and outlive the demo, so each demo
# notes in its cluster's state folder who it is and where its hub lives, and the
# next demo removes what a demo that is no longer running left.

MARKER = "demo.json"


def _mark(cluster: LocalCluster, hub: LocalHub | None) -> None:
    marker = {"pid": os.getpid(), "hub_directory": str(hub.directory) if hub else None}
    (cluster.state.path / MARKER).write_text(json.dumps(marker))


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


def run_demo(bin_dir: str | None = None, port: int = 8000) -> int:
    def say(message: str) -> None:
        print(f"[demo] {message}", file=sys.stderr, flush=True)

    policy_values, policy = demo_policy()
    clean_leftovers(say)  # before the port check: a leftover hub may hold the port
    _check_port_free(port)
    # SIGTERM and a closed terminal (SIGHUP) stop the demo as cleanly as Ctrl-C does
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    cluster: LocalCluster | None = None
    hub: LocalHub | None = None
    try:
        # a Ctrl-C while it starts: create() removes what it started, then re-raises
        cluster = LocalCluster.create(name="demo", bin_dir=bin_dir, progress=say)
        _mark(cluster, None)
        created = asyncio.run(reconcile_once(cluster, policy))
        say(f"reconciled the policy's cluster objects: created {', '.join(created) or 'none'}")
        hub = LocalHub(
            cluster,
            namespace=HUB_NAMESPACE,
            users=DEMO_USERS,
            admin_users=DEMO_ADMINS,
            port=port,
            policy=policy_values,
            # the GPU service at /services/gpu/: dashboard, usage API, runtime rules,
            # and the reconciler keeping the policy's objects in the cluster
            gpu_service=True,
        )
        _mark(cluster, hub)
        say(f"starting JupyterHub with GPUKubeSpawner and {DEMO_VALUES.name} on port {port}")
        try:
            hub.start(timeout=180)
        except RuntimeError as e:
            raise DemoError(str(e)) from None
        print(banner(hub, cluster), flush=True)
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
        say("stopping the hub, its servers and the cluster")
        with contextlib.ExitStack() as cleanup:
            if cluster:
                cleanup.callback(cluster.down)
            if hub:
                cleanup.callback(hub.stop)  # first: it stops the servers' pods
        say("stopped; nothing is left running")
