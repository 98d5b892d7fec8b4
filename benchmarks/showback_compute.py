"""``api/showback``'s computation, this tree's against an earlier commit's, side by side.

Method: a month of usage at 5,000 servers (each server's seat used a GPU, a whole
H200 or a quarter of a time-sliced one, 2-10 hours a day for the last 31 days:
155,000 records, the same seed as ``service_usage.py``) plus 5,000 running
servers, half of them with a measured utilisation. For each of the two
versions of ``core/showback.py`` and ``service/time_views.py`` (this tree's, and
``--against`` a commit's, loaded from git) it times, in alternation so both see the
same machine load:

1. ``showback``: the month's sums from the records (what a pass, or a request
   for a month not computed yet, does);
2. the admin's JSON view, rendered and encoded (``showback_json`` + ``json.dumps``);
3. the admin's CSV.

It checks the two versions' JSON and CSV are the same, byte for byte, and, with
``--year``, times this tree's ``showback`` over a year of records (1.8 million:
what the service's book holds with a year-long budget) for the current month.

Run: python benchmarks/showback_compute.py [--against HEAD] [--repeat 30] [--year]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SERVERS, GROUPS = 5000, 500


def load(path: str, revision: str | None, name: str):
    """A module of the package at ``revision`` (None: this tree), as a sibling."""
    package = path.rpartition("/")[0].replace("/", ".")
    if revision is None:
        return importlib.import_module(path[: -len(".py")].replace("/", "."))
    source = subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(f"{package}.{name}", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    sys.modules[spec.name] = module
    exec(compile(source, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def records(now: float, days: int):
    from jupyterhub_gpu.core.budgets import UsageRecord

    rng = random.Random(3)
    found = []
    for day in range(days, 0, -1):
        for i in range(SERVERS):
            user, group = f"u{i:04d}", f"g{i % GROUPS:03d}"
            start = now - day * 86400 + rng.uniform(0, 12) * 3600
            end = start + rng.uniform(2, 10) * 3600
            flavor = rng.choice(("h200", "shared"))
            gpus = 1.0 if flavor == "h200" else 0.25
            key = f"jhub/jupyter-{user}-{day}"
            found.append(
                UsageRecord(f"{day}-{i}", key, user, group, "gpu", flavor, gpus, start, end, end)
            )
    for i in range(SERVERS):
        user, group = f"u{i:04d}", f"g{i % GROUPS:03d}"
        key = f"jhub/jupyter-{user}"
        found.append(
            UsageRecord(f"r-{i}", key, user, group, "gpu", "h200", 1.0, now - 3600, now, None)
        )
    return found


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{statistics.median(samples):.1f} | {p99:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the commit to compare with")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--year", action="store_true", help="also a year of records")
    args = parser.parse_args()

    from jupyterhub_gpu.core.showback import month_bounds
    from jupyterhub_gpu.service.views import Viewer

    now = time.time()
    month = time.strftime("%Y-%m", time.gmtime(now))
    since, until = month_bounds(month)
    until = min(until, now)
    usage = records(now, 31)
    running = {f"jhub/jupyter-u{i:04d}": True for i in range(SERVERS)}
    busy = {f"jhub/jupyter-u{i:04d}": 50.0 for i in range(0, SERVERS, 2)}
    admin = Viewer(name="root", admin=True)
    versions = {}
    for label, revision in (("before", args.against), ("after", None)):
        versions[label] = (
            load("jupyterhub_gpu/core/showback.py", revision, f"showback_{label}"),
            load("jupyterhub_gpu/service/time_views.py", revision, f"time_views_{label}"),
        )
    times: dict[tuple[str, str], list[float]] = {}
    outputs: dict[str, tuple[str, str]] = {}
    for _ in range(args.repeat):
        for label, (core, views) in versions.items():
            t0 = time.perf_counter()
            result = core.showback(usage, since, until, now, running, busy)
            t1 = time.perf_counter()
            body = json.dumps(views.showback_json(month, result, admin, True, None, {}))
            t2 = time.perf_counter()
            table = views.showback_csv(month, result, admin, True, None)
            t3 = time.perf_counter()
            for what, ms in (("showback", t1 - t0), ("json", t2 - t1), ("csv", t3 - t2)):
                times.setdefault((label, what), []).append(ms * 1000)
            times.setdefault((label, "showback + json"), []).append((t2 - t0) * 1000)
            # this tree adds the utilisation's coverage (a key, a last column): the rest
            # must be the same
            view = json.loads(body)
            view.pop("utilised_coverage", None)
            columns = [",".join(line.split(",")[:7]) for line in table.splitlines()]
            outputs[label] = (json.dumps(view), columns)
    same = outputs["before"] == outputs["after"]
    print(
        f"\n{len(usage):,} records, {args.repeat} runs each, alternating; "
        f"outputs identical: {same}\n"
    )
    print(f"| step | before ({args.against}) p50 ms | p99 ms | after p50 ms | p99 ms | ratio p50 |")
    print("|---|---|---|---|---|---|")
    for what in ("showback", "json", "showback + json", "csv"):
        before, after = times[("before", what)], times[("after", what)]
        ratio = statistics.median(before) / statistics.median(after)
        print(f"| {what} | {summary(before)} | {summary(after)} | {ratio:.2f}x |")
    if args.year:
        core = versions["after"][0]
        year = records(now, 365)
        samples = []
        for _ in range(max(args.repeat // 5, 3)):
            t0 = time.perf_counter()
            core.showback(year, since, until, now, running, busy)
            samples.append((time.perf_counter() - t0) * 1000)
        print(f"\na year of records ({len(year):,}), this month's showback: {summary(samples)} ms")
    if not same:
        raise SystemExit("the two versions' answers differ")


if __name__ == "__main__":
    main()
