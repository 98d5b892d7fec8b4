"""A reconcile pass with nothing to change, over 500 groups (target: no write, <= 2 s).

Starts its own local cluster, installs the scheduler's CRDs from the pinned Go
module, reconciles a policy of ``--groups`` groups (namespace per group; one
parent per ten groups) once to create everything, then times ``--rounds``
no-change passes and checks each made zero writes and left every
resourceVersion as it was.

Run: python benchmarks/reconcile.py [--groups 500] [--rounds 5] [--scheduler kueue]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from jupyterhub_gpu.core.manifests import desired_objects
from jupyterhub_gpu.core.model import Policy, parse_policy
from jupyterhub_gpu.kube.reconciler import KINDS, Reconciler
from jupyterhub_gpu_dev.localcluster import crds
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster

HUB = "jhub"


def big_policy(groups: int, scheduler: str) -> Policy:
    spec: dict[str, dict] = {}
    parents = max(1, groups // 10)
    for i in range(parents):
        spec[f"dept-{i}"] = {"quota": {"gpus": 90, "cpu": 900, "memory": "4Ti"}}
    for i in range(groups - parents):
        spec[f"team-{i}"] = {
            "parent": f"dept-{i % parents}",
            "quota": {"gpus": 8, "cpu": 64, "memory": "256Gi", "servers": 20},
            "limit": {"gpus": 12},
            "profiles": ["gpu", "mig", "cpu"],
        }
    return parse_policy(
        scheduler={"name": scheduler},
        flavors={
            "a100": {"kind": "gpu"},
            "mig": {"kind": "mig", "profile": "1g.5gb"},
            "shared": {"kind": "timeslice", "replicas": 4},
        },
        profiles={
            "cpu": {"cpu": 1, "memory": "2Gi"},
            "gpu": {"cpu": 8, "memory": "32Gi", "gpu": {"flavor": "a100"}},
            "mig": {"cpu": 2, "memory": "8Gi", "gpu": {"flavor": "mig"}},
        },
        everyone={"profiles": ["cpu"]},
        groups=spec,
        namespace_per_group=True,
        namespace_prefix="bench-",
    )


async def versions(reconciler: Reconciler) -> dict[tuple, str]:
    found = {}
    for kind in KINDS:
        try:
            items = await reconciler._list(kind)
        except Exception:  # a kind whose CRD is not installed holds nothing
            continue
        for item in items:
            meta = item["metadata"]
            found[(kind.api_version, kind.kind, meta.get("namespace"), meta["name"])] = meta[
                "resourceVersion"
            ]
    return found


async def run(cluster: LocalCluster, groups: int, rounds: int, scheduler: str) -> None:
    policy = big_policy(groups, scheduler)
    objects = len(desired_objects(policy, HUB))
    async with cluster.api() as api:
        if scheduler in ("kai", "volcano", "kueue"):
            await crds.install(api, scheduler)
        reconciler = Reconciler(api, HUB)
        started = time.monotonic()
        first = await reconciler.reconcile(policy)
        create_s = time.monotonic() - started
        assert first.ok, first.summary()
        print(
            f"{groups} groups, scheduler {scheduler}: {objects} objects, "
            f"first pass created {len(first.created)} in {create_s:.1f}s"
        )
        # let the controllers finish their own first writes (quota status) before
        # resourceVersions are compared: only the reconciler's writes are measured
        before = await versions(reconciler)
        for _ in range(60):
            await asyncio.sleep(1)
            settled = await versions(reconciler)
            if settled == before:
                break
            before = settled
        assert len(before) == objects, (len(before), objects)
        times = []
        for _ in range(rounds):
            started = time.monotonic()
            report = await reconciler.reconcile(policy)
            times.append(time.monotonic() - started)
            assert report.writes == 0, report.summary()
            assert report.unchanged == objects, report.summary()
        after = await versions(reconciler)
        changed = sorted(k for k in before if after.get(k) != before[k])
        assert not changed, f"resourceVersion changed: {changed[:5]} ({len(changed)})"
        print(
            f"no-change pass over {objects} objects: median {statistics.median(times):.3f}s, "
            f"max {max(times):.3f}s over {rounds} rounds; writes 0; resourceVersions unchanged"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--scheduler", default="kueue", choices=["default", "kai", "volcano", "kueue"]
    )
    args = parser.parse_args()
    cluster = LocalCluster.create(name="bench-reconcile", progress=lambda _m: None)
    try:
        asyncio.run(run(cluster, args.groups, args.rounds, args.scheduler))
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
