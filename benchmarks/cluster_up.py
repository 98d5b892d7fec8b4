"""Warm `cluster up` (binaries already built) to a Ready cluster, and `down`.

Run: python benchmarks/cluster_up.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster


def main(rounds: int) -> None:
    ups, downs = [], []
    for i in range(rounds):
        started = time.monotonic()
        cluster = LocalCluster.create(name=f"bench-up-{i}", progress=lambda _m: None)
        ups.append(time.monotonic() - started)
        started = time.monotonic()
        cluster.down()
        downs.append(time.monotonic() - started)
    print(
        f"{rounds} rounds: up median {statistics.median(ups):.2f}s (max {max(ups):.2f}s), "
        f"down median {statistics.median(downs):.2f}s (max {max(downs):.2f}s)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    main(parser.parse_args().rounds)
