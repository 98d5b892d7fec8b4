"""Fair share counting billed units, against counting GPU-hours, at a year of a 500-GPU
cluster's records: what the hub and the service do with the fair-share book, for
this tree and ``--against``'s (before) side by side in one run.

Method (in-process, stated honestly):

- Records as ``tests/usage_rows.py`` writes them (``--rows`` a year, 657,000 a
  year of a 500-GPU cluster; 20 groups under 4 departments, 2,000 members), spread
  over three flavors (H200, A100, a MIG slice), plus ``--running`` servers still
  running. Fair share reads ten half-lives (70 days at 7d): ~126,000 of them.
- Each configuration runs in a process of its own: before (``git archive`` of
  ``--against``; GPU-hours, the only count it has) and this tree with ``count:
  gpu_hours``, ``billed_units`` with one rate per flavor, and ``billed_units`` with
  the H200's and the A100's rate changed in the middle of the window (every record
  across the change integrated in two parts).
- Measured: filling the book with the window's records (the hub's and the
  service's first read, off the event loop); the top level's usage, which
  integrates every running server (on the hub's loop, once per ``TOTALS_KEPT``);
  a spawn's order key (its groups' and member's usage, on the hub's loop); the
  service pass's standings now and a day ago (``fair_share_snapshot``, on the
  pass's thread). The usages must agree between before and ``gpu_hours``.

Run: python benchmarks/fair_share_count.py --against <revision> [--rows 657000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOW = 1_801_224_000.0
DAY = 86400.0
YEAR = 365 * DAY
DEPARTMENTS, GROUPS_PER_DEPARTMENT, USERS = 4, 5, 2000
CONFIGS = ("before", "gpu_hours", "billed_units", "billed_units_changed")


def policy_values(config: str) -> dict:
    groups: dict = {}
    for d in range(DEPARTMENTS):
        groups[f"dept{d}"] = {"quota": {"gpus": 256}}
        for g in range(GROUPS_PER_DEPARTMENT):
            groups[f"lab{d}-{g}"] = {
                "parent": f"dept{d}",
                "quota": {"gpus": 64},
                "profiles": ["gpu"],
            }
    flavors: dict = {
        "h200": {"kind": "gpu"},
        "a100": {"kind": "gpu"},
        "mig": {"kind": "mig", "profile": "1g.10gb"},
    }
    fair: dict = {"half_life": "7d", "max_wait": "30m"}
    if config.startswith("billed_units"):
        fair["count"] = "billed_units"
        flavors["h200"]["billing"] = {"weight": 3}
        flavors["a100"]["billing"] = {"weight": 1.5}
        flavors["mig"]["billing"] = {"weight": 0.25}
        if config == "billed_units_changed":
            # a change 35 days before NOW: the middle of the 70 days read
            flavors["h200"]["billing"] = [{"weight": 3}, {"from": "2026-12-25", "weight": 4}]
            flavors["a100"]["billing"] = [{"weight": 1.5}, {"from": "2026-12-25", "weight": 1}]
    elif config == "gpu_hours":
        fair["count"] = "gpu_hours"
    return {
        "flavors": flavors,
        "profiles": {"gpu": {"gpu": {"flavor": "a100"}}},
        "fair_share": fair,
        "groups": groups,
    }


def measure(config: str, rows: int, running: int) -> dict:
    """One configuration, in this process (its ``jupyterhub_gpu`` on ``sys.path``)."""
    from jupyterhub_gpu.core.fairshare import FairShareBook, read_window
    from jupyterhub_gpu.core.model import parse_policy
    from jupyterhub_gpu.core.usage import UsageRecord
    from jupyterhub_gpu.service.fair_share import fair_share_snapshot

    policy = parse_policy(**policy_values(config))
    rng = random.Random(1)
    labs = [f"lab{d}-{g}" for d in range(DEPARTMENTS) for g in range(GROUPS_PER_DEPARTMENT)]
    since = NOW - read_window(policy)
    records = []
    for i in range(rows):
        user = rng.randrange(USERS)
        started = NOW - YEAR + (i + rng.random()) * (YEAR / rows)
        length = rng.expovariate(1 / (8 * 3600))
        flavor = rng.choice(("h200", "a100", "a100", "mig"))
        gpus = 1 / 7 if flavor == "mig" else float(rng.choice((1, 1, 2, 4, 8)))
        ended = started + length
        if ended < since or ended > NOW - 60:
            continue  # as the first read: only the window; the running ones below
        records.append(
            UsageRecord(
                f"uid-{i}", f"ns/s{i}", f"u{user}", labs[user % len(labs)], "gpu", flavor,
                gpus, started, ended, ended,
            )
        )  # fmt: skip
    keys = set()
    for i in range(running):
        user = rng.randrange(USERS)
        started = NOW - rng.uniform(0, 3 * DAY)
        flavor = rng.choice(("h200", "a100", "a100", "mig"))
        key = f"ns/run{i}"
        keys.add(key)
        records.append(
            UsageRecord(
                f"run-{i}", key, f"u{user}", labs[user % len(labs)], "gpu", flavor,
                1.0, started, NOW - 30, None,
            )
        )  # fmt: skip
    running_keys = frozenset(keys)

    book = FairShareBook(policy)
    began = time.perf_counter()
    for r in records:
        book.put(r)
    book.settle(NOW)
    fill_ms = (time.perf_counter() - began) * 1000

    def timed(fn, repeat: int) -> list[float]:
        out = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1000)
        return out

    def top_level() -> float:
        book._totals.clear()  # what TOTALS_KEPT keeps: worked out afresh each time
        return book.siblings_usage(None, NOW, running_keys)

    top = timed(top_level, 30)
    users = [(f"u{u}", labs[u % len(labs)]) for u in range(0, USERS, 7)]

    def order_keys() -> None:
        for user, group in users:
            book.order_key(user, group, NOW, running_keys)

    keys_ms = [ms / len(users) for ms in timed(order_keys, 5)]
    recent = [r for r in records if r.end(NOW, running_keys) > NOW - DAY]
    snap = timed(lambda: fair_share_snapshot(policy, book, recent, NOW, running_keys), 5)
    return {
        "config": config,
        "records": len(records),
        "fill_ms": fill_ms,
        "top_level_ms": statistics.median(top),
        "order_key_ms": statistics.median(keys_ms),
        "snapshot_ms": statistics.median(snap),
        "usage": {g: book.group_usage(g, NOW, running_keys) for g in ("dept0", "lab1-2")},
    }


def run(config: str, rows: int, running: int, tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, __file__, "--one", config, "--rows", str(rows), "--running", str(running)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", default="main")
    parser.add_argument("--rows", type=int, default=657_000)
    parser.add_argument("--running", type=int, default=5_000)
    parser.add_argument("--one", choices=CONFIGS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.rows, args.running)))
        return
    with tempfile.TemporaryDirectory() as before:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.against, "jupyterhub_gpu"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        results = [
            run(c, args.rows, args.running, Path(before) if c == "before" else ROOT)
            for c in CONFIGS
        ]
    base = results[0]
    for a, b in zip(base["usage"].values(), results[1]["usage"].values(), strict=True):
        assert abs(a - b) <= 1e-9 * max(abs(a), 1.0), (base["usage"], results[1]["usage"])
    print(f"{base['records']} records in the window ({args.running} running)\n")
    print("| count | fill the book ms | top level ms | order key ms | service standings ms |")
    print("|---|---|---|---|---|")
    for r in results:
        cells = [
            f"{r[k]:.1f} ({r[k] / base[k]:.2f}x)" if k != "order_key_ms" else
            f"{r[k]:.4f} ({r[k] / base[k]:.2f}x)"
            for k in ("fill_ms", "top_level_ms", "order_key_ms", "snapshot_ms")
        ]  # fmt: skip
        print(f"| {r['config']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
