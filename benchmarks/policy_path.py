"""Policy work in the spawn path at scale, beside stock KubeSpawner (target: p99 <= 1 ms).

Scale (the target's): 100,000 users, 5,000 groups, 5,000 running servers charged in
the ledger, and a year of GPU usage records: each of the 5,000 servers' seats used
a GPU for 2-10 hours every day, 1.8 million rows in a sqlite usage database, of which
the hub holds the rows its budget windows reach (30 days).
Every group offers two interfaces (a choice in its entries) and mounts two datasets.
Per spawn, the policy does: the user's profile list (offers + entries with live
quota, the budgets left and the datasets), server-side validation of user_options (select), and
admission (the budget check of the group, its parents and the user, then the quota
check and reservation; released again so the ledger stays at 5,000).

With fair share on (``fair_share: {half_life: 7d, max_wait: 30m}``, the same spawns
again): the hub also reads ten half-lives of rows (70 days) into its fair-share book,
and each spawn adds the user's and group's standing to its GPU entries and joins a
line of 20 waiting servers (``--waiting``), as every spawn does in the hub: its
standing is worked out and its place found, then it leaves. Twice, side by side: the
line kept in order (``core.line.Line``, the hub's: the newcomer filed by bisection;
every standing worked out again once a second off the spawn path, timed apart), and
the line as the hub kept it before, sorted and walked at each join with every
standing worked out again once a second, in a spawn. The waiters are in random
groups, or with ``--course`` all in one group, waiting for it (a course asking at
once): every newcomer then has the line ahead.

Beside it, in the same process and run: stock KubeSpawner's own handling of a
static profile list of the same size (10,000 profiles: 5,000 groups x 2), i.e.
``_get_initialized_profile_list`` + ``_validate_user_options`` +
``_get_profile`` — the work KubeSpawner does for every spawn with a static
``profile_list``.

Run: python benchmarks/policy_path.py [--spawns N] [--users N] [--groups N] [--servers N]
[--days N] [--waiting N] [--course]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import time


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def build_policy(groups: int, budgets: bool = True, fair_share: bool = False):
    from jupyterhub_gpu.core.model import parse_policy

    return parse_policy(
        fair_share={"half_life": "7d", "max_wait": "30m"} if fair_share else None,
        flavors={
            "h200": {"kind": "gpu"},
            "shared": {"kind": "timeslice", "replicas": 4},
            "mig": {"kind": "mig", "profile": "1g.5gb"},
        },
        profiles={
            "cpu": {"cpu": 2, "memory": "4Gi"},
            "gpu": {
                "cpu": 8,
                "memory": "32Gi",
                "gpu": {"flavor": "h200"},
                "options": {
                    "gpus": {"choices": [1, 2, 4]},
                    "flavor": {"choices": ["h200", "shared", "mig"]},
                },
            },
        },
        everyone={"profiles": ["cpu"]},
        # what a server opens and mounts: two interfaces (a choice in every GPU entry)
        # and a dataset of every group's own beside one they all share
        interfaces={
            "lab": {"display_name": "JupyterLab", "url": "/lab"},
            "vscode": {"display_name": "VS Code", "url": "/vscode/"},
        },
        datasets={
            "shared": {"nfs": {"server": "nfs", "path": "/shared"}, "mount_path": "/data/shared"},
            **{
                f"d{i:04d}": {"claim": f"data-{i}", "mount_path": f"/data/g{i:04d}"}
                for i in range(groups)
            },
        },
        groups={
            f"g{i:04d}": {
                "interfaces": ["lab", "vscode"],
                "datasets": ["shared", f"d{i:04d}"],
                "quota": {"gpus": 40, "cpu": 400},
                "limit": {"gpus": 60},
                "per_user": {
                    "servers": 3,
                    "gpus": 4,
                    **({"budget": {"gpu_hours": 2000, "period": "7d"}} if budgets else {}),
                },
                **({"budget": {"gpu_hours": 100_000, "period": "30d"}} if budgets else {}),
                "profiles": ["gpu", "cpu"],
            }
            for i in range(groups)
        },
    )


def kubespawner_static_list(groups: int) -> list[dict]:
    """The same offer as a static KubeSpawner profile_list (no per-group filtering)."""
    profiles = []
    for i in range(groups):
        for name in ("gpu", "cpu"):
            entry = {
                "display_name": f"g{i:04d}: {name}",
                "slug": f"g{i:04d}--{name}",
                "kubespawner_override": {"cpu_guarantee": 8},
            }
            if name == "gpu":
                entry["profile_options"] = {
                    "gpus": {
                        "display_name": "GPUs",
                        "choices": {c: {"display_name": c} for c in "124"},
                    },
                    "flavor": {
                        "display_name": "GPU type",
                        "choices": {c: {"display_name": c} for c in ("h200", "shared", "mig")},
                    },
                }
            profiles.append(entry)
    return profiles


def year_of_usage(path: str, policy, membership: dict, servers: int, days: int, now: float):
    """Write ``days`` of daily GPU sessions of ``servers`` seats into a usage database;
    returns the store and how long writing took."""
    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.core.budgets import UsageRecord

    store = UsageStore(f"sqlite:///{path}")
    rng = random.Random(11)
    names = list(membership)
    batch: list[UsageRecord] = []
    t0 = time.perf_counter()
    for day in range(days, 0, -1):
        for seat in range(servers):
            user = names[seat % len(names)]
            start = now - day * 86400 + rng.uniform(0, 12) * 3600
            end = start + rng.uniform(2, 10) * 3600
            batch.append(
                UsageRecord(
                    f"d{day}-s{seat}",
                    f"ns/jupyter-{user}",
                    user,
                    membership[user][0],
                    "gpu",
                    "h200",
                    float(rng.choice((1, 2))),
                    start,
                    end,
                    end,
                )
            )
        if len(batch) >= 50_000:
            store.open(batch, now)
            batch = []
    store.open(batch, now)
    return store, time.perf_counter() - t0


async def main(
    spawns: int,
    stock_spawns: int,
    users: int,
    groups: int,
    servers: int,
    days: int,
    waiting: int = 20,
    course: bool = False,
) -> None:
    import tempfile

    from jupyterhub_gpu.core.admission import Ledger
    from jupyterhub_gpu.core.budgets import budget_refusal, budgets_of
    from jupyterhub_gpu.core.fairshare import Waiter, standing_line
    from jupyterhub_gpu.core.profiles import profile_entry
    from jupyterhub_gpu.core.selection import offers, select
    from jupyterhub_gpu.hub.admission import ORDER_KEPT, SpawnAdmission
    from jupyterhub_gpu.hub.offline import _unreachable_cluster

    rng = random.Random(7)
    policy = build_policy(groups, budgets=days > 0)
    membership = {
        f"user{u:06d}": rng.sample(sorted(policy.groups), rng.choice((1, 1, 2, 3)))
        for u in range(users)
    }
    # with fair share, a second hub's policy
    fair_policy = build_policy(groups, budgets=days > 0, fair_share=True)
    # 5,000 running servers in the ledger; both hubs have had the same spawns, so what
    # each keeps of its policy's offers is as warm as the other's
    ledger = Ledger()
    names = list(membership)
    for s in range(servers):
        user = names[s % users]
        options = {"profile": f"{membership[user][0]}--cpu"}
        selection = select(policy, membership[user], options)
        select(fair_policy, membership[user], options)
        ledger.admit(policy, f"ns/running-{s}", user, selection.group, selection.request)
    assert len(ledger.charges) == servers

    # the hub's usage book, read from a year of records as the hub reads it at start;
    # with fair share, the second hub's, which also keeps the decayed usage
    admission = SpawnAdmission.empty_cluster()
    admission.ledger = ledger
    fair_admission = SpawnAdmission.empty_cluster()
    fair_admission.ledger = ledger
    loaded = 0
    if days:
        now = time.time()
        with tempfile.TemporaryDirectory() as folder:
            store, wrote = year_of_usage(
                f"{folder}/usage.sqlite", policy, membership, servers, days, now
            )
            for hub, hub_policy, what in (
                (admission, policy, "its 30-day window"),
                (fair_admission, fair_policy, "with fair share: 70 days read"),
            ):
                hub.use_store(store, fail_open=False)
                t0 = time.perf_counter()
                await hub.read_usage(hub_policy)
                read = time.perf_counter() - t0
                print(
                    f"usage: the hub's first read took {read:.1f} s and holds "
                    f"{len(hub.usage.records):,} rows ({what})"
                )
            store.dispose()
        loaded = len(admission.usage.records)
        print(f"usage: {days * servers:,} rows written in {wrote:.0f} s")
    # 20 servers waiting, in random groups (or all in the course's), each waiting for
    # its group, whose order each fair-share spawn's look keeps or works out
    line_group = membership[names[0]][0]
    before = SortedAtEachJoin(fair_admission, fair_policy, ORDER_KEPT)
    for w in range(waiting):
        user = rng.choice(names)
        group = line_group if course else membership[user][0]
        waiter = Waiter(
            f"ns/waiting-{w}",
            user,
            group,
            tuple(fair_policy.charged_groups(group)),
            time.time(),
            w,
        )
        fair_admission.join_line(fair_policy, waiter, waiter.arrived)
        fair_admission.line.block(waiter, group)
        before.waiters[waiter.key] = dataclasses.replace(waiter, standing_at=None)

    def spawn_path(
        hub, hub_policy, i: int, user: str, sorted_line: bool = False
    ) -> tuple[list, object, object]:
        book, now = hub.usage, hub.clock()
        groups_of_user = membership[user]
        options = {"profile": f"{groups_of_user[0]}--gpu", "gpus": "2", "flavor": "shared"}
        listed = [
            profile_entry(
                hub_policy,
                ledger,
                o,
                None,
                budgets_of(hub_policy, book, user, o.group, now, ledger.charges),
            )
            for o in offers(hub_policy, groups_of_user)
        ]
        if hub_policy.fair_share is not None:
            fair = hub.fair_book(hub_policy)
            for group in {o.group.name for o in offers(hub_policy, groups_of_user)}:
                listed.append(
                    standing_line(
                        group,
                        fair.group_standing(group, now, ledger.charges),
                        fair.member_standing(user, group, now, ledger.charges),
                        hub_policy.fair_share.half_life,
                    )
                )
            # the spawn joins the line, as every spawn does, its place is found, and it
            # leaves once decided
            group = line_group if course else groups_of_user[0]
            me = Waiter(
                f"ns/new-{i}", user, group, tuple(hub_policy.charged_groups(group)), now, -1
            )
            if sorted_line:
                before.join_and_leave(me, now)
            else:
                hub.join_line(hub_policy, me, now)
                hub.place(hub_policy, me, now)
                hub.line.leave(me)
        selection = select(hub_policy, groups_of_user, options)
        over = budget_refusal(
            hub_policy, book, user, selection.group, float(selection.request.gpus), now, ledger
        )
        decision = ledger.admit(hub_policy, f"ns/new-{i}", user, selection.group, selection.request)
        ledger.release(hub_policy, f"ns/new-{i}")
        return listed, decision, over

    ours: list[float] = []
    ours_fair: list[float] = []
    ours_sorted: list[float] = []
    refused = 0
    for i in range(spawns):
        user = rng.choice(names)
        fair_rows = [
            (fair_admission, fair_policy, ours_fair, False),
            (fair_admission, fair_policy, ours_sorted, True),
        ]
        # the second of the two finds the user's budget sums kept by the first: each
        # goes second every other spawn
        for hub, hub_policy, samples, sorted_line in (
            (admission, policy, ours, False),
            *(fair_rows if i % 2 else fair_rows[::-1]),
        ):
            t0 = time.perf_counter()
            listed, decision, over = spawn_path(hub, hub_policy, i, user, sorted_line)
            samples.append(time.perf_counter() - t0)
            assert listed
            assert decision.admitted
            refused += over is not None

    # stock KubeSpawner, same process, a static list of the same size
    from kubespawner import KubeSpawner

    with _unreachable_cluster():
        spawner = KubeSpawner(_mock=True)
    static = kubespawner_static_list(groups)
    stock: list[float] = []
    for _ in range(stock_spawns):
        i = rng.randrange(groups)
        spawner.user_options = {"profile": f"g{i:04d}--gpu", "gpus": "2", "flavor": "shared"}
        t0 = time.perf_counter()
        initialized = spawner._get_initialized_profile_list(static)
        spawner._validate_user_options(initialized)
        spawner._get_profile(spawner.user_options["profile"], initialized)
        stock.append(time.perf_counter() - t0)

    def row(name: str, samples: list[float]) -> str:
        ms = [s * 1000 for s in samples]
        return (
            f"| {name} | {statistics.median(ms):.3f} | {percentile(ms, 99):.3f} | {max(ms):.3f} |"
        )

    print(
        f"scale: {users} users, {groups} groups, {servers} running servers; "
        f"{spawns} spawns, {stock_spawns} for stock KubeSpawner"
    )
    print("| path | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    budgets = f"budgets over {loaded:,} records" if days else "no budgets"
    print(row(f"jupyterhub-gpu: profile list + validation + admission ({budgets})", ours))
    line = f"a line of {len(fair_admission.line)}" + (" in one group" if course else "")
    print(row(f"the same with fair share on (standings; joining {line}, kept in order)", ours_fair))
    print(row(f"  the same, {line} sorted at each join (as before)", ours_sorted))
    print(row(f"stock KubeSpawner: static list of {2 * groups:,} profiles", stock))
    print(f"ratio of p99 (stock / ours): {percentile(stock, 99) / percentile(ours, 99):.1f}")
    # what the hub does once a second off the spawn path: every standing worked out
    refreshes: list[float] = []
    if fair_policy.fair_share is not None:
        book = fair_admission.fair_book(fair_policy)
        for _ in range(20):
            t0 = time.perf_counter()
            now = fair_admission.clock()
            for w in list(fair_admission.line):
                standing = book.order_key(w.user, w.group, now, ledger.charges)
                fair_admission.line.restand(w, standing, now)
            refreshes.append((time.perf_counter() - t0) * 1000)
    print(
        f"the line's {len(fair_admission.line)} standings worked out again (once a second, "
        f"not in a spawn): p50 {statistics.median(refreshes):.2f} ms, max {max(refreshes):.2f} ms"
    )
    print(
        "ratio, the line sorted at each join / kept in order: "
        f"p50 {statistics.median(ours_sorted) / statistics.median(ours_fair):.2f}, "
        f"p99 {percentile(ours_sorted, 99) / percentile(ours_fair, 99):.2f}"
    )


class SortedAtEachJoin:
    """The waiting line as the hub kept it before ``core.line.Line``: a dict of the
    waiters, sorted (``line_order``) and walked (``place``) at each join, the order
    kept a second while nobody joined or left, every standing older than a second
    worked out again when it was sorted."""

    def __init__(self, hub, policy, kept: float) -> None:
        self.hub, self.policy, self.kept_for = hub, policy, kept
        self.waiters: dict = {}
        self.version = 0
        self.kept: tuple | None = None

    def ordered(self, now: float) -> list:
        from jupyterhub_gpu.core.fairshare import line_order

        kept = self.kept
        if kept is not None and kept[0] == self.version and 0 <= now - kept[1] < self.kept_for:
            return kept[2]
        book, running = self.hub.fair_book(self.policy), self.hub.ledger.charges
        for w in self.waiters.values():
            if w.standing_at is None or not 0 <= now - w.standing_at < self.kept_for:
                w.standing = book.order_key(w.user, w.group, now, running)
                w.standing_at = now
        ordered = line_order(self.waiters.values(), now, self.policy.fair_share.max_wait)
        self.kept = (self.version, now, ordered)
        return ordered

    def join_and_leave(self, me, now: float):
        from jupyterhub_gpu.core.fairshare import place

        self.waiters[me.key] = me
        self.version += 1
        where = place(me, self.ordered(now))
        del self.waiters[me.key]
        self.version += 1
        return where


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spawns", type=int, default=2000)
    parser.add_argument(
        "--stock-spawns", type=int, default=200, help="stock KubeSpawner is slow at this size"
    )
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=5_000)
    parser.add_argument("--servers", type=int, default=5_000)
    parser.add_argument(
        "--days", type=int, default=365, help="days of usage records (0: no budgets)"
    )
    parser.add_argument(
        "--waiting", type=int, default=20, help="servers waiting in line (fair share)"
    )
    parser.add_argument(
        "--course", action="store_true", help="every waiter in one group, waiting for it"
    )
    args = parser.parse_args()
    asyncio.run(
        main(
            args.spawns,
            args.stock_spawns,
            args.users,
            args.groups,
            args.servers,
            args.days,
            args.waiting,
            args.course,
        )
    )
