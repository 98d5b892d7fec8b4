"""One server's own answer, ``api/servers/<user>/<name>``, at 5,000 servers (target: p99 <= 10 ms).

What a server's JupyterLab asks every few seconds: its GPU, budgets (the group's
and the user's own), the group's quota use, the scheduled stops, its notices and
last stop. Method (in-process, as ``service_usage.py``):

- The real ``GPUService`` initialised from a hub config file (500 groups, each
  with a 30-day group budget and a 7-day per-user budget), its usage database a
  sqlite file holding a year of usage: each of the 5,000 servers' seats used a
  GPU 2-10 hours every day (1,825,000 rows); the GPU-time pass reads the budget
  windows from it, as at a service start.
- 5,000 server pods fed through the server-pod reflector's ADDED path, 5,000 hub
  servers through ``servers_from_users``; every server has a notice and 500 have
  a last stop.
- Timed, side by side in one run, for random servers: the whole handler path
  over real HTTP (the server's own token, its identity in HubAuth's cache:
  scope check, the answer, JSON), and the answer + JSON in-process; each with
  the pod found by the index (``ServiceState.pod_of``, now) and by the pass
  over every server pod the first version made (before).

Run: python benchmarks/server_status.py [--requests N] [--days D]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from service_usage import (
    GROUPS,
    NODES,
    SERVERS,
    feed,
    hub_users,
    percentile,
    policy_values,
    server_pods,
)


def budgeted_policy() -> dict:
    values = policy_values()
    for group in values["groups"].values():
        group["budget"] = {"gpu_hours": 100000, "period": "30d"}
        group["per_user"] = {"budget": {"gpu_hours": 2000, "period": "7d"}}
    return values


def year_of_usage(url: str, now: float, days: int) -> int:
    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.core.budgets import UsageRecord

    rng = random.Random(5)
    store = UsageStore(url)
    rows = 0
    for day in range(days, 0, -1):
        batch = []
        for i in range(SERVERS):
            user, group = f"u{i:04d}", f"g{i % GROUPS:03d}"
            start = now - day * 86400 + rng.uniform(0, 12) * 3600
            end = start + rng.uniform(2, 10) * 3600
            batch.append(
                UsageRecord(
                    f"d{day}-{i}",
                    f"jhub/old-{user}",
                    user,
                    group,
                    "gpu",
                    "h200",
                    1.0,
                    start,
                    end,
                    end,
                )
            )
        store.open(batch, now)
        rows += len(batch)
    store.dispose()
    return rows


def pass_over_every_pod(state):
    """How the first version found a server's pod: a pass over every server pod."""

    def pod_of(user: str, name: str):
        return next(
            (
                p
                for p in (state.server_pods or {}).values()
                if p.user == user and p.servername == name and p.charge is not None
            ),
            None,
        )

    return pod_of


async def main(requests: int, days: int) -> None:
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer

    from jupyterhub_gpu.service.app import GPUService
    from jupyterhub_gpu.service.hubapi import servers_from_users
    from jupyterhub_gpu.service.views import Notice
    from jupyterhub_gpu_dev.localcluster.cluster import free_port
    from jupyterhub_gpu_dev.localcluster.nodepools import render_nodes

    directory = Path(tempfile.mkdtemp(prefix="server-status-bench-"))
    config = directory / "jupyterhub_config.py"
    usage_url = f"sqlite:///{directory / 'usage.sqlite'}"
    config.write_text(
        f"c = get_config()  # noqa\nc.GPUPolicy.update({budgeted_policy()!r})\n"
        f"c.GPUPolicy.accounting_url = {usage_url!r}\n"
    )
    t0 = time.perf_counter()
    rows = year_of_usage(usage_url, time.time(), days)
    print(
        f"usage database: {rows:,} rows ({days} days of 5,000 servers) "
        f"in {time.perf_counter() - t0:.0f}s"
    )
    os.environ.update(
        {
            "JUPYTERHUB_SERVICE_NAME": "gpu",
            "JUPYTERHUB_API_TOKEN": "service-token",
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",
            "JUPYTERHUB_SERVICE_PREFIX": "/services/gpu/",
        }
    )
    service = GPUService()
    service.initialize(
        [
            "--config",
            str(config),
            "--GPUService.namespace=jhub",
            "--GPUService.auth_cache_max_age=3600",
        ]
    )
    state = service.state
    # every notice is logged: 5,000 of them are not what the run is about
    logging.getLogger("jupyterhub_gpu.service").setLevel(logging.ERROR)
    pods = server_pods(service.policy)
    servers_reflector, nodes_reflector, bound_reflector = service.make_reflectors(None)
    gpu = {"product": "NVIDIA-H200-NVL", "memory": 143771, "count": 8}
    nodes = render_nodes(
        {"node_pools": {"h200": {"count": NODES, "cpu": 64, "memory": "512Gi", "gpu": gpu}}}
    )
    for reflector, objects in (
        (servers_reflector, pods),
        (nodes_reflector, nodes),
        (bound_reflector, pods),
    ):
        feed(reflector, objects)
    state.set_servers(servers_from_users(hub_users()))
    t0 = time.perf_counter()
    print(f"GPU time pass: {await service.gpu_time.record()} in {time.perf_counter() - t0:.1f}s")
    now = datetime.now(UTC)
    for i in range(SERVERS):
        state.notice(
            Notice(
                at=now, text=f"u{i:04d}'s server is idle", user=f"u{i:04d}", server="", kind="idle"
            )
        )
    for i in range(0, SERVERS, 10):
        service.server_events.stopping(f"u{i:04d}", "", "idle", None)
        service.server_events.stopped(f"u{i:04d}", "")
    await service.server_events.run()  # written, as the task does

    app = service.make_app()
    port = free_port()
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")
    rng = random.Random(7)
    users = [f"u{rng.randrange(SERVERS):04d}" for _ in range(requests)]
    tokens = {}
    for user in set(users):
        token = f"server-token-{user}"
        tokens[user] = token
        key = f"token::{hashlib.sha256(token.encode()).hexdigest()}"
        service.hub_auth.cache[key] = {
            "kind": "user",
            "name": user,
            "admin": False,
            "groups": [],
            "scopes": [
                f"access:servers!server={user}/",
                f"users:activity!user={user}",
                "access:services!service=gpu",
            ],
        }
    http = AsyncHTTPClient()
    base = f"http://127.0.0.1:{port}/services/gpu/api/servers/"
    index = state.pod_of
    before = pass_over_every_pod(state)

    lookups = {"now: the index": index, "before: a pass over every pod": before}
    http_samples: dict[str, list[float]] = {label: [] for label in lookups}
    local_samples: dict[str, list[float]] = {label: [] for label in lookups}
    sizes: dict[str, int] = {}

    async def one(user: str, label: str) -> None:
        state.pod_of = lookups[label]
        t0 = time.perf_counter()
        response = await http.fetch(
            base + user + "/", headers={"Authorization": f"token {tokens[user]}"}
        )
        http_samples[label].append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        json.dumps(service.server_status(user, ""))
        local_samples[label].append((time.perf_counter() - t0) * 1000)
        sizes[label] = len(response.body)

    for user in users[:50]:  # warm up
        await one(user, "now: the index")
    for samples in (*http_samples.values(), *local_samples.values()):
        samples.clear()
    # interleaved, so both see the same machine load
    for user in users:
        for label in lookups:
            await one(user, label)
    state.pod_of = index
    results = {}
    for label in lookups:
        results[f"HTTP, whole handler ({label})"] = (http_samples[label], sizes[label])
        results[f"in-process, answer + JSON ({label})"] = (local_samples[label], sizes[label])
    answer = service.server_status(users[0], "")
    server.stop()
    print(f"\n{requests} sequential requests each, random servers of 5,000\n")
    print("| path | p50 ms | p99 ms | max ms | response bytes |")
    print("|---|---|---|---|---|")
    for name, (samples, size) in results.items():
        print(
            f"| {name} | {statistics.median(samples):.3f} | {percentile(samples, 99):.3f} "
            f"| {max(samples):.3f} | {size:,} |"
        )
    print(
        f"\n{users[0]}: group {answer['group']['name']}, {len(answer['budgets'])} budgets "
        f"(used {[b['used_gpu_hours'] for b in answer['budgets']]}), "
        f"{len(answer['stops'])} stop(s), {len(answer['notices'])} notice(s), "
        f"last stop {answer['last_stop'] and answer['last_stop']['reason']}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.days))
