"""The service's ``api/usage`` at scale: 5,000 servers, 500 groups (target: p99 <= 20 ms).

Method (in-process, stated honestly):

- The real ``GPUService`` is initialised from a hub config file holding the
  policy (500 groups), exactly as hub-managed, and its real tornado app serves
  on 127.0.0.1; requests go over real HTTP with a hub token in the
  Authorization header, through ``HubOAuthenticated``.
- Kubernetes is not involved: 5,000 server pods, in the API's JSON form with
  the labels and charge annotation ``shaping.shape`` gives them, are fed through
  the same ``Reflector`` code path a watch's ADDED events take (``_set`` +
  ``on_change``), into the service's state; the same pods, bound to 640
  simulated 8-GPU nodes (``render_nodes``), feed the capacity reflector.
- The hub is not involved: 5,000 hub server models go through the same
  ``servers_from_users`` the hub poller uses. The token's identity is put in
  HubAuth's own cache, which is where every request after the first finds it
  for ``GPUService.auth_cache_max_age`` (set to an hour for the run); the API URL
  points at a closed port, so a cache miss would fail the run instead of being hidden.

Measured side by side in one run (sequential requests, the client in the same
event loop, so client time is included):

1. ``api/usage`` as a member of two groups (the common case);
2. the same with one pod watch event before every request (the ledger and the
   join are rebuilt: the cost under pod churn);
3. ``api/usage`` as an admin (every group, the first 200 of the 5,000 servers),
   then the same with one pod event before every request (every group view
   recomputed and re-encoded);
4. reference: an authenticated handler that writes ``{}`` (HTTP + auth floor);
5. reference: rebuilding the ledger from 5,000 pods per request, in-process,
   no HTTP (what the cached state avoids).

Run: python benchmarks/service_usage.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

GROUPS = 500
SERVERS = 5000
NODES = 640
STARTED = "2026-11-23T08:00:00Z"


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def policy_values() -> dict:
    return {
        "flavors": {
            "h200": {"kind": "gpu"},
            "shared": {"kind": "timeslice", "replicas": 4},
        },
        "profiles": {
            "cpu": {"cpu": 2, "memory": "4Gi"},
            "gpu": {"cpu": 8, "memory": "32Gi", "gpu": {"flavor": "h200"}},
        },
        "everyone": {"profiles": ["cpu"]},
        "groups": {
            f"g{i:03d}": {
                "display_name": f"Group {i}",
                "quota": {"gpus": 10},
                "limit": {"gpus": 20},
                "max_runtime": "8h",
                "profiles": ["gpu", "cpu"],
            }
            for i in range(GROUPS)
        },
    }


def server_pods(policy) -> list[dict]:
    from jupyterhub_gpu.core.admission import IN_QUOTA
    from jupyterhub_gpu.core.selection import select
    from jupyterhub_gpu.core.shaping import shape

    pods = []
    for i in range(SERVERS):
        user, group = f"u{i:04d}", f"g{i % GROUPS:03d}"
        selection = select(policy, [group], {"profile": f"{group}--gpu"})
        pod_shape = shape(policy, selection, IN_QUOTA, username=user)
        pods.append(
            {
                "metadata": {
                    "name": f"jupyter-{user}",
                    "namespace": "jhub",
                    "uid": f"uid-{i}",
                    "creationTimestamp": "2026-11-22T10:00:00Z",
                    "labels": {"component": "singleuser-server", **pod_shape.labels},
                    "annotations": {"hub.jupyter.org/username": user, **pod_shape.annotations},
                },
                "spec": {
                    "nodeName": f"h200-{i // 8}",
                    "containers": [
                        {
                            "name": "notebook",
                            "resources": {
                                "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                                "limits": {"nvidia.com/gpu": "1"},
                            },
                        }
                    ],
                },
                "status": {"phase": "Running", "startTime": STARTED},
            }
        )
    return pods


def month_of_usage(url: str, now: float) -> int:
    """Each of the 5,000 servers' seats used a GPU 2-10 hours a day for the last
    31 days: the rows ``api/showback`` and the dashboard read. Returns the row count."""
    import random

    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.core.budgets import UsageRecord

    rng = random.Random(3)
    store = UsageStore(url)
    rows = 0
    for day in range(31, 0, -1):
        batch = []
        for i in range(SERVERS):
            user, group = f"u{i:04d}", f"g{i % GROUPS:03d}"
            start = now - day * 86400 + rng.uniform(0, 12) * 3600
            end = start + rng.uniform(2, 10) * 3600
            flavor = rng.choice(("h200", "shared"))
            gpus = 1.0 if flavor == "h200" else 0.25
            batch.append(
                UsageRecord(
                    f"d{day}-{i}",
                    f"jhub/old-{user}",
                    user,
                    group,
                    "gpu",
                    flavor,
                    gpus,
                    start,
                    end,
                    end,
                )
            )
        store.open(batch, now)
        rows += len(batch)
    store.dispose()
    return rows


def hub_users() -> list[dict]:
    return [
        {
            "name": f"u{i:04d}",
            "servers": {
                "": {
                    "user_options": {"profile": f"g{i % GROUPS:03d}--gpu"},
                    "started": "2026-11-22T10:00:00.000000Z",
                    "ready": True,
                    "pending": None,
                }
            },
        }
        for i in range(SERVERS)
    ]


def feed(reflector, objects) -> None:
    """What the watch loop does for each ADDED event, after an empty list."""
    from jupyterhub_gpu.kube.reflector import object_key

    reflector.items = {}
    reflector.on_change(reflector)
    for obj in objects:
        reflector._set(object_key(obj), obj)
        reflector.on_change(reflector)


async def main(requests: int) -> None:
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer

    from jupyterhub_gpu.core.admission import Ledger
    from jupyterhub_gpu.service import handlers
    from jupyterhub_gpu.service.app import GPUService
    from jupyterhub_gpu.service.hubapi import servers_from_users
    from jupyterhub_gpu_dev.localcluster.cluster import free_port
    from jupyterhub_gpu_dev.localcluster.nodepools import render_nodes

    directory = Path(tempfile.mkdtemp(prefix="service-bench-"))
    config = directory / "jupyterhub_config.py"
    usage_url = f"sqlite:///{directory / 'usage.sqlite'}"
    config.write_text(
        f"c = get_config()  # noqa\nc.GPUPolicy.update({policy_values()!r})\n"
        f"c.GPUPolicy.accounting_url = {usage_url!r}\n"
    )
    t0 = time.perf_counter()
    rows = month_of_usage(usage_url, time.time())
    wrote = time.perf_counter() - t0
    print(f"usage database: {rows:,} rows (a month of 5,000 servers) in {wrote:.0f}s")
    os.environ.update(
        {
            "JUPYTERHUB_SERVICE_NAME": "gpu",
            "JUPYTERHUB_API_TOKEN": "service-token",
            # a closed port: any call to the hub would fail the run
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",
            "JUPYTERHUB_SERVICE_PREFIX": "/services/gpu/",
        }
    )
    service = GPUService()
    # the run takes longer than the service's default trust in a cached token (30 s)
    service.initialize(
        [
            "--config",
            str(config),
            "--GPUService.namespace=jhub",
            "--GPUService.auth_cache_max_age=3600",
        ]
    )
    policy = service.policy
    state = service.state

    started = time.perf_counter()
    pods = server_pods(policy)
    # the service's own three reflectors, fed as their watches would be
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
    print(
        f"fed {len(pods)} pods, {len(nodes)} nodes, {SERVERS} hub servers "
        f"in {time.perf_counter() - started:.1f}s"
    )

    class Ping(handlers.APIHandler):
        def get(self) -> None:
            self.require_user()
            self.write_json({})

    app = service.make_app()
    app.add_handlers(".*", [("/services/gpu/api/ping", Ping)])
    port = free_port()
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")

    tokens = {"member": "member-token", "admin": "admin-token"}
    models = {
        "member": {
            "kind": "user",
            "name": "u0007",
            "admin": False,
            "groups": ["g007", "g123"],
            "scopes": ["access:services!service=gpu"],
        },
        "admin": {
            "kind": "user",
            "name": "root",
            "admin": True,
            "groups": [],
            "scopes": ["access:services!service=gpu"],
        },
    }
    for who, token in tokens.items():
        key = f"token::{hashlib.sha256(token.encode()).hexdigest()}"
        service.hub_auth.cache[key] = models[who]

    http = AsyncHTTPClient()
    base = f"http://127.0.0.1:{port}/services/gpu/"

    async def timed(path: str, who: str, before=None) -> tuple[list[float], int]:
        samples, size = [], 0
        for _ in range(requests):
            if before:
                before()
            t0 = time.perf_counter()
            response = await http.fetch(
                base + path, headers={"Authorization": f"token {tokens[who]}"}
            )
            samples.append((time.perf_counter() - t0) * 1000)
            size = len(response.body)
        return samples, size

    churn_pod = dict(pods[0])

    def one_watch_event() -> None:
        churn_pod["metadata"] = {**churn_pod["metadata"], "resourceVersion": str(time.time())}
        servers_reflector._set("jhub/jupyter-u0000", churn_pod)
        servers_reflector.on_change(servers_reflector)

    # warm up (first request per path builds the caches)
    await timed("api/usage", "member")
    results = {}
    results["api/usage, member of 2 groups"] = await timed("api/usage", "member")
    results["api/usage, member, one pod event before each"] = await timed(
        "api/usage", "member", one_watch_event
    )
    admin_label = "api/usage, admin (500 groups, 200 of 5,000 servers)"
    results[admin_label] = await timed("api/usage", "admin")
    results["api/usage, admin, one pod event before each"] = await timed(
        "api/usage", "admin", one_watch_event
    )
    month = time.strftime("%Y-%m", time.gmtime())
    showback = f"api/showback?month={month}"
    months = service.gpu_time.months

    def forget_showbacks() -> None:
        # what a pass does when a row of the month changes: nothing kept, nothing rendered
        months.answers.clear()
        months.rendered.clear()

    # the first request of a scope computes it; the rest until the next pass reuse it
    results["api/showback, admin, the month's first request (computed)"] = await timed(
        showback, "admin", forget_showbacks
    )
    await service.gpu_time.record()  # a pass: it computes this month's showback once
    results["api/showback, admin, after a pass (ready until the next)"] = await timed(
        showback, "admin"
    )
    results["api/showback, member of 2 groups, computed each time"] = await timed(
        showback, "member", forget_showbacks
    )
    results["api/showback?format=csv, admin"] = await timed(f"{showback}&format=csv", "admin")
    results["api/history, one group, a day in 5-minute steps"] = await timed(
        "api/history?group=g007&step=5m", "member"
    )
    results["dashboard page, admin (12 charts + showback, computed)"] = await timed(
        "", "admin", forget_showbacks
    )
    await service.gpu_time.record()  # a pass: what every admin request then finds ready
    results["dashboard page, admin (after a pass: showback ready)"] = await timed("", "admin")
    results["dashboard page, member (2 charts + showback)"] = await timed("", "member")
    results["reference: authenticated `{}` (HTTP + auth floor)"] = await timed("api/ping", "member")
    charges = [p.charge for p in state.server_pods.values()]
    rebuild = []
    for _ in range(requests):
        t0 = time.perf_counter()
        Ledger.from_charges(policy, charges)
        rebuild.append((time.perf_counter() - t0) * 1000)
    results["reference: ledger rebuilt from 5,000 pods, no HTTP"] = (rebuild, 0)
    member = json.loads(
        (
            await http.fetch(
                base + "api/usage", headers={"Authorization": f"token {tokens['member']}"}
            )
        ).body
    )
    server.stop()

    print(f"\n{requests} sequential requests each\n")
    print("| request | p50 ms | p99 ms | max ms | response bytes |")
    print("|---|---|---|---|---|")
    for name, (samples, size) in results.items():
        print(
            f"| {name} | {statistics.median(samples):.2f} | {percentile(samples, 99):.2f} "
            f"| {max(samples):.2f} | {size:,} |"
        )
    print(
        f"\nmember sees groups {[g['name'] for g in member['groups']]}, "
        f"{len(member['servers'])} server(s)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    asyncio.run(main(parser.parse_args().requests))
