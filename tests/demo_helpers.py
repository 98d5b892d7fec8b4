"""`jupyterhub-gpu demo` as a subprocess, as a newcomer or an admin runs it.

The tests take from it only what it prints (the URL, the kubeconfig, the hub log,
the admin token) and what a user could see in /proc.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from jupyterhub_gpu_dev.demo import MARKER, stop_leftover_hub, stop_leftover_prometheus
from jupyterhub_gpu_dev.localcluster import sockets
from jupyterhub_gpu_dev.localcluster.cluster import ClusterState, LocalCluster


class Demo:
    """The demo subprocess and the lines it printed (stdout and stderr, in order)."""

    def __init__(self, port: int, *args: str) -> None:
        """``args``: the demo's own (values files, ``--node-pools``)."""
        self.port = port
        self.lines: list[str] = []
        # read from what it prints, once it is up
        self.url = ""
        self.kubeconfig = self.cluster_dir = self.hub_dir = None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub_gpu.cli", "demo", *args, "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            if self.process.poll() is not None:
                self._reader.join(5)
                raise AssertionError(
                    f"the demo exited ({self.process.returncode}) before printing "
                    f"{pattern!r}:\n{self.output}"
                )
            time.sleep(0.2)
        raise AssertionError(f"the demo printed no {pattern!r} in {timeout}s:\n{self.output}")

    def wait_until_up(self, timeout: float = 240) -> Demo:
        """Wait for the banner; note the URL and the folders it names."""
        url = self.wait_for(r"is running at (http://\S+)/hub/login", timeout).group(1)
        assert url == f"http://127.0.0.1:{self.port}"
        self.url = url
        self.kubeconfig = Path(self.wait_for(r"export KUBECONFIG=(\S+)", timeout=5).group(1))
        self.cluster_dir = self.kubeconfig.parent.parent
        self.hub_dir = Path(self.wait_for(r"hub log: (\S+)", timeout=5).group(1)).parent
        return self

    def interrupt(self, timeout: float = 180, sig: int = signal.SIGINT) -> int:
        """Ctrl-C, as in a terminal (or another signal); the exit status."""
        self.process.send_signal(sig)
        returncode = self.process.wait(timeout)
        self._reader.join(10)
        return returncode

    def make_sure_it_is_gone(self) -> None:
        """After a failed test: nothing of this demo may stay running for the next one."""
        if self.process.poll() is None:
            try:
                self.interrupt()
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.hub_dir and self.hub_dir.exists():
            stop_leftover_hub(self.hub_dir)
        # Prometheus runs in a session of its own: a killed demo leaves it running
        if self.cluster_dir and (self.cluster_dir / MARKER).exists():
            marker = json.loads((self.cluster_dir / MARKER).read_text())
            if marker.get("prometheus"):
                stop_leftover_prometheus(marker["prometheus"])
        if self.cluster_dir and (self.cluster_dir / "state.json").exists():
            LocalCluster(ClusterState.load(self.cluster_dir)).down()


def api(demo: Demo, token: str, method: str, path: str, body: dict | None = None):
    request = urllib.request.Request(
        f"{demo.url}/hub/api{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:  # a refusal: its status and the hub's message
        return e.code, json.loads(e.read() or b"null")


# ---- what runs: processes, from /proc ----------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: split after its closing parenthesis
    return text.rsplit(")", 1)[1].split()


def processes_under(root: int) -> dict[int, str]:
    """Every process below ``root`` (in sessions of their own too): pid -> start time."""
    found = {}
    for pid in sockets.descendants([root]) - {root}:
        if fields := _stat(pid):
            found[pid] = fields[19]  # starttime tells a reused pid apart
    return found


def still_running(processes: dict[int, str]) -> list[str]:
    running = []
    for pid, started in processes.items():
        fields = _stat(pid)
        if fields and fields[19] == started and fields[0] != "Z":
            running.append(f"{pid}: {cmdline(pid)}")
    return running


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
