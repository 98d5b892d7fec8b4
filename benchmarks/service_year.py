"""The GPU service's pass and start-up at a year of records, before and after.

Method (in-process, stated honestly):

- A usage database (SQLite, in a temporary directory) holds ``--rows`` servers
  spread over the year before ``now`` (written straight with ``executemany``, by
  ``tests/usage_rows.py``): 4 departments with a year's budget, 20 groups with 30
  days' and a per-member budget of 30 days, 2,000 members; a few hundred servers
  still running. 657,000 rows is a year of a 500-GPU cluster, 112,000 two months.
- Start-up: the real ``GPUTime.read`` reads it first, with a heartbeat on the event
  loop (a beat every 10 ms; the longest gap is the worst stall). Before: the copy of
  the previous first read below (rows read in a thread, then indexed and summed on
  the loop), timed on the same database, its loop time being all but the read.
- Pass: what a pass does with the rows it reads (none changed here: the sums are
  the whole cost), on the loop: the real ``GPUTime.compute`` against the previous
  ``compute`` (every record of every group, parent and member summed), 20 passes a
  minute apart each, the median and worst.
- Figures are ratios first: the machine is shared (2 cores, other work running),
  so absolute times move by tens of percent between runs.

Run: python benchmarks/service_year.py [--rows 112000 657000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from loop_helpers import Heartbeat
from usage_rows import fill, year_policy

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.fairshare import read_window
from jupyterhub_gpu.service.gpu_time import GPUTime, hours_view

NOW = 1_800_000_000.0


def previous_compute(gpu_time: GPUTime, now: float) -> tuple[dict, dict]:
    """The pass's sums before: every owner's records summed one by one."""
    running = gpu_time.running
    book, policy = gpu_time.book, gpu_time.policy
    groups = {
        g.name: hours_view(
            book.group_records(g.name), None if g.unlimited else g.budget, now, running
        )
        for g in policy.all_groups
    }
    users = {}
    for (user, group_name), records in book.by_user.items():
        group = policy.find_group(group_name)
        users[(user, group_name)] = hours_view(
            records.values(), group.user_budget if group else None, now, running
        )
    return groups, users


async def previous_first_read(gpu_time: GPUTime, now: float) -> float:
    """The first read before (rows in a thread, indexed on the loop): its loop time."""
    since = now - max(gpu_time.book.horizon, read_window(gpu_time.policy))
    records, _ = await asyncio.to_thread(gpu_time.store.snapshot, since, now)
    began = time.perf_counter()
    gpu_time._take(gpu_time.book, gpu_time.tally, gpu_time.fair, records, now)
    previous_compute(gpu_time, now)
    return time.perf_counter() - began


def fresh(url: str) -> GPUTime:
    state = SimpleNamespace(server_pods={}, server_pods_behind_since=None, dra=None)
    clock = [NOW]
    gpu_time = GPUTime(year_policy(), state, UsageStore(url), clock=lambda: clock[0])
    gpu_time._clock_cell = clock  # type: ignore[attr-defined]
    return gpu_time


async def measure(url: str, rows: int) -> dict[str, float]:
    out: dict[str, float] = {}
    before = fresh(url)
    began = time.perf_counter()
    out["start_before_loop"] = await previous_first_read(before, NOW)
    out["start_before_wall"] = time.perf_counter() - began
    before.store.dispose()

    after = fresh(url)
    with Heartbeat() as beat:
        began = time.perf_counter()
        await after.read()
        out["start_after_wall"] = time.perf_counter() - began
    out["start_after_stall"] = beat.worst
    out["records"] = len(after.book.records)

    old, new = [], []
    for i in range(1, 21):
        now = NOW + 60 * i
        began = time.perf_counter()
        groups, users = previous_compute(after, now)
        old.append(time.perf_counter() - began)
        began = time.perf_counter()
        snapshot = after.compute(now)
        new.append(time.perf_counter() - began)
        for name, view in groups.items():
            got = snapshot.groups[name].used
            assert abs(got - view.used) <= 1e-9 * max(1.0, view.used), (name, got, view.used)
        assert snapshot.users.keys() == users.keys()
    out["pass_before_median"] = statistics.median(old)
    out["pass_before_worst"] = max(old)
    out["pass_after_median"] = statistics.median(new)
    out["pass_after_worst"] = max(new)
    after.store.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[112_000, 657_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for rows in args.rows:
            url = fill(Path(tmp) / f"usage-{rows}.sqlite", rows, NOW)
            r = asyncio.run(measure(url, rows))
            print(f"\n{rows:,} rows ({r['records']:,.0f} in the service's book)")
            print(
                f"  start-up, loop blocked: before {r['start_before_loop']:.2f} s "
                f"(of {r['start_before_wall']:.2f} s), after worst stall "
                f"{r['start_after_stall'] * 1000:.0f} ms (of {r['start_after_wall']:.2f} s); "
                f"{r['start_before_loop'] / r['start_after_stall']:.0f}x less"
            )
            print(
                f"  pass sums on the loop: before median {r['pass_before_median'] * 1000:.1f} ms "
                f"(worst {r['pass_before_worst'] * 1000:.1f}), after median "
                f"{r['pass_after_median'] * 1000:.2f} ms "
                f"(worst {r['pass_after_worst'] * 1000:.2f}); "
                f"{r['pass_before_median'] / r['pass_after_median']:.0f}x less"
            )


if __name__ == "__main__":
    main()
