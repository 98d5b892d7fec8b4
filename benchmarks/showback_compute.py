"""``api/showback``'s work per request, before and after the month tally, side by side.

Method: usage at 5,000 servers (each server's seat used a GPU, a whole H200 or a
quarter of a time-sliced one, 2-10 hours a day; the same seed as
``service_usage.py``) plus 5,000 running servers, half of them with a measured
utilisation, for two books: a month (the last 31 days: 160,000 records) and
``--days`` (365 by default: 1.8 million records, what the service keeps with a
year-long budget). For each, the current month is answered, alternating run by
run so both see the same machine load:

* before: what the service did before the tally for a month not computed yet:
  every record it keeps, listed and summed (``showback``);
* after: the tally (``ShowbackTally``), built once from the same records: the
  ended rows' sums kept, the running servers summed per request.

Each run times the sums, the admin's JSON view rendered and encoded
(``showback_json`` + ``json.dumps``) and the admin's CSV; "request" is the sums
plus the JSON, the service's work for ``api/showback`` less tornado's (a few
milliseconds: ``service_usage.py``), in wall time and in the CPU time it took
(what is left of it without the machine's other processes). The two answers' JSON must agree to the
4 decimals it shows (the sums are added in another order). The tally's one-off
cost (putting every record, at the service's start) and a pass's (5,000 sightings
and 100 ends) are timed too.

Utilisation is each session's (a pod's life, by its record's uid): the rows above
measure half the running servers; the rows "with every session's utilisation"
add what the service does for a month whose every session has DCGM samples: the
month's sessions listed (``sessions_of`` over the records, or the tally's
``sessions``), each one's mean from a reading per day (``Chunks.mean``), and the
sums with all of them measured.

Run: python benchmarks/showback_compute.py [--repeat 30] [--days 365]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SERVERS, GROUPS = 5000, 500


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


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(samples), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def agree(a, b) -> bool:
    """The same JSON, numbers to the 4 decimals shown (one unit apart at most)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(agree(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(agree, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1.5e-4
    return a == b


def scenario(days: int, repeat: int) -> None:
    from jupyterhub_gpu.core.showback import month_bounds, sessions_of, showback
    from jupyterhub_gpu.core.showback_tally import ShowbackTally
    from jupyterhub_gpu.service.time_views import showback_csv, showback_json
    from jupyterhub_gpu.service.views import Viewer

    now = time.time()
    month = time.strftime("%Y-%m", time.gmtime(now))
    since, until = month_bounds(month)
    until = min(until, now)
    usage = records(now, days)
    book = {r.uid: r for r in usage}  # what the service kept: ``UsageBook.records``
    running = {f"jhub/jupyter-u{i:04d}": True for i in range(SERVERS)}
    # each measured session's mean utilisation, by its record's uid: half the running
    busy = {f"r-{i}": 50.0 for i in range(0, SERVERS, 2)}
    admin = Viewer(name="root", admin=True)

    gc.collect()
    t0 = time.perf_counter()
    tally = ShowbackTally()
    for r in usage:
        tally.put(r, now)
    built = time.perf_counter() - t0
    # a pass: every running server seen again, 100 servers ended
    changed = [replace(r, last_seen=now) for r in usage[-SERVERS:]]
    t0 = time.perf_counter()
    for r in changed:
        tally.put(r, now)
    for r in changed[:100]:
        tally.put(replace(r, ended=now), now)
    for r in usage[-SERVERS:]:
        tally.put(r, now)  # as they were, for the comparison
    passed = time.perf_counter() - t0

    # a member's: one group's records (the service's index by group), or the tally's
    mine = {"g001"}
    member = Viewer(name="u0001", groups=frozenset(mine))
    own = [r for r in usage if r.group in mine]

    def before():
        return showback(list(book.values()), since, until, now, running, busy)

    def after():
        return tally.showback(month, now, running, busy)

    def before_member():
        return showback(own, since, until, now, running, busy)

    def after_member():
        return tally.showback(month, now, running, busy, mine)

    chunks = day_readings(usage, since, until, now)

    def before_utilised():
        month = [r for r in book.values() if r.end(now, running) > since]
        sessions = sessions_of(month, since, until, now, running)
        means, _ = chunks.mean(since, until, [UTIL], sessions)
        return showback(list(book.values()), since, until, now, running, means), len(means), 0.0

    # the service's tally with every session's utilisation (a second one: the first
    # measures half the running servers, as before)
    measuring = ShowbackTally()
    for r in usage:
        measuring.put(r, now)

    def after_utilised():
        # the service's pass: the sessions not final listed (on the event loop), made
        # and measured (on a thread), those final now summed for good (all of the
        # month's ended ones at the first pass), then the month's showback
        loop = time.perf_counter()
        records = measuring.unmeasured(month, now)
        loop -= time.perf_counter()
        sessions = sessions_of(records, since, until, now, running)
        means, coverage = chunks.mean(since, until, [UTIL], sessions)
        loop += time.perf_counter()
        final = coverage.final
        measuring.finalise(month, ((uid, means.get(uid), sessions[uid][2]) for uid in final))
        result = measuring.showback(
            month, now, running, {k: v for k, v in means.items() if k not in final}
        )
        loop = time.perf_counter() - loop
        return result, len(means), loop

    times: dict[tuple[str, str], list[float]] = {}
    views = {}
    first_utilised: tuple[float, int, float] | None = None
    #: of the requests with every session's utilisation, the part on the event loop
    loops: list[float] = []
    for _ in range(repeat):
        for label, compute in (("before", before), ("after", after)):
            c0, t0 = time.thread_time(), time.perf_counter()
            result = compute()
            t1 = time.perf_counter()
            body = json.dumps(showback_json(month, result, admin, True, None, {}))
            c2, t2 = time.thread_time(), time.perf_counter()
            showback_csv(month, result, admin, True, None)
            t3 = time.perf_counter()
            for what, seconds in (
                ("sums", t1 - t0),
                ("JSON", t2 - t1),
                ("request: sums + JSON", t2 - t0),
                # this thread's CPU time: the wall time less the waits for a CPU the
                # machine's other processes held
                ("request, CPU time", c2 - c0),
                ("sums + CSV", (t1 - t0) + (t3 - t2)),
            ):
                times.setdefault((label, what), []).append(seconds * 1000)
            views[(label,)] = body
        for label, compute in (("before", before_member), ("after", after_member)):
            t0 = time.perf_counter()
            body = json.dumps(showback_json(month, compute(), member, False, mine, {}))
            times.setdefault((label, "a member's request"), []).append(
                (time.perf_counter() - t0) * 1000
            )
            views[(label, "member")] = body
        for label, compute in (("before", before_utilised), ("after", after_utilised)):
            t0 = time.perf_counter()
            result, measured, loop = compute()
            body = json.dumps(showback_json(month, result, admin, True, None, {}))
            took = (time.perf_counter() - t0) * 1000
            if label == "after" and first_utilised is None:
                first_utilised = (took, measured, loop * 1000)  # every ended one made final
            else:
                times.setdefault((label, "request with every session's utilisation"), []).append(
                    took
                )
                if label == "after":
                    loops.append(loop * 1000)
            views[(label, "utilised")] = body
    same = all(
        agree(json.loads(views[("before", *k)]), json.loads(views[("after", *k)]))
        for k in ((), ("member",), ("utilised",))
    )
    print(
        f"\n{len(usage):,} records ({days} days), this month's showback, {repeat} runs "
        f"each, alternating; answers agree: {same}; tally built in {built:.1f} s, "
        f"a pass's puts {passed * 1000:.1f} ms; with every session's utilisation, "
        f"the first request measured {first_utilised[1]:,} sessions in "
        f"{first_utilised[0]:.0f} ms ({first_utilised[2]:.0f} ms of it on the event loop), "
        f"the later ones {measured:,}, of their time on the event loop (not the "
        f"sessions made and measured, nor the JSON) p50 {statistics.median(loops):.1f} ms, "
        f"p99 {summary(loops)[1]:.1f} ms\n"
    )
    print("| step | before p50 ms | p99 ms | after p50 ms | p99 ms | ratio p50 |")
    print("|---|---|---|---|---|---|")
    for what in (
        "sums",
        "JSON",
        "request: sums + JSON",
        "request, CPU time",
        "sums + CSV",
        "a member's request",
        "request with every session's utilisation",
    ):
        b50, b99 = summary(times[("before", what)])
        a50, a99 = summary(times[("after", what)])
        print(f"| {what} | {b50:.1f} | {b99:.1f} | {a50:.1f} | {a99:.1f} | {b50 / a50:.1f}x |")
    if not same:
        raise SystemExit("the two answers differ")


UTIL = "DCGM_FI_DEV_GPU_UTIL"


def day_readings(usage, since: float, until: float, now: float):
    """Chunks holding a reading per day of the month: every pod that ran that day at
    50 % (a minute's samples per hour it ran), as Prometheus gives them."""
    from jupyterhub_gpu.core.utilisation import Chunks, Reading

    chunks = Chunks()
    spans = chunks.spans(since, until)
    sums: list[dict[str, float]] = [{} for _ in spans]
    counts: list[dict[str, float]] = [{} for _ in spans]
    for r in usage:
        end = min(r.end(now, {r.key}), until)
        for i, (start, stop) in enumerate(spans):
            seconds = min(end, stop) - max(r.started, start)
            if seconds > 0:
                samples = seconds / 60
                counts[i][r.key] = counts[i].get(r.key, 0.0) + samples
                sums[i][r.key] = sums[i].get(r.key, 0.0) + 50.0 * samples
    for (start, stop), s, c in zip(spans, sums, counts, strict=True):
        chunks.put(Reading(start, stop, {UTIL: s}, {UTIL: c}, stop - start, now))
    return chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--days", type=int, default=365, help="the longer book (0: none)")
    args = parser.parse_args()
    scenario(31, args.repeat)
    if args.days:
        # before sums every record of the year at each run: fewer runs
        scenario(args.days, max(args.repeat // 3, 5))


if __name__ == "__main__":
    main()
