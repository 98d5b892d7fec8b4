"""End-to-end spawn on the local cluster: GPUKubeSpawner beside stock KubeSpawner.

Both hubs run in the same session against the same cluster, alternating, so
machine noise hits both alike. A spawn is timed from the REST POST to the
server being ready (the hub reached the notebook through the pod runner), then
the server is stopped and its pod awaited gone.

Run: python benchmarks/spawn_e2e.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu_dev.demo import reconcile_once
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from jupyterhub_gpu_dev.localcluster.hub import LocalHub

POLICY = {
    "flavors": {"h200": {"kind": "gpu"}},
    "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"lab": {"quota": {"gpus": 4}, "profiles": ["gpu"]}},
}


def spawn_once(hub: LocalHub, user: str, body: dict) -> float:
    started = time.monotonic()
    status, _ = hub.api("POST", f"/users/{user}/server", body)
    assert status in (201, 202), status
    while True:
        _, model = hub.api("GET", f"/users/{user}")
        server = model["servers"].get("")
        if server and server["ready"]:
            elapsed = time.monotonic() - started
            break
        time.sleep(0.05)
    hub.api("DELETE", f"/users/{user}/server")
    while hub.api("GET", f"/users/{user}")[1]["servers"]:
        time.sleep(0.1)
    return elapsed


def main(rounds: int) -> None:
    cluster = LocalCluster.create(name=f"bench-{uuid.uuid4().hex[:6]}")
    hubs = []
    try:
        # the PriorityClasses the policy's pods name, as the service's reconciler makes them
        asyncio.run(reconcile_once(cluster, parse_policy(**POLICY)))
        stock = LocalHub(cluster, users={"ann": ["lab"]}).start()
        gpu = LocalHub(cluster, users={"ann": ["lab"]}, policy=POLICY).start()
        hubs = [stock, gpu]
        times: dict[str, list[float]] = {"stock KubeSpawner": [], "GPUKubeSpawner": []}
        spawn_once(stock, "ann", {})  # warm both: first spawn imports and starts watches
        spawn_once(gpu, "ann", {"profile": "lab--gpu"})
        for _ in range(rounds):
            times["stock KubeSpawner"].append(spawn_once(stock, "ann", {}))
            times["GPUKubeSpawner"].append(spawn_once(gpu, "ann", {"profile": "lab--gpu"}))
        print(f"{rounds} spawns each, alternating, one cluster")
        print("| spawner | median s | mean s | min s | max s |")
        print("|---|---|---|---|---|")
        for name, samples in times.items():
            print(
                f"| {name} | {statistics.median(samples):.2f} | {statistics.mean(samples):.2f} "
                f"| {min(samples):.2f} | {max(samples):.2f} |"
            )
        ratio = statistics.median(times["GPUKubeSpawner"]) / statistics.median(
            times["stock KubeSpawner"]
        )
        print(f"ratio of medians (GPU / stock): {ratio:.3f}")
    finally:
        for hub in hubs:
            hub.stop()
        cluster.down()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    main(parser.parse_args().rounds)
