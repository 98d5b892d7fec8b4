"""``jupyterhub-gpu demo``: the local cluster and a real hub to try it on.

Builds (or reuses) the local cluster, starts a real JupyterHub with
configurable-http-proxy spawning into it, with demo users who log in with a
shared password, prints the URL and the logins, and on Ctrl-C stops everything
it started.

The GPU policy (group profiles and quotas) is not wired in yet: the hub runs
stock KubeSpawner, so every user gets the CPU notebook.
"""

from __future__ import annotations

import signal
import sys
import threading

from .localcluster.cluster import LocalCluster
from .localcluster.hub import LocalHub

DEMO_USERS = {
    "researcher": ["research"],
    "student1": ["students"],
    "student2": ["students"],
    "nogroup": [],
}
DEMO_ADMIN = "admin"


def run_demo(bin_dir: str | None = None, port: int = 8000) -> int:
    def say(message: str) -> None:
        print(f"[demo] {message}", file=sys.stderr, flush=True)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    cluster = LocalCluster.create(name="demo", bin_dir=bin_dir, progress=say)
    hub = None
    try:
        say("starting JupyterHub")
        hub = LocalHub(cluster, users=DEMO_USERS, admin_users=(DEMO_ADMIN,), port=port).start()
        logins = ", ".join([*DEMO_USERS, DEMO_ADMIN])
        print(
            f"\nJupyterHub is running at {hub.url}/hub/login\n"
            f"  users: {logins}\n"
            f"  password (all users): {hub.password}\n"
            f"  kubectl: export KUBECONFIG={cluster.state.kubeconfig}\n"
            "Press Ctrl-C to stop everything.\n",
            flush=True,
        )
        while not stop.wait(1):
            if hub.process.poll() is not None:
                tail = hub.log_path.read_text(errors="replace")[-3000:]
                say(f"the hub exited; its log ends:\n{tail}")
                return 1
        return 0
    finally:
        say("stopping the hub and the cluster")
        if hub:
            hub.stop()
        cluster.down()
