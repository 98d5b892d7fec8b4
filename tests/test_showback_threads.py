"""Showback's month tally off the service's event loop: every change and every sum of
the tally is made on a thread, one step at a time, and every answer counts every pass
read before it was asked, passes and requests running at once (an answer begun before
a pass is not kept past it). A member's answer is their groups' part of every
group's; Prometheus' large answers are decoded on a thread.

The real ``GPUTime`` over a real sqlite usage database, with a real Prometheus
(Debian's package) as the utilisation source: it scrapes nothing here, so every day
of the month is read and found without samples, and the month's ended sessions are
made final (the work that grows with the records) at the passes that read their days.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from types import SimpleNamespace

import pytest

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.showback import month_bounds, of_groups, showback
from jupyterhub_gpu.core.showback_tally import ShowbackTally
from jupyterhub_gpu.service.gpu_time import GPUTime
from jupyterhub_gpu.service.idle import LARGE_ANSWER, Prometheus
from jupyterhub_gpu_dev.prometheus import LocalPrometheus

POLICY = parse_policy(
    flavors={"a100": {"kind": "gpu"}},
    profiles={"gpu": {"gpu": {"flavor": "a100"}}},
    groups={
        "faculty": {"quota": {"gpus": 64}, "profiles": ["gpu"]},
        "lab": {"parent": "faculty", "quota": {"gpus": 32}, "profiles": ["gpu"]},
        "course": {"parent": "faculty", "quota": {"gpus": 32}, "profiles": ["gpu"]},
        "other": {"quota": {"gpus": 32}, "profiles": ["gpu"]},
    },
)
GROUPS = ["faculty", "lab", "course", "other"]
H = 3600.0
DAY = 86400.0
#: the tally's methods that change it or sum it
TALLY_WORK = ("put", "prune", "unmeasured", "finalise", "showback")


@pytest.fixture(scope="module")
def prometheus():
    with LocalPrometheus([]) as local:
        yield local


@pytest.fixture
def store(tmp_path):
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    yield store
    store.dispose()


@pytest.fixture
def tally_threads(monkeypatch) -> list[tuple[str, int]]:
    """Each call of the tally's work, with the thread it ran on."""
    calls: list[tuple[str, int]] = []
    for name in TALLY_WORK:
        original = getattr(ShowbackTally, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls.append((_name, threading.get_ident()))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ShowbackTally, name, spy)
    return calls


def ended(rng: random.Random, i: int, now: float) -> UsageRecord:
    """A server of the last 70 days, ended."""
    group = GROUPS[i % len(GROUPS)]
    started = now - rng.uniform(0.2, 70) * DAY
    end = min(started + rng.uniform(0.5, 30) * H, now - 600)
    user = f"u{i % 13}"
    return UsageRecord(
        f"e{i}", f"ns/jupyter-{user}-{i}", user, group, "gpu", "a100", rng.choice((1.0, 2.0)),
        started, end, end,
    )  # fmt: skip


def expected(gpu_time: GPUTime, month: str, groups: set[str] | None):
    """``showback`` summed afresh from the records the service holds now."""
    since, until = month_bounds(month, gpu_time.zone)
    now = gpu_time.clock()
    records = [r for r in gpu_time.book.records.values() if groups is None or r.group in groups]
    return showback(records, since, min(until, now), now, gpu_time.running)


def same(got, want) -> None:
    for name in ("groups", "users", "flavors", "detail"):
        mine, theirs = getattr(got, name), getattr(want, name)
        assert mine.keys() == theirs.keys(), name
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (name, key)


async def test_passes_and_requests_at_once_never_use_the_tally_on_the_loop(
    store, prometheus, tally_threads
):
    rng = random.Random(7)
    now = float(int(time.time()))
    clock = [now]
    store.open([ended(rng, i, now) for i in range(3000)])
    # servers running now, seen by the pass as the pod watch would list them
    pods = {}
    for i in range(40):
        group = GROUPS[i % len(GROUPS)]
        record = UsageRecord(
            f"r{i}", f"ns/jupyter-run{i}", f"run{i}", group, "gpu", "a100", 1.0,
            now - rng.uniform(1, 30) * H, now - 60,
        )  # fmt: skip
        pods[record.key] = SimpleNamespace(usage=record, uid=record.uid)
    store.open([p.usage for p in pods.values()])
    state = SimpleNamespace(server_pods=pods, server_pods_behind_since=None, dra=None)
    gpu_time = GPUTime(
        POLICY, state, store, clock=lambda: clock[0], prometheus=Prometheus(prometheus.url)
    )
    loop_thread = threading.get_ident()
    month = gpu_time.month_of(now)
    asked: list[asyncio.Task] = []
    answered = 0
    for n in range(12):
        clock[0] += 30
        # a server stops, another starts, rows of the month change
        gone = rng.choice(sorted(pods))
        del pods[gone]
        record = UsageRecord(
            f"new{n}", f"ns/jupyter-new{n}", f"new{n}", rng.choice(GROUPS), "gpu", "a100",
            1.0, clock[0] - 60, clock[0] - 60,
        )  # fmt: skip
        pods[record.key] = SimpleNamespace(usage=record, uid=record.uid)
        store.open([ended(rng, 10_000 + n, clock[0])])
        # members and admins ask while the pass runs (its tally work is on a thread)
        for groups in ({"lab"}, {"faculty"}, {"other"}, None):
            asked.append(asyncio.ensure_future(gpu_time.showback(month, groups)))
        report = await gpu_time.record()
        assert "GPU servers running" in report
        # asked after the pass: every row it read counted, for every viewer alike
        for groups in (None, {"course"}, {"faculty"}):
            got = await gpu_time.showback(month, groups)
            want = expected(gpu_time, month, None if groups is None else gpu_time.family(*groups))
            same(got, want)
            answered += 1
        # last month, whole and a group's
        last = gpu_time.month_of(month_bounds(month, gpu_time.zone)[0] - 1)
        same(await gpu_time.showback(last, {"lab"}), expected(gpu_time, last, {"lab"}))
    await asyncio.gather(*asked)
    assert answered == 36
    whole = await gpu_time.showback(month, None)
    # the month's days were read (four finished days a pass, the newest first), each
    # without samples: the sessions of the days read for good were made final
    assert whole.coverage is not None
    assert whole.coverage.covered == 0
    assert whole.measured == {}
    works = {name for name, _ in tally_threads}
    assert {"put", "prune", "unmeasured", "finalise", "showback"} <= works, works
    on_loop = sorted({name for name, thread in tally_threads if thread == loop_thread})
    assert on_loop == [], f"the tally's {on_loop} ran on the event loop"


def test_a_viewers_groups_taken_from_every_groups_answer_are_their_records_showback():
    """A member's showback is their groups' part of the month's answer for every group:
    the same rows and totals as ``showback`` of those groups' records alone."""
    rng = random.Random(3)
    now = 1_800_000_000.0
    records = [ended(rng, i, now) for i in range(400)]
    since, until = month_bounds("2027-01")
    busy = {r.uid: rng.uniform(0, 100) for r in records if rng.random() < 0.7}
    whole = showback(records, since, now, now, (), busy)
    assert whole.measured, "no session measured"
    for groups in ({"lab"}, {"faculty", "lab", "course"}, {"other"}, {"nobody"}):
        mine = [r for r in records if r.group in groups]
        want = showback(mine, since, min(until, now), now, (), busy)
        got = of_groups(whole, groups)
        for name in ("groups", "users", "flavors", "detail", "measured", "utilised"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-12), name
        assert set(got.groups) <= groups


async def test_a_large_answer_from_prometheus_is_read_whole(prometheus):
    """An answer past ``LARGE_ANSWER`` (a day of a large cluster's pods) is decoded on a
    thread: the same answer as a small one's, decoded on the loop."""
    long = "p" * (LARGE_ANSWER + 1000)
    client = Prometheus(prometheus.url)
    small = await client.query('label_replace(vector(1), "pod", "short", "", "")')
    large = await client.query(f'label_replace(vector(1), "pod", "{long}", "", "")')
    assert small[0]["metric"] == {"pod": "short"}
    assert large[0]["metric"] == {"pod": long}
    assert large[0]["value"][1] == small[0]["value"][1] == "1"
