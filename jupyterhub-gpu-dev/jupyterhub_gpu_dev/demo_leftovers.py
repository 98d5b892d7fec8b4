"""What a demo killed outright leaves behind (its hub, its Prometheus, its cluster):
found by the marker each demo writes, stopped and removed by the next demo."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .localcluster.cluster import ClusterState, LocalCluster, state_root
from .localcluster.hub import LocalHub
from .localcluster.processes import alive, stop_group
from .prometheus import LocalPrometheus

# Ctrl-C, SIGTERM and a closed terminal (SIGHUP) clean up; kill -9 cannot. The
# cluster and hub run in sessions of their own and outlive the demo, so each demo
# notes in its cluster's state folder who it is and where its hub lives, and the
# next demo removes what a demo that is no longer running left.
MARKER = "demo.json"


def write_marker(
    cluster: LocalCluster, hub: LocalHub | None, prometheus: LocalPrometheus | None = None
) -> None:
    """What the next demo needs to clean up after this one, should it be killed."""
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
    if alive(pid):
        stop_group(pid, grace=10)
    if prometheus.get("directory"):
        shutil.rmtree(prometheus["directory"], ignore_errors=True)


def stop_leftover_hub(directory: Path) -> None:
    # the hub and its proxy each lead a session of their own: stop both groups
    for pid_file in ("jupyterhub.pid", "jupyterhub-proxy.pid"):
        try:
            pid = int((directory / pid_file).read_text().strip())
        except (OSError, ValueError):
            continue  # never written: that process never started
        if alive(pid):
            stop_group(pid, grace=10)
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
        if alive(pid):
            continue  # a demo that is still running (on another port)
        say(f"stopping what an earlier demo (pid {pid}) left running")
        if marker.get("hub_directory"):
            stop_leftover_hub(Path(marker["hub_directory"]))
        if marker.get("prometheus"):
            stop_leftover_prometheus(marker["prometheus"])
        LocalCluster(ClusterState.load(directory)).down()
