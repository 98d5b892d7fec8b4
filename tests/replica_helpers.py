"""The GPU service as replicas of its own Deployment, run as local processes against the
local cluster's real API server: their config, their logs, what they wrote.

Each replica is ``python -m jupyterhub_gpu.service`` with ``GPUService.form:
deployment`` and short Lease timings, all sharing one usage database (PostgreSQL, as
a Deployment's replicas must: a sqlite file's lock is held for as long as a suspended
writer is), as the replicas of a Deployment share the site's database.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rbac_helpers import apply_rendered_rbac, token_kubeconfig
from sqlalchemy import create_engine, inspect

from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from jupyterhub_gpu_dev.localcluster.ports import free_port
from kube_helpers import eventually, gpu_server_pod
from test_service_hub import fetch

H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "flavors": {"h200": {"kind": "gpu", "node_selector": H200}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"alpha": {"quota": {"gpus": 8}, "profiles": ["small"]}},
}
#: lease 3 s, renew deadline 2 s, retry 0.4 s; passes every half second
SETTINGS = {
    "form": "deployment",
    "lease_duration": 3.0,
    "lease_renew_deadline": 2.0,
    "lease_retry_period": 0.4,
    "usage_interval": 0.5,
    "rules_interval": 0.5,
    "hub_poll_interval": 2.0,
    "reconcile_interval": 0,
    "metrics_require_auth": False,
    "max_backoff": 2.0,
}
#: the service as its own Deployment's replica beside a real hub (``deployment_replica``):
#: the same Lease timings, passes every second
HUB_SETTINGS = {
    **{
        key: SETTINGS[key]
        for key in (
            "form",
            "lease_duration",
            "lease_renew_deadline",
            "lease_retry_period",
            "max_backoff",
        )
    },
    "usage_interval": 1.0,
    "rules_interval": 1.0,
    "hub_poll_interval": 1.0,
}
#: the service account of the GPU service's own Deployment, and its Lease's name
ACCOUNT = "jupyterhub-gpu-service"
_ACTS = re.compile(r": (\S+) acts as the leader from (\S+)")
_STOPPED = re.compile(r": (\S+) stopped acting as the leader at (\S+):")


def write_config(
    directory: Path, namespace: str, hub_api: str, accounting_url: str, **settings
) -> Path:
    """The hub's config as the replicas read it: the policy, the service's settings."""
    config = directory / "jupyterhub_config.py"
    policy = {**POLICY, "accounting_url": accounting_url}
    config.write_text(
        "c = get_config()  # noqa\n"
        f"c.KubeSpawner.namespace = {namespace!r}\n"
        f"c.GPUPolicy.update({policy!r})\n"
        f"c.GPUService.update({ ({**SETTINGS, **settings})!r})\n"
        f"c.JupyterHub.hub_connect_url = {hub_api!r}\n"
    )
    return config


@dataclass
class Replica:
    """One replica process: ``name`` is its pod's name (``POD_NAME``)."""

    name: str
    config: Path
    kubeconfig: Path
    hub_api: str
    token: str = "replica-token"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.config.parent / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/gpu/"

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "POD_NAME": self.name,
            "JUPYTERHUB_API_URL": self.hub_api,
            "JUPYTERHUB_API_TOKEN": self.token,
            "JUPYTERHUB_SERVICE_NAME": "gpu",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{self.port}",
            "JUPYTERHUB_SERVICE_PREFIX": "/services/gpu/",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub_gpu.service", "--config", str(self.config)],
            cwd=self.config.parent,  # where a relative accounting_url is, as for the hub
            env=env,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def acting_periods(self) -> list[tuple[float, float | None]]:
        """When this replica acted, from its log: (since, until; None: it still does)."""
        periods: list[tuple[float, float | None]] = []
        for line in self.log().splitlines():
            if (m := _ACTS.search(line)) and m.group(1).startswith(self.name):
                periods.append((_epoch(m.group(2)), None))
            elif (m := _STOPPED.search(line)) and m.group(1).startswith(self.name):
                since, _ = periods.pop()
                periods.append((since, _epoch(m.group(2))))
        return periods

    def acting(self) -> bool:
        periods = self.acting_periods()
        return bool(periods) and periods[-1][1] is None

    async def answers(self) -> bool:
        """Whether its web server answers yet."""
        try:
            status, _, _ = await asyncio.to_thread(fetch, self.url + "metrics")
        except OSError:
            return False
        return status == 200

    async def metrics(self) -> str:
        status, _, body = await asyncio.to_thread(fetch, self.url + "metrics")
        assert status == 200, body
        return body


async def deployment_replica(
    hub: LocalHub, core, local_cluster, policy: dict, directory: Path
) -> Replica:
    """The GPU service of ``hub`` (started with ``external_gpu_service``) as its own
    Deployment's one replica: its own account with the RBAC ``manifests`` renders for
    that form (its Lease included), reading the hub's config; started and acting."""
    await apply_rendered_rbac(
        core.api_client,
        parse_policy(**policy),
        hub.namespace,
        accounts=("hub",),
        gpu_service_account=ACCOUNT,
        create_hub_namespace=False,
        lease=ACCOUNT,
    )
    kubeconfig = await token_kubeconfig(
        core.api_client,
        local_cluster.state.kubeconfig,
        hub.namespace,
        ACCOUNT,
        directory / "service.kubeconfig",
    )
    replica = Replica(
        "gpu-service",
        hub.directory / "jupyterhub_config.py",
        kubeconfig,
        f"http://127.0.0.1:{hub.hub_port}/hub/api",
        token=hub.gpu_service_token,
        port=hub.service_port,
    )
    replica.start()
    await wait_acting(replica)
    return replica


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def never_overlap(*replicas: Replica, killed: dict[str, float] | None = None) -> list:
    """Pairs of acting periods of different replicas that overlap (none, when fenced);
    ``killed``: when a replica was killed (its last period ends then at the latest)."""
    now = time.time()
    killed = killed or {}
    periods = [
        (r.name, (since, until if until is not None else killed.get(r.name)))
        for r in replicas
        for since, until in r.acting_periods()
    ]
    clashes = []
    for i, (a, (a0, a1)) in enumerate(periods):
        for b, (b0, b1) in periods[i + 1 :]:
            if a != b and min(a1 or now, b1 or now) > max(a0, b0):
                clashes.append((f"{a} {a0}-{a1}", f"{b} {b0}-{b1}"))
    return clashes


async def wait_acting(replica: Replica, within: float = 60) -> float:
    """Until the replica's log says it acts; when it began (epoch)."""
    await eventually(
        lambda: asyncio.sleep(0, replica.acting()), f"{replica.name} to act", within, 0.1
    )
    return replica.acting_periods()[-1][0]


async def gpu_pod(core, namespace: str, name: str, user: str) -> str:
    """A GPU server pod of ``user`` in group alpha, as the spawner labels one; its uid."""
    body = gpu_server_pod(name, user, "alpha", H200)
    body["metadata"]["annotations"]["hub.jupyter.org/servername"] = name
    pod = await core.create_namespaced_pod(namespace, body)
    return pod.metadata.uid


async def started_at(core, namespace: str, name: str) -> float:
    async def started():
        pod = await core.read_namespaced_pod(name, namespace)
        return pod.status.start_time

    return (await eventually(started, f"pod {name} to start", 60)).timestamp()


async def delete_pod(core, namespace: str, name: str) -> float:
    """Delete now; when (epoch, just before the request)."""
    at = time.time()
    await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return at


def _rows(database: Path | str, query: str, table: str) -> list[tuple]:
    """The rows ``query`` reads from ``table`` of ``database`` (a sqlite file's path or an
    SQLAlchemy URL); none while the table is not created yet."""
    url = database if isinstance(database, str) else f"sqlite:///{database}"
    engine = create_engine(url)
    try:
        if table not in inspect(engine).get_table_names():
            return []
        with engine.connect() as db:
            return [tuple(row) for row in db.exec_driver_sql(query)]
    finally:
        engine.dispose()


def usage_rows(database: Path | str) -> dict[str, list[tuple]]:
    """Each pod's usage rows: (started, ended, last_seen), by the pod's key."""
    result: dict[str, list[tuple]] = {}
    query = "SELECT key, started, ended, last_seen FROM jupyterhub_gpu_usage"
    for key, started, ended, seen in _rows(database, query, "jupyterhub_gpu_usage"):
        result.setdefault(key, []).append((started, ended, seen))
    return result


def stop_rows(database: Path | str) -> dict[str, list[tuple]]:
    """The stops recorded for each pod (by uid): (reason, at)."""
    result: dict[str, list[tuple]] = {}
    query = "SELECT uid, reason, at FROM jupyterhub_gpu_stops"
    for uid, reason, at in _rows(database, query, "jupyterhub_gpu_stops"):
        result.setdefault(uid, []).append((reason, at))
    return result
