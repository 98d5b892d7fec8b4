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

More targets can be scraped while it runs, each job with its path and a bearer
token (the hub's ``/hub/metrics``, the GPU service's ``/services/gpu/metrics``)::

    prometheus.scrape({"jupyterhub": "http://127.0.0.1:8000/hub/metrics"}, token)
    prometheus.unscrape("jupyterhub")   # until its series are stale

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
        #: scrape configs added while it runs (``scrape``), by job name
        self.jobs: dict[str, dict[str, Any]] = {}

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

    @property
    def interval(self) -> str:
        return f"{max(int(self.scrape_interval * 1000), 100)}ms"

    def config(self) -> dict[str, Any]:
        interval = self.interval
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
                },
                *self.jobs.values(),
            ],
        }

    def start(self, timeout: float = 60) -> LocalPrometheus:
        binary = self.binary or prometheus_binary()
        self.directory = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-prometheus-"))
        self.write_config()
        config = self.directory / "prometheus.yml"
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

    def write_config(self) -> None:
        assert self.directory is not None, "not started"
        (self.directory / "prometheus.yml").write_text(yaml.safe_dump(self.config()))

    def scrape(self, urls: dict[str, str], token: str | None = None, timeout: float = 60) -> None:
        """Scrape more targets from now on, each a job of its own (``{job: URL}``, e.g.
        ``{"jupyterhub": "http://127.0.0.1:8000/hub/metrics"}``), with ``token`` as a
        bearer token, until every one has been scraped successfully. One reload for
        them all: Prometheus applies new targets at most every 5 seconds."""
        for job, url in urls.items():
            parts = urllib.parse.urlsplit(url)
            self.jobs[job] = {
                "job_name": job,
                "scheme": parts.scheme,
                "metrics_path": parts.path,
                "scrape_interval": self.interval,
                "scrape_timeout": self.interval,
                "static_configs": [{"targets": [parts.netloc]}],
                **({"authorization": {"type": "Bearer", "credentials": token}} if token else {}),
            }
        self.reload(timeout)
        for job in urls:
            self.wait_for_targets(timeout, job=job)

    def unscrape(self, *jobs: str, timeout: float = 60) -> None:
        """Scrape ``jobs`` no more, until their series are stale (gone from queries).

        Their targets are taken away first: Prometheus marks the series of a target that
        goes stale, but not those of a job taken out of its configuration (they would
        answer queries for five more minutes)."""
        jobs = tuple(job for job in jobs if job in self.jobs)
        if not jobs:
            return
        for job in jobs:
            self.jobs[job]["static_configs"] = [{"targets": []}]
        self.reload(timeout)
        deadline = time.monotonic() + timeout
        while any(self.query(f'up{{job="{job}"}}') for job in jobs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the series of {jobs} are not stale after {timeout}s")
            time.sleep(0.5)
        for job in jobs:
            del self.jobs[job]
        self.reload(timeout)

    def reload(self, timeout: float = 60) -> None:
        """Write the configuration and have Prometheus read it again (SIGHUP), until it
        runs with it."""
        assert self.process is not None, "not started"
        self.write_config()
        wanted = sorted(c["job_name"] for c in self.config()["scrape_configs"])
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while True:
            with urllib.request.urlopen(f"{self.url}/api/v1/status/config", timeout=10) as r:
                running = yaml.safe_load(json.loads(r.read())["data"]["yaml"])
            if sorted(c["job_name"] for c in running.get("scrape_configs", [])) == wanted:
                return
            if time.monotonic() > deadline:
                tail = (self.log_path.read_text(errors="replace") if self.log_path else "")[-3000:]
                raise RuntimeError(f"prometheus did not load jobs {wanted}; its log ends:\n{tail}")
            time.sleep(0.2)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_for_targets(self, timeout: float = 60, job: str | None = None) -> None:
        """Until every target (of ``job``: one added by ``scrape``) has been scraped
        successfully (Prometheus reads its targets a few seconds after it starts)."""
        job = job or self.job
        targets = (
            self.jobs[job]["static_configs"][0]["targets"] if job in self.jobs else self.targets
        )
        deadline = time.monotonic() + timeout
        while True:
            up = {
                s["metric"].get("instance"): s["value"][1] for s in self.query(f'up{{job="{job}"}}')
            }
            if all(up.get(t) == "1" for t in targets):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus has not scraped {targets} as {job} (up: {up})")
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
