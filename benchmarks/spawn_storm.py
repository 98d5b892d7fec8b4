"""The 200-spawn storm: answer times and the hub's longest event-loop stall.

A real hub with GPUKubeSpawner on the local cluster; group ``lab`` has room for
10 GPUs. 200 distinct users POST a spawn at once (50 client threads, as the
test does). Each answer is timed from the POST to its HTTP response: 403
(refused with the numbers), 201 (started) or 202 (still pending when the hub's
``slow_spawn_timeout`` answered). Side by side, in the same run and on the same
hub, the same 200 users GET their user model with the same concurrency: the
hub's own floor for 200 concurrent API requests.

An HTTP answer is not always the outcome: a 202 means the spawn goes on. From
before the first POST, the outcome of every spawn is watched (every 0.1 s: which
users have a server pod, which have an active server), so each spawn is timed
to when it was decided: admitted (its pod exists; pods are created only after
admission) or refused. The spawns not admitted get a row of their own: the
5 s target is theirs. Beside GPUKubeSpawner, on a fresh hub with the same
database, the hub's own floor: a spawner that refuses every spawn as soon as
its start() runs, after all of JupyterHub's own per-spawn work.

Inside the hub a timer ticks every 50 ms and logs every tick that came more
than 100 ms late; the longest lateness during the storm is the longest
event-loop stall.

The hub runs with z2jh's default ``concurrentSpawnLimit`` (64): spawns beyond
64 pending are answered 429 at once by JupyterHub itself. ``--concurrent-spawn-limit 0``
lifts it, so every request goes through the policy (as the test does).

Two settings separate the hub's own answer time from artifacts of one small
machine: ``--slow-spawn-timeout S`` (JupyterHub's default 10 s is how long an
admitted spawn's POST waits before its 202, by itself above 5 s) and
``--no-notebook-processes`` (the 10 admitted servers' pods run ``sleep`` so the
pod runner starts no JupyterLab on the hub's two cores; on a real cluster they run
on GPU nodes).

JupyterHub commits to its database several times for every spawn, refused or
not, before any spawner code runs; ``--hub-db sqlite,postgres`` runs the same
storm once per hub database, one after the other on one cluster: sqlite in a
file (z2jh's default ``sqlite-pvc``) and PostgreSQL (z2jh ``hub.db.type:
postgres``), a throwaway server of Debian's ``postgresql`` package on 127.0.0.1
with its durable defaults (``fsync``, ``synchronous_commit``); the hub reaches
it with ``psycopg2`` (``pip install -e '.[benchmarks]'``).

Run: python benchmarks/spawn_storm.py [--hub-db sqlite,postgres]
     [--concurrent-spawn-limit N] [--slow-spawn-timeout S] [--no-notebook-processes]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes_asyncio import client, config

from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu_dev.demo import reconcile_once
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from jupyterhub_gpu_dev.postgres import PostgresMissing, throwaway_postgres

USERS = [f"u{i:03d}" for i in range(200)]
POLICY = {
    "flavors": {"h200": {"kind": "gpu"}},
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"lab": {"quota": {"gpus": 10}, "profiles": ["small"]}},
}

STALL_MONITOR = """
import asyncio, json, time
_stall_log = {path!r}
_last = [time.monotonic()]
def _tick():
    now = time.monotonic()
    late = now - _last[0] - 0.05
    if late > 0.1:
        with open(_stall_log, "a") as f:
            f.write(json.dumps([time.time(), late]) + "\\n")
    _last[0] = now
    asyncio.get_running_loop().call_later(0.05, _tick)
asyncio.get_running_loop().call_later(0.05, _tick)
"""


#: the hub's own floor for a storm of refusals: a spawner that refuses every spawn
#: the moment its start() runs, after all of JupyterHub's own per-spawn work
REFUSE_AT_ONCE = """
from jupyterhub.spawner import Spawner
from tornado import web
class RefuseAtOnce(Spawner):
    async def start(self):
        raise web.HTTPError(403, "refused at once")
    async def stop(self, now=False):
        pass
    async def poll(self):
        return 0
c.JupyterHub.spawner_class = RefuseAtOnce
"""


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def storm(hub: LocalHub, method: str, path: str, body: dict | None):
    """Each user's (HTTP status, seconds to the answer, monotonic start)."""

    def one(user: str):
        started = time.monotonic()
        try:
            status, _ = hub.api(method, path.format(user=user), body)
        except TimeoutError:
            status = "no answer in 30 s"
        return status, time.monotonic() - started, started

    with ThreadPoolExecutor(50) as pool:
        return list(pool.map(one, USERS))


class OutcomeWatcher(threading.Thread):
    """Watches, from before the storm until it is stopped, which users have a server
    pod and which have an active server (GET /users?state=active), every 0.1 s."""

    def __init__(self, hub: LocalHub, cluster: LocalCluster) -> None:
        super().__init__(daemon=True)
        self.hub, self.cluster = hub, cluster
        self.first_pod: dict[str, float] = {}  # user -> when their pod was first seen
        self.snapshots: list[tuple[float, set[str]]] = []  # (when, users with a server)
        self.done = threading.Event()

    def run(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        api = await config.new_client_from_config(str(self.cluster.state.kubeconfig))
        try:
            core = client.CoreV1Api(api)
            while not self.done.is_set():
                pods = await core.list_pod_for_all_namespaces(
                    label_selector="gpu.jupyterhub.org/group"
                )
                seen = time.monotonic()
                for pod in pods.items:
                    self.first_pod.setdefault(pod.metadata.labels["hub.jupyter.org/username"], seen)
                _, active = await asyncio.to_thread(self.hub.api, "GET", "/users?state=active")
                self.snapshots.append((time.monotonic(), {u["name"] for u in active or []}))
                await asyncio.sleep(0.1)
        finally:
            await api.close()

    def outcome(self, user: str, status, elapsed: float, started: float):
        """(outcome, seconds from the POST) once settled, else None. An immediate answer
        (403, 429) is its outcome; a 202 is settled when its pod exists ("admitted":
        pods are created only after admission) or its server is gone ("refused")."""
        if status != 202:
            return str(status), elapsed
        if user in self.first_pod:
            return "admitted", self.first_pod[user] - started
        answered = started + elapsed
        for at, active in list(self.snapshots):
            if at >= answered and user not in active:
                return "refused", at - started
        return None


def decided(watcher: OutcomeWatcher, spawns, within: float = 300) -> list[tuple[str, float]]:
    """Each spawn's outcome and when it was settled, waiting up to ``within`` s."""
    rows = [(user, *row) for user, row in zip(USERS, spawns, strict=True)]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        outcomes = [watcher.outcome(*row) for row in rows]
        if all(outcomes):
            return outcomes
        time.sleep(0.5)
    return [watcher.outcome(*row) or (f"undecided after {within} s", within) for row in rows]


def stalls(log: Path, since: float, until: float) -> list[float]:
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [late for at, late in rows if since <= at <= until]


def report(db: str, name: str, results, stall: list[float] | None = None) -> None:
    times = [row[1] for row in results]
    statuses = Counter(row[0] for row in results)
    print(
        f"| {db} | {name} | {dict(sorted(statuses.items(), key=str))} "
        f"| {statistics.median(times):.2f} | {percentile(times, 0.95):.2f} | {max(times):.2f} "
        f"| {sum(t > 5 for t in times)} "
        f"| {'' if stall is None else f'{max(stall, default=0):.2f}'} |"
    )
    refused = [row[1] for row in results if row[0] == 403]
    if refused:
        print(
            f"|  | refusals (403) of those | {len(refused)} | {statistics.median(refused):.2f} "
            f"| {percentile(refused, 0.95):.2f} | {max(refused):.2f} "
            f"| {sum(t > 5 for t in refused)} |  |"
        )


@contextlib.contextmanager
def hub_database(kind: str) -> Iterator[str]:
    """The hub's ``db_url``: sqlite in the hub's directory, or a throwaway PostgreSQL."""
    if kind == "sqlite":
        yield ""  # LocalHub's own: sqlite in a file in the hub's directory
        return
    if kind != "postgres":
        raise SystemExit(f"--hub-db: expected sqlite or postgres, got {kind!r}")
    try:
        with throwaway_postgres() as url:
            yield url
    except PostgresMissing as e:
        raise SystemExit(f"--hub-db postgres: {e}") from None


async def wait_no_servers(cluster: LocalCluster) -> None:
    """The next hub rebuilds its ledger from pods: the last storm's must be gone."""
    api = await config.new_client_from_config(str(cluster.state.kubeconfig))
    try:
        core = client.CoreV1Api(api)
        for _ in range(600):
            pods = await core.list_pod_for_all_namespaces(label_selector="gpu.jupyterhub.org/group")
            if not pods.items:
                return
            await asyncio.sleep(0.2)
        raise SystemExit(f"{len(pods.items)} server pods still there after 120 s")
    finally:
        await api.close()


def run_storm(
    cluster: LocalCluster,
    db: str,
    db_url: str,
    concurrent_spawn_limit: int,
    slow_spawn_timeout: float,
    notebooks: bool,
    floor: bool,
) -> None:
    """One storm on a fresh hub: GPUKubeSpawner, or (``floor``) the hub's own floor."""
    stall_log = Path(tempfile.mkdtemp()) / "stalls.jsonl"
    hub = LocalHub(
        cluster,
        users={u: ["lab"] for u in USERS},
        policy=POLICY,
        extra_config=(
            (f"c.JupyterHub.db_url = {db_url!r}\n" if db_url else "")
            + f"c.JupyterHub.concurrent_spawn_limit = {concurrent_spawn_limit}\n"
            f"c.JupyterHub.tornado_settings = {{'slow_spawn_timeout': {slow_spawn_timeout}}}\n"
            + ("" if notebooks else "c.KubeSpawner.cmd = ['sleep', 'infinity']\n")
            + "c.KubeSpawner.k8s_api_request_timeout = 30\n"
            "c.KubeSpawner.http_timeout = 240\n"
            "c.KubeSpawner.start_timeout = 300\n"
            + STALL_MONITOR.format(path=str(stall_log))
            + (REFUSE_AT_ONCE if floor else "")
        ),
    ).start()
    what = "hub floor (refuses at once)" if floor else "GPUKubeSpawner"
    try:
        started = time.time()
        if not floor:
            gets = storm(hub, "GET", "/users/{user}", None)
            report(
                db, "GET /users/:name (reference)", gets, stalls(stall_log, started, time.time())
            )
        watcher = OutcomeWatcher(hub, cluster)
        watcher.start()
        between = time.time()
        spawns = storm(hub, "POST", "/users/{user}/server", {"profile": "lab--small"})
        ended = time.time()
        report(db, f"{what}: POST /users/:name/server", spawns, stalls(stall_log, between, ended))
        outcomes = decided(watcher, spawns)
        watcher.done.set()
        watcher.join()
        report(db, f"{what}: each spawn decided (admitted or refused)", outcomes)
        # the 5 s target is for every request not admitted (refused or queued)
        others = [row for row in outcomes if row[0] not in ("201", "admitted")]
        report(db, f"{what}: each spawn not admitted, decided", others)
        admitted = sum(outcome in ("201", "admitted") for outcome, _ in outcomes)
        if admitted != (0 if floor else 10):
            raise SystemExit(f"{what}: {admitted} servers admitted: admission is broken")
    finally:
        for user in USERS:
            hub.api("DELETE", f"/users/{user}/server")
        kept = (
            Path(tempfile.gettempdir()) / f"spawn-storm-hub-{db}-{'floor' if floor else 'gpu'}.log"
        )
        shutil.copy(hub.log_path, kept)
        print(f"|  | (the hub's log: {kept}) |  |  |  |  |  |  |")
        hub.stop()
        asyncio.run(wait_no_servers(cluster))


def main(
    databases: list[str], concurrent_spawn_limit: int, slow_spawn_timeout: float, notebooks: bool
) -> None:
    cluster = LocalCluster.create(name=f"storm-{uuid.uuid4().hex[:6]}")
    try:
        # the PriorityClasses the policy's pods name, as the service's reconciler makes them
        asyncio.run(reconcile_once(cluster, parse_policy(**POLICY)))
        print(
            "200 distinct users, 50 client threads, one hub at a time, group lab with room "
            f"for 10 GPUs, concurrent_spawn_limit {concurrent_spawn_limit}, slow_spawn_timeout "
            f"{slow_spawn_timeout} s, notebook processes {'on' if notebooks else 'off'}"
        )
        print(
            "| hub database | requests | statuses | median s | p95 s | max s | answers > 5 s "
            "| longest loop stall s |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for db in databases:
            # the hub's floor first, then GPUKubeSpawner, each on a fresh database
            for floor in (True, False):
                with hub_database(db) as db_url:
                    run_storm(
                        cluster,
                        db,
                        db_url,
                        concurrent_spawn_limit,
                        slow_spawn_timeout,
                        notebooks,
                        floor,
                    )
    finally:
        cluster.down()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--hub-db",
        default="sqlite",
        help="the hub databases to storm, one after the other: sqlite, postgres or both "
        "(comma-separated)",
    )
    parser.add_argument("--concurrent-spawn-limit", type=int, default=64)
    parser.add_argument("--slow-spawn-timeout", type=float, default=10)
    parser.add_argument("--no-notebook-processes", action="store_true")
    args = parser.parse_args()
    main(
        args.hub_db.split(","),
        args.concurrent_spawn_limit,
        args.slow_spawn_timeout,
        not args.no_notebook_processes,
    )
