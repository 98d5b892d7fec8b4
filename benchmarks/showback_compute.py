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
sessions not final yet), each one's mean from a reading per day (``Chunks.mean``),
and the sums with all of them measured (the service's steps, one after the other).

Last, those requests on an event loop: after, through the service's own
``ShowbackMonths`` (its steps on the pass's threads, the executors set as the
service sets them), every callback the loop runs timed and a heartbeat beating
every 10 ms (``loop_timing.py``); before, the time of the steps the service ran on
its loop until then (the list of sessions to measure, the sessions made final and
the sums), on another tally built from the same records. The first request after a
tally is built makes every ended session of the month final; a later one follows
a pass (``ShowbackMonths.take``).

Run: python benchmarks/showback_compute.py [--repeat 30] [--days 365]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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

from answers import agree  # noqa: E402

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


def scenario(days: int, repeat: int) -> None:
    from jupyterhub_gpu.core.showback import month_bounds, sessions_of, showback
    from jupyterhub_gpu.core.showback_tally import ShowbackTally
    from jupyterhub_gpu.service.showback_months import tallied_answer, unmeasured_sessions
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
        # the service's steps, one after the other (each on a thread in the service):
        # the sessions not final made, measured, those final now summed for good (all
        # of the month's ended ones at the first request), then the month's showback
        sessions = unmeasured_sessions(measuring, month, since, until, now, running)
        means, coverage = chunks.mean(since, until, [UTIL], sessions)
        result = tallied_answer(measuring, month, now, running, sessions, means, coverage)
        # the coverage aside (``showback`` summed afresh has none), the same answer
        return dataclasses.replace(result, coverage=None), len(means), 0.0

    times: dict[tuple[str, str], list[float]] = {}
    views = {}
    first_utilised: tuple[float, int, float] | None = None
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
        f"{first_utilised[0]:.0f} ms, the later ones {measured:,}\n"
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
    asyncio.run(on_the_loop(usage, month, now, running, chunks, repeat))


def previous_division(tally, month: str, now: float, running, chunks) -> tuple[object, float]:
    """A request with every session's utilisation as the service divided it before:
    the list of sessions to measure, the sessions made final and the sums on the event
    loop (timed: the answer and that time), making the sessions and their means on a
    thread (not timed)."""
    from jupyterhub_gpu.core.showback import month_bounds, sessions_of

    since, until = month_bounds(month)
    until = min(until, now)
    loop = time.perf_counter()
    records = tally.unmeasured(month, now)
    loop -= time.perf_counter()
    sessions = sessions_of(records, since, until, now, running)
    means, coverage = chunks.mean(since, until, [UTIL], sessions)
    loop += time.perf_counter()
    final = coverage.final
    tally.finalise(month, ((uid, means.get(uid), sessions[uid][2]) for uid in final))
    result = tally.showback(month, now, running, {k: v for k, v in means.items() if k not in final})
    return dataclasses.replace(result, coverage=coverage), time.perf_counter() - loop


async def on_the_loop(usage, month: str, now: float, running, chunks, repeat: int) -> None:
    """The same requests through the service's ``ShowbackMonths`` (its steps on the
    pass's threads, the executors set as the service sets them), timed on the event
    loop with a heartbeat, against the previous division's time on the loop."""
    from concurrent.futures import ThreadPoolExecutor

    from loop_timing import LoopTimer

    from jupyterhub_gpu.core.model import parse_policy
    from jupyterhub_gpu.core.showback_tally import ShowbackTally
    from jupyterhub_gpu.service.readers import enforcement_first
    from jupyterhub_gpu.service.showback_months import ShowbackMonths
    from jupyterhub_gpu.service.time_views import showback_json
    from jupyterhub_gpu.service.utilisation import UtilisationReader
    from jupyterhub_gpu.service.views import Viewer

    enforcement_first(asyncio.get_running_loop(), ThreadPoolExecutor(max_workers=4))
    timer = LoopTimer()
    tallies = []
    for _ in range(2):
        tally = ShowbackTally()
        for r in usage:
            tally.put(r, now)
        tallies.append(tally)
    before_tally, after_tally = tallies
    kept = now - 400 * 86400.0

    async def no_records(*_):
        raise AssertionError("a month of the tally's was read from the database")

    months = ShowbackMonths(
        parse_policy(flavors={"h200": {"kind": "gpu"}, "shared": {"kind": "gpu"}}),
        "UTC",
        lambda: now,
        lambda: running,
        no_records,
        lambda groups: True,
        lambda group: {group},
        now - kept,
        # every day of the month read already (``day_readings``): Prometheus is not asked
        UtilisationReader(None, chunks, lambda: now),  # type: ignore[arg-type]
    )
    months.replace(after_tally)
    answers = {}

    async def request():
        answers["after"] = await months.showback(month, None)

    first_before = previous_division(before_tally, month, now, running, chunks)
    answers["before"] = first_before[0]
    first_after = await timer.window(request())
    later_before, later_after = [], []
    for _ in range(repeat):
        answers["before"], took = previous_division(before_tally, month, now, running, chunks)
        later_before.append(took)
        months.take([], now, kept)  # a pass: the month's answer worked out anew
        later_after.append(await timer.window(request()))
    admin = Viewer(name="root", admin=True)
    same = agree(
        *(
            json.loads(json.dumps(showback_json(month, answers[k], admin, True, None, {})))
            for k in ("before", "after")
        )
    )
    print(
        f"\nWith every session's utilisation, on the event loop: before, the steps the "
        f"service ran on it; after, the service's ShowbackMonths (answers agree: {same})\n"
    )
    print(
        "| request | before: on the loop ms | after: loop ms | loop CPU ms | "
        "longest callback ms | heartbeat gap ms | loop time, before / after |"
    )
    print("|---|---|---|---|---|---|---|")
    w = first_after
    print(
        f"| the first after the tally is built | {first_before[1] * 1000:.0f} | "
        f"{w['loop'] * 1000:.1f} | {w['cpu'] * 1000:.1f} | {w['callback'] * 1000:.1f} | "
        f"{w['gap'] * 1000:.1f} | {first_before[1] / w['loop']:.0f}x |"
    )
    b50, b99 = summary([t * 1000 for t in later_before])
    cells = []
    for what in ("loop", "cpu", "callback", "gap"):
        p50, p99 = summary([w[what] * 1000 for w in later_after])
        cells.append(f"{p50:.1f} / {p99:.1f}")
    ratio = b50 / summary([w["loop"] * 1000 for w in later_after])[0]
    cells.append(f"{ratio:.0f}x (p50)")
    print(f"| later ones, p50 / p99 | {b50:.1f} / {b99:.1f} | " + " | ".join(cells) + " |")
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
