"""`jupyterhub-gpu cluster up|status|env|down` as an admin runs them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jupyterhub_gpu_dev.localcluster.cluster import DEFAULT_NODE_POOLS
from jupyterhub_gpu_dev.localcluster.nodepools import read_node_pools, render_nodes
from jupyterhub_gpu_dev.localcluster.processes import alive

CLI = [sys.executable, "-m", "jupyterhub_gpu.cli"]
#: the nodes of the default pools (nodepools.yaml)
NODES = len(render_nodes(read_node_pools(DEFAULT_NODE_POOLS)))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.k8s
def test_up_status_env_down_leaves_nothing_behind(local_cluster):
    # local_cluster: the binaries are built (or found) before this runs
    name = f"cli-{os.getpid()}"
    up = run("cluster", "up", "--name", name)
    assert up.returncode == 0, up.stderr
    assert f"registering {NODES} simulated nodes" in up.stderr  # progress is shown
    try:
        status = run("cluster", "status", "--name", name)
        assert status.returncode == 0, status.stdout + status.stderr
        state = json.loads(status.stdout)
        assert state["apiserver_ready"] is True
        assert set(state["processes"]) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "pod-runner",
        }
        # `eval "$(jupyterhub-gpu cluster env)"` points kubectl at the cluster
        script = f'eval "$("$@" cluster env --name {name})"; kubectl get nodes -o name'
        shell = subprocess.run(
            ["bash", "-c", script, "bash", *CLI],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        )
        assert shell.returncode == 0, shell.stderr
        assert len(shell.stdout.split()) == NODES, shell.stdout
        # a second `up` finds the running cluster instead of starting another
        again = run("cluster", "up", "--name", name)
        assert "already up" in again.stdout
        saved = json.loads(Path(state["directory"], "state.json").read_text())
    finally:
        down = run("cluster", "down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert not os.path.exists(state["directory"])
    assert [r for r, pid in saved["pids"].items() if alive(pid)] == []
    assert [p for p in saved["ports"].values() if port_open(p)] == []

    after = run("cluster", "status", "--name", name)
    assert after.returncode == 1
    assert f"no cluster named '{name}' is up" in after.stderr


def test_bin_dir_without_binaries_is_a_clear_error(tmp_path):
    result = run("cluster", "up", "--name", "never", "--bin-dir", str(tmp_path))
    assert result.returncode == 1
    assert "no executable etcd, kube-apiserver" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_node_pool_file_is_refused_before_anything_starts(tmp_path):
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "node_pools:\n  big:\n    count: 1\n    cpu: 8\n    memory: 1Gi\n    gpus: 2\n"
    )
    result = run("cluster", "up", "--name", "never", "--node-pools", str(pools))
    assert result.returncode == 1
    assert "node_pools.big.gpus: unknown key" in result.stderr
