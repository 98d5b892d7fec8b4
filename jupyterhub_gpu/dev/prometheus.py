"""A real Prometheus for the local cluster: Debian's ``prometheus`` package, on 127.0.0.1.

``LocalPrometheus`` writes a configuration that scrapes the given targets (the
simulated DCGM exporter, ``dcgm_exporter.SimulatedDCGMExporter.target``) every
``scrape_interval`` seconds, keeping the targets' own labels (``honor_labels``,
as the GPU Operator's scrape of dcgm-exporter should), starts
``/usr/bin/prometheus`` with its storage in a temporary folder, and waits until
it is ready::

    prometheus = LocalPrometheus([exporter.target]).start()
    prometheus.wait_for_targets()       # scraped once: the first scrape comes after ~5 s
    prometheus.url                      # http://127.0.0.1:<port>: GPUService.prometheus_url
    prometheus.query("up")              # the instant vector, for checks
    prometheus.stop()                   # stops it and removes its folder

Install it with ``apt-get install prometheus`` (``scripts/test`` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .localcluster.cluster import free_port

DEFAULT_BINARY = "/usr/bin/prometheus"


class PrometheusNotFound(RuntimeError):
    pass


def prometheus_binary() -> str:
    """The prometheus executable: on PATH, else Debian's; tells how to install it."""
    found = shutil.which("prometheus") or (
        DEFAULT_BINARY if os.access(DEFAULT_BINARY, os.X_OK) else None
    )
    if not found:
        raise PrometheusNotFound(
            "prometheus is not installed: install Debian's package "
            "(sudo apt-get install prometheus), or put a prometheus binary on PATH"
        )
    return found


class LocalPrometheus:
    """A Prometheus process scraping ``targets`` (``host:port``), on a free loopback port."""

    def __init__(
        self,
        targets: list[str],
        *,
        scrape_interval: float = 1.0,
        port: int | None = None,
        binary: str | None = None,
        job: str = "dcgm-exporter",
    ) -> None:
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.port = port or free_port()
        self.binary = binary
        self.job = job
        self.directory: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return self.directory / "prometheus.log" if self.directory else None

    @property
    def query_log_path(self) -> Path | None:
        """Prometheus' query log: a JSON line per query, with its expression."""
        return self.directory / "queries.log" if self.directory else None

    def queries(self) -> list[str]:
        """The expressions of every query answered so far, from the query log."""
        path = self.query_log_path
        if path is None or not path.exists():
            return []
        lines = path.read_text(errors="replace").splitlines()
        return [json.loads(line)["params"]["query"] for line in lines if line.strip()]

    def config(self) -> dict[str, Any]:
        interval = f"{max(int(self.scrape_interval * 1000), 100)}ms"
        return {
            "global": {
                "scrape_interval": interval,
                "evaluation_interval": interval,
                # every query it answers, for tests that count what a component asks
                **({"query_log_file": str(self.query_log_path)} if self.query_log_path else {}),
            },
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "honor_labels": True,
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }

    def start(self, timeout: float = 60) -> LocalPrometheus:
        binary = self.binary or prometheus_binary()
        self.directory = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-prometheus-"))
        config = self.directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config()))
        assert self.log_path is not None
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=warn",
                ],
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"prometheus did not become ready; its log ends:\n{tail}")
            time.sleep(0.2)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_for_targets(self, timeout: float = 60) -> None:
        """Until every target has been scraped successfully (Prometheus reads its targets
        a few seconds after it starts)."""
        deadline = time.monotonic() + timeout
        while True:
            up = {s["metric"].get("instance"): s["value"][1] for s in self.query("up")}
            if all(up.get(t) == "1" for t in self.targets):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus has not scraped {self.targets} (up: {up})")
            time.sleep(0.5)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now (``data.result``)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body.get('error')}")
        return body["data"]["result"]

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and remove its folder."""
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(10)
            self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
