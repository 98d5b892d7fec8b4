"""A spawn refused by an exhausted GPU-hour budget, at a year of records (target: p99 <= 1 ms).

Scale: one group of 500 members, each of whom used one or two GPUs for 2-10 hours on
every working day of the last year (about 130,000 usage records), 40 of them with a
server running now (in the ledger). The group's budget is used up: its cap is 80 % of
what the window holds, so room returns only after a fifth of the window has left. The
hub's usage book is filled as at a hub start (every record put, then pruned to the
longest budget window); run once with a 30-day budget (the book keeps about 11,000
records) and once with a 365-day budget (all of them).

Timed, first table: when room returns (the book's ``room_returns``, what a refusal's
message needs). Rows:

1. refusals in a row with no record changed: the book's kept sums for the group;
2. a refusal after one of the group's servers stopped (its record closes and is added
   to the kept sums);
3. a refusal after a closed record of the group was rewritten: the group's records are
   summed again, one sort (the cost of the first refusal after a hub start, too);
4. ``room_returns`` alone, on the same records (the sweep without the book).

Second table: the whole refusal, ``budget_refusal`` with the ledger (what the group
used in its window, when room returns, the message), as it is and as it was before
``UsageBook.used`` read the kept sums (a copy below: a sum over every record of the
owner, reused within a second while no record changed), the two taken in turn at the
same moments on the same book (which goes first alternates), and their answers
compared: refusals within one second, 1.5 s apart, after a server stopped, after a
closed record changed.

Beside it, in the same run: the first version of ``room_returns`` (a pass over every
record for every moment a record leaves the window, quadratic), copied below, on
smaller groups (it would take hours at 130,000 records), with the sweep on the same
records; both must give the same answer.

Run: python benchmarks/budget_refusal.py [--members N] [--refusals N] [--running N]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import time
from dataclasses import replace

from policy_path import percentile

DAY = 86400.0
HOUR = 3600.0


def quadratic_room_returns(records, budget, now, running=()):
    """``room_returns`` as first written: every moment, weighed over every record."""
    period = float(budget.period)
    spans = [
        (r.started, r.end(now, running), r.gpus)
        for r in records
        if r.end(now, running) > now - period
    ]
    if not spans:
        return None
    cap = float(budget.gpu_hours)

    def used_at(t):
        since = t - period
        return sum(g * (e - max(s, since)) for s, e, g in spans if e > since) / HOUR

    for moment in sorted({e + period for _, e, _ in spans}):
        free = cap - used_at(moment)
        if free > 1e-9:
            return math.ceil(moment / 60) * 60.0, free
    return None


def summed_book_class():
    from jupyterhub_gpu.core.budgets import UsageBook

    class SummedBook(UsageBook):
        """The usage book as ``budget_refusal`` read it before (a copy of the first
        ``UsageBook.used``): every record of the owner summed, the sum reused for up to
        a second while no record changed. Anything else is the book's own."""

        def __init__(self, horizon: float = 0.0) -> None:
            super().__init__(horizon)
            self.sums: dict = {}
            self.version = 0

        def put(self, policy, record) -> None:
            self.version += 1
            super().put(policy, record)

        def end(self, key, at):
            self.version += 1
            return super().end(key, at)

        def used(self, group, member, period, now, running=()):
            key = ((group, member), period)
            cached = self.sums.get(key)
            if cached is not None and cached[0] == self.version and 0 <= now - cached[1] < 1.0:
                return cached[2]
            records = (
                self.group_records(group) if member is None else self.user_records(member, group)
            )
            since = now - period
            total = 0.0
            for r in records:
                end = r.ended
                if end is None:
                    end = now if r.key in running else max(r.last_seen, r.started)
                elif end > now:
                    end = now
                start = r.started if r.started > since else since
                if end > start:
                    total += r.gpus * (end - start)
            value = total / HOUR
            if len(self.sums) > 100_000:
                self.sums.clear()
            self.sums[key] = (self.version, now, value)
            return value

    return SummedBook


def build_policy(members: int, days: int, cap: float):
    from jupyterhub_gpu.core.model import parse_policy

    return parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"gpu": {"cpu": 8, "memory": "32Gi", "gpu": {"flavor": "h200", "count": 1}}},
        groups={
            "lab": {
                "quota": {"gpus": 2 * members},
                "budget": {"gpu_hours": cap, "period": f"{days}d"},
                "profiles": ["gpu"],
            }
        },
    )


def a_year_of_sessions(members: int, running: int, now: float):
    """Each member's session on every working day of the last year; ``running`` of them
    have a server running now (open records)."""
    from jupyterhub_gpu.core.budgets import UsageRecord

    rng = random.Random(5)
    records = []
    for day in range(365, 0, -1):
        midnight = (now // DAY - day) * DAY
        if (midnight // DAY + 3) % 7 >= 5:  # 1970-01-01 was a Thursday: skip weekends
            continue
        for m in range(members):
            start = midnight + rng.uniform(7, 12) * HOUR
            end = start + rng.uniform(2, 10) * HOUR
            records.append(
                UsageRecord(
                    f"d{day}-m{m}",
                    f"lab/jupyter-user{m}",
                    f"user{m}",
                    "lab",
                    "gpu",
                    "h200",
                    float(rng.choice((1, 2))),
                    start,
                    end,
                    end,
                )
            )
    for m in range(running):
        start = now - rng.uniform(1, 8) * HOUR
        records.append(
            UsageRecord(
                f"now-m{m}",
                f"lab/jupyter-user{m}-now",
                f"user{m}",
                "lab",
                "gpu",
                "h200",
                1.0,
                start,
                now - 30.0,
            )
        )
    return records


def window_hours(records, days: int, now: float) -> float:
    from jupyterhub_gpu.core.budgets import gpu_hours

    return gpu_hours(records, now - days * DAY, now, {r.key for r in records if r.ended is None})


def ms_row(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"| {name} | {statistics.median(ms):.3f} | {percentile(ms, 99):.3f} | {max(ms):.3f} |"


def scenario(members: int, days: int, refusals: int, running: int, changes: int) -> None:
    from jupyterhub_gpu.core.admission import Ledger
    from jupyterhub_gpu.core.budgets import UsageBook, room_returns
    from jupyterhub_gpu.core.selection import select

    start = time.time()
    records = a_year_of_sessions(members, running, start)
    cap = round(0.8 * window_hours(records, days, start))
    policy = build_policy(members, days, cap)
    group = policy.groups["lab"]
    budget = group.budget
    assert budget is not None
    ledger = Ledger()
    gpu = select(policy, ["lab"], {"profile": "lab--gpu"}).request
    for r in records:
        if r.ended is None:
            ledger.admit(policy, r.key, r.user, group, gpu)
    servers = len(ledger.charges)
    book = UsageBook.for_policy(policy)
    t0 = time.perf_counter()
    for r in records:
        book.put(policy, r)
    book.prune(policy, start)
    filled = time.perf_counter() - t0
    held = len(book.group_records("lab"))
    clock = iter(start + 1.5 * i for i in itertools.count())  # refusals 1.5 s apart

    def when(now: float) -> float:
        t0 = time.perf_counter()
        answer = book.room_returns("lab", None, budget, now, ledger.charges)
        elapsed = time.perf_counter() - t0
        assert answer is not None
        assert answer[0] > now
        return elapsed

    first = when(next(clock))  # the first refusal sums the group's records: one sweep
    kept = [when(next(clock)) for _ in range(refusals)]
    # a server stops, then the next refusal
    stopped = []
    for key in [r.key for r in book.group_records("lab") if r.ended is None][:changes]:
        now = next(clock)
        book.end(key, now)
        ledger.release(policy, key)
        stopped.append(when(now))
    # a closed record rewritten (its end moves a second), then the next refusal
    rewritten = []
    for r in [r for r in book.group_records("lab") if r.ended is not None][-changes:]:
        book.put(policy, replace(r, ended=r.ended + 1.0))
        rewritten.append(when(next(clock)))
    # the sweep alone, without the book
    alone = []
    view = list(book.group_records("lab"))
    for _ in range(changes):
        now = next(clock)
        t0 = time.perf_counter()
        answer = room_returns(view, budget, now, ledger.charges)
        alone.append(time.perf_counter() - t0)
        from_book = book.room_returns("lab", None, budget, now, ledger.charges)
        # the same moment; the room summed in another order, equal to rounding
        assert answer is not None
        assert from_book is not None
        assert answer[0] == from_book[0]
        assert abs(answer[1] - from_book[1]) < 1e-6
    print(
        f"\n{members} members, {len(records):,} records in a year, {servers} servers running; "
        f"a {days}-day budget of {cap:,} GPU-hours (80 % of its window), used up; the book "
        f"holds {held:,} records (filled in {filled:.1f} s)"
    )
    print("| per refusal | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    print(ms_row(f"when room returns, no record changed ({refusals}, 1.5 s apart)", kept))
    print(ms_row(f"when room returns, after a server stopped ({len(stopped)})", stopped))
    print(
        ms_row(
            f"when room returns, after a closed record changed: one sweep ({changes}, "
            f"and the first: {first * 1000:.1f} ms)",
            rewritten,
        )
    )
    print(ms_row(f"room_returns alone, without the book: one sweep ({changes})", alone))
    whole_refusals(policy, book, group, ledger, clock, refusals, changes)


def whole_refusals(policy, book, group, ledger, clock, refusals: int, changes: int) -> None:
    """The whole refusal as it is and as it was, in turn at the same moments, each on a
    book of its own holding the same records and given the same changes."""
    from jupyterhub_gpu.core.budgets import budget_refusal, budgets_of

    before = summed_book_class()(book.horizon)
    for r in book.records.values():
        before.put(policy, replace(r))
    turn = itertools.count()

    def both(now: float, old: list, new: list) -> None:
        order = [(before, old), (book, new)]
        if next(turn) % 2:
            order.reverse()
        for which, samples in order:
            c0 = time.thread_time()
            t0 = time.perf_counter()
            reason = budget_refusal(policy, which, "user7", group, 1.0, now, ledger)
            samples.append((time.perf_counter() - t0, time.thread_time() - c0))
            assert reason is not None
            assert "free again by" in reason, reason
        # the same numbers (summed in another order: equal to rounding); the sum reused
        # within a second may be that much behind the running servers' use
        (was,) = budgets_of(policy, before, "user7", group, now, ledger.charges)
        (now_used,) = budgets_of(policy, book, "user7", group, now, ledger.charges)
        behind = len(ledger.charges) / HOUR  # a second of every running server
        assert -1e-6 <= now_used.used - was.used <= behind + 1e-6, (now_used.used, was.used)

    rows = []
    old: list = []
    new: list = []
    # each book's first refusal sums the group's records once (the last row's cost)
    both(next(clock), [], [])
    now = next(clock)
    for _ in range(refusals):
        both(now, old, new)
    rows.append((f"within one second ({refusals})", old, new))
    old, new = [], []
    for _ in range(max(changes, refusals // 10)):
        both(next(clock), old, new)
    rows.append((f"1.5 s apart ({len(old)})", old, new))
    old, new = [], []
    for key in [r.key for r in book.group_records("lab") if r.ended is None][:changes]:
        now = next(clock)
        book.end(key, now)
        before.end(key, now)
        ledger.release(policy, key)
        both(now, old, new)
    rows.append((f"after a server stopped ({len(old)})", old, new))
    old, new = [], []
    for r in [r for r in book.group_records("lab") if r.ended is not None][-changes:]:
        book.put(policy, replace(r, ended=r.ended + 1.0))
        before.put(policy, replace(r, ended=r.ended + 1.0))
        both(next(clock), old, new)
    rows.append((f"after a closed record changed: one sweep ({len(old)})", old, new))
    print()
    # wall time, and the thread's CPU time (the wall time less any wait for a core)
    print(
        "| whole refusal | before: p50 ms | p99 ms | max ms | p99 CPU ms | now: p50 ms | p99 ms "
        "| max ms | p99 CPU ms | p99 before / now |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, old, new in rows:
        a = [wall * 1000 for wall, _ in old]
        b = [wall * 1000 for wall, _ in new]
        a_cpu = percentile([cpu * 1000 for _, cpu in old], 99)
        b_cpu = percentile([cpu * 1000 for _, cpu in new], 99)
        print(
            f"| {name} | {statistics.median(a):.3f} | {percentile(a, 99):.3f} | {max(a):.3f} "
            f"| {a_cpu:.3f} | {statistics.median(b):.3f} | {percentile(b, 99):.3f} "
            f"| {max(b):.3f} | {b_cpu:.3f} | {percentile(a, 99) / percentile(b, 99):,.1f} |"
        )


def side_by_side(members_list: list[int], days: int, repeats: int) -> None:
    """The quadratic first version against the sweep, on the same smaller groups."""
    from jupyterhub_gpu.core.budgets import room_returns
    from jupyterhub_gpu.core.model import Budget

    print(f"\nthe first version and the sweep, same records, a {days}-day budget:")
    print("| members | records in the window | first version ms | sweep ms | ratio |")
    print("|---|---|---|---|---|")
    for members in members_list:
        now = time.time()
        records = [
            r
            for r in a_year_of_sessions(members, max(1, members // 12), now)
            if r.end(now) > now - days * DAY or r.ended is None
        ]
        running = {r.key for r in records if r.ended is None}
        cap = round(0.8 * window_hours(records, days, now))
        budget = Budget(gpu_hours=cap, period=int(days * DAY))
        old, new = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            expected = quadratic_room_returns(records, budget, now, running)
            old.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            answer = room_returns(records, budget, now, running)
            new.append(time.perf_counter() - t0)
            assert answer == expected, (answer, expected)
        a, b = statistics.median(old) * 1000, statistics.median(new) * 1000
        print(f"| {members} | {len(records):,} | {a:,.1f} | {b:.2f} | {a / b:,.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=500)
    parser.add_argument("--refusals", type=int, default=2000)
    parser.add_argument("--running", type=int, default=40)
    parser.add_argument(
        "--changes", type=int, default=20, help="refusals timed after each kind of change"
    )
    parser.add_argument(
        "--quadratic-members",
        type=int,
        nargs="*",
        default=[25, 50, 100, 150],
        help="group sizes for the first version (about 2 s at 3,000 records, growing as n²)",
    )
    args = parser.parse_args()
    for days in (30, 365):
        scenario(args.members, days, args.refusals, args.running, args.changes)
    side_by_side(args.quadratic_members, 30, 3)
