"""A usage database outage, without a cluster: the hub's admission and the service's
pass against a real PostgreSQL server that is stopped and started again, and the
bounded backlog of what could not be written meanwhile."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from jupyterhub_gpu.accounting.backlog import Backlog
from jupyterhub_gpu.accounting.store import HELD_WRITE_LIMIT, UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.core.shaping import CHARGE_ANNOTATION, FLAVOR_LABEL, GROUP_LABEL, PROFILE_LABEL
from jupyterhub_gpu.hub.admission import BUDGETS_UNCHECKED, AccountingCollector, SpawnAdmission
from jupyterhub_gpu.service.gpu_time import AccountingBehind, GPUTime, PodsUnseen
from jupyterhub_gpu.service.tasks import BackgroundTask, RetryAtInterval
from kube_helpers import eventually

NOW = 1_800_000_000.0
POLICY = parse_policy(
    flavors={"a100": {"kind": "gpu"}},
    profiles={"gpu": {"gpu": {"flavor": "a100"}}},
    groups={
        "lab": {
            "quota": {"gpus": 8},
            "profiles": ["gpu"],
            "budget": {"gpu_hours": 100, "period": "30d"},
        },
        "open": {"quota": {"gpus": 8}, "profiles": ["gpu"]},
    },
)


@pytest.fixture(scope="module")
def postgres():
    from jupyterhub_gpu_dev.postgres import postgres_server

    with postgres_server("usage") as server:
        yield server


@pytest.fixture
def store(postgres):
    if not postgres.running:
        postgres.start()
    store = UsageStore(postgres.url)
    yield store
    if not postgres.running:
        postgres.start()
    with store.engine.begin() as connection:
        connection.exec_driver_sql("DELETE FROM jupyterhub_gpu_usage")
    store.dispose()


def rows(store: UsageStore) -> dict[str, UsageRecord]:
    return {r.uid: r for r in store.overlapping(0, 1e12)}


def record(uid: str, started: float, group: str = "lab", user: str = "ann") -> UsageRecord:
    return UsageRecord(uid, f"ns/jupyter-{uid}", user, group, "gpu", "a100", 1.0, started, started)


# ---- the backlog's bound ----------------------------------------------------------------


def test_a_full_backlog_says_so_drops_the_oldest_sightings_first_and_keeps_the_ends(caplog):
    backlog = Backlog(limit=3, clock=lambda: NOW)
    caplog.set_level(logging.WARNING)
    backlog.add("a", NOW, record=record("a", NOW - 60), seen=NOW)
    backlog.add("b", NOW + 1, seen=NOW + 1)
    backlog.add("a", NOW + 2, end=NOW + 2)  # a stopped: its start and end are kept
    backlog.add("c", NOW + 3, seen=NOW + 3)
    assert len(backlog) == 3
    backlog.add("d", NOW + 4, seen=NOW + 4)
    # full: the oldest pod without an end (b) goes, a's end stays
    assert {p.uid for p in backlog.entries()} == {"a", "c", "d"}
    assert backlog.get("a").record.uid == "a"
    assert backlog.get("a").end == NOW + 2
    assert backlog.dropped == 1
    assert "GPU usage backlog full (3 servers' events not written" in caplog.text
    for uid in ("e", "f"):
        backlog.add(uid, NOW + 5, end=NOW + 5)
    assert {p.uid for p in backlog.entries()} == {"a", "e", "f"}
    # nothing but ends: the oldest end goes, and that is an error
    backlog.add("g", NOW + 6, end=NOW + 6)
    assert {p.uid for p in backlog.entries()} == {"e", "f", "g"}
    assert backlog.dropped == 4
    assert any(
        r.levelno == logging.ERROR and "the end of pod a" in r.getMessage() for r in caplog.records
    )
    # written oldest first
    assert [p.uid for p in backlog.take(2)] == ["e", "f"]


def test_a_sighting_after_an_inferred_end_undoes_it_and_a_witnessed_end_wins():
    backlog = Backlog(limit=10, clock=lambda: NOW)
    backlog.add("a", NOW, seen=NOW)
    backlog.add("a", NOW + 30, end=NOW, inferred=True)
    backlog.add("a", NOW + 60, seen=NOW + 60)  # the listing had missed it
    (kept,) = backlog.entries()
    assert (kept.end, kept.seen, kept.since) == (None, NOW + 60, NOW)
    backlog.add("a", NOW + 90, end=NOW + 60, inferred=True)
    backlog.add("a", NOW + 95, end=NOW + 80)  # the hub saw the stop through
    backlog.add("a", NOW + 99, end=NOW + 99, inferred=True)
    (kept,) = backlog.entries()
    assert (kept.end, kept.inferred) == (NOW + 80, False)


async def test_a_failed_write_puts_its_events_back_before_the_newer_ones_of_the_same_pod(store):
    backlog = Backlog(limit=10, clock=lambda: NOW)
    backlog.add("a", NOW, record=record("a", NOW - 10), seen=NOW)

    class Unavailable(Exception):
        pass

    class Down:
        def write(self, entries):
            # the pod stops while the write is under way
            backlog.add("a", NOW + 5, end=NOW + 5)
            raise Unavailable("down")

    with pytest.raises(Unavailable):
        await backlog.write(Down())
    (kept,) = backlog.entries()
    assert (kept.record.uid, kept.seen, kept.end, kept.since) == ("a", NOW, NOW + 5, NOW)
    assert await backlog.write(store) == 1
    assert len(backlog) == 0
    found = rows(store)["a"]
    assert (found.started, found.last_seen, found.ended) == (NOW - 10, NOW, NOW + 5)


# ---- the hub: admission and its own starts and stops -------------------------------


def gpu_pod(uid: str, started: float, group: str = "lab", user: str = "ann") -> dict:
    request = Request(gpus=Fraction(1), cpu=100, memory=1)
    return {
        "metadata": {
            "uid": uid,
            "name": f"jupyter-{uid}",
            "namespace": "ns",
            "labels": {GROUP_LABEL: group, PROFILE_LABEL: "gpu", FLAVOR_LABEL: "a100"},
            "annotations": {
                CHARGE_ANNOTATION: json.dumps({"user": user, "request": request.to_json()})
            },
        },
        "status": {
            "phase": "Running",
            "startTime": datetime.fromtimestamp(started, UTC).isoformat(),
        },
    }


def hub_admission(store: UsageStore, clock: list[float], fail_open: bool = False):
    hub = SpawnAdmission()
    hub.use_store(store, fail_open=fail_open)
    hub.clock = lambda: clock[0]
    hub.retry_max = 0.2
    return hub


GPU = Request(gpus=Fraction(1), cpu=100, memory=1)


async def settle(hub: SpawnAdmission) -> None:
    await asyncio.gather(*hub.finishing)


async def test_the_hub_refuses_budgeted_gpu_spawns_after_a_failed_read_and_writes_its_events_later(
    store, postgres
):
    clock = [NOW]
    hub = hub_admission(store, clock)
    lab, other = POLICY.find_group("lab"), POLICY.find_group("open")
    store.open([record("before", NOW - 600)], now=NOW - 600)
    await hub.read_usage(POLICY)
    assert hub.budget_refusal(POLICY, "ann", lab, GPU) is None
    postgres.stop()
    # a read fails after a successful one: budgets are not checked on what it held
    clock[0] = NOW + 10
    await hub.read_usage(POLICY)
    assert hub.budget_refusal(POLICY, "ann", lab, GPU) == BUDGETS_UNCHECKED
    assert hub.budgets(POLICY, "ann", lab) == []
    # groups without a budget and servers without GPUs are not affected
    assert hub.budget_refusal(POLICY, "ann", other, GPU) is None
    assert hub.budget_refusal(POLICY, "ann", lab, Request(gpus=0, cpu=100, memory=1)) is None
    lag = hub.accounting()
    assert (lag.ok, lag.behind, lag.failing_since) == (False, True, NOW + 10)
    assert "could not be read" in lag.error
    # meanwhile servers start and stop through the hub
    clock[0] = NOW + 20
    hub.record_start(POLICY, gpu_pod("during", NOW + 20, group="open"))
    clock[0] = NOW + 50
    hub.record_stop("ns/jupyter-during")
    clock[0] = NOW + 60
    hub.record_stop("ns/jupyter-before")
    await settle(hub)
    lag = hub.accounting()
    assert (lag.unwritten, lag.oldest_unwritten) == (2, NOW + 20)
    # the hub's metrics say so
    registry = CollectorRegistry()
    registry.register(AccountingCollector(hub))
    metric = "jupyterhub_gpu_hub_accounting_"
    assert registry.get_sample_value(metric + "up") == 0
    assert registry.get_sample_value(metric + "unwritten_servers") == 2
    assert registry.get_sample_value(metric + "oldest_unwritten_age_seconds") == 40
    assert registry.get_sample_value(metric + "dropped_events_total") == 0
    postgres.start()
    clock[0] = NOW + 90

    async def recovered():
        return hub.usage_current

    await eventually(recovered, "the hub to write and read again", within=10)
    found = rows(store)
    assert (found["during"].started, found["during"].ended) == (NOW + 20, NOW + 50)
    assert found["before"].ended == NOW + 60
    assert hub.budget_refusal(POLICY, "ann", lab, GPU) is None
    lag = hub.accounting()
    assert (lag.ok, lag.behind, lag.unwritten, lag.last_read) == (True, False, 0, NOW + 90)
    assert registry.get_sample_value(metric + "up") == 1
    assert registry.get_sample_value(metric + "unwritten_servers") == 0


async def test_a_failed_write_alone_refuses_budgeted_spawns_until_a_read_and_fail_open_admits(
    store, postgres
):
    clock = [NOW]
    closed, opened = hub_admission(store, clock), hub_admission(store, clock, fail_open=True)
    lab = POLICY.find_group("lab")
    for hub in (closed, opened):
        await hub.read_usage(POLICY)
    postgres.stop()
    for hub in (closed, opened):
        hub.record_start(POLICY, gpu_pod(f"p-{id(hub)}", NOW))
        await settle(hub)
    assert closed.budget_refusal(POLICY, "ann", lab, GPU) == BUDGETS_UNCHECKED
    assert opened.budget_refusal(POLICY, "ann", lab, GPU) is None
    postgres.start()
    for hub in (closed, opened):
        await hub.read_usage(POLICY)
        assert hub.budget_refusal(POLICY, "ann", lab, GPU) is None
    assert len(rows(store)) == 2


# ---- the service's pass --------------------------------------------------------------


class Pods:
    """The pods the service's watch holds, set by the test."""

    def __init__(self) -> None:
        self.server_pods: dict[str, SimpleNamespace] = {}
        #: since when the watch has failed (None: the pods are current)
        self.server_pods_behind_since: float | None = None
        #: the DRA objects (none: these servers' flavors are not on DRA)
        self.dra = None

    def show(self, *records: UsageRecord) -> None:
        self.server_pods = {r.key: SimpleNamespace(usage=r, uid=r.uid) for r in records}


async def test_a_service_pass_keeps_what_it_sees_during_an_outage_and_writes_it_with_true_times(
    store, postgres
):
    clock = [NOW]
    pods = Pods()
    service = GPUTime(POLICY, pods, store, clock=lambda: clock[0])
    a, b = record("a", NOW - 10), record("b", NOW - 5)

    async def at(t: float, *live: UsageRecord) -> str:
        clock[0] = t
        pods.show(*live)
        return await service.record()

    await at(NOW, a, b)
    postgres.stop()
    c, d, e = record("c", NOW + 25), record("d", NOW + 50), record("e", NOW + 85)
    for t, live in (
        (NOW + 30, (a, b, c)),
        (NOW + 60, (b, c, d)),  # a went between 30 and 60
        (NOW + 90, (b, e)),  # c and d went between 60 and 90
        (NOW + 120, (b,)),  # e went between 90 and 120
    ):
        with pytest.raises(AccountingBehind) as behind:
            await at(t, *live)
        assert isinstance(behind.value, RetryAtInterval)
        assert "kept in memory until the usage database can be written" in str(behind.value)
    snapshot = service.snapshot
    assert not snapshot.current
    assert (snapshot.lag.behind, snapshot.lag.unwritten) == (True, 5)
    assert snapshot.lag.oldest_unwritten == NOW + 30
    assert snapshot.lag.last_write is not None
    assert snapshot.read_at == NOW
    postgres.start()
    report = await at(NOW + 150, b)
    assert "5 servers' events kept while the database was unavailable written" in report
    found = rows(store)
    ends = {uid: (r.started, r.ended) for uid, r in found.items()}
    assert ends == {
        "a": (NOW - 10, NOW + 30),
        "b": (NOW - 5, None),
        "c": (NOW + 25, NOW + 60),
        "d": (NOW + 50, NOW + 60),
        "e": (NOW + 85, NOW + 90),
    }
    assert found["b"].last_seen == NOW + 150
    assert service.snapshot.current
    assert (service.snapshot.lag.behind, service.snapshot.lag.unwritten) == (False, 0)


async def test_while_the_pod_watch_fails_no_pod_is_seen_and_one_gone_meanwhile_ends_before(
    tmp_path,
):
    """The pods the service holds after its watch failed may be gone: a pass sees none
    of them (no sighting, no end) until a list succeeds; then a pod that went meanwhile
    ends at its last sighting, from before the failure."""
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    clock = [NOW]
    pods = Pods()
    service = GPUTime(POLICY, pods, store, clock=lambda: clock[0])
    a, b = record("a", NOW - 10), record("b", NOW - 5)
    pods.show(a, b)
    await service.record()
    # the watch fails at NOW + 1; a is deleted at NOW + 5, unseen: the service still holds it
    pods.server_pods_behind_since = NOW + 1
    for t in (NOW + 30, NOW + 60):
        clock[0] = t
        with pytest.raises(PodsUnseen) as unseen:
            await service.record()
        assert isinstance(unseen.value, RetryAtInterval)
        assert "no server pod seen since" in str(unseen.value)
        found = rows(store)
        assert {uid: (r.last_seen, r.ended) for uid, r in found.items()} == {
            "a": (NOW, None),
            "b": (NOW, None),
        }
        # open records count up to their last sighting, not to now
        assert service.running == {}
        assert service.snapshot.groups["lab"].used == pytest.approx(15 / 3600)
    # a list succeeds: b is there, a is not
    pods.server_pods_behind_since = None
    clock[0] = NOW + 90
    pods.show(b)
    report = await service.record()
    assert "1 ended unseen" in report
    found = rows(store)
    assert (found["a"].last_seen, found["a"].ended) == (NOW, NOW)
    assert (found["b"].last_seen, found["b"].ended) == (NOW + 90, None)
    store.dispose()


async def test_the_service_pass_keeps_its_pace_while_a_write_hangs(store):
    """A database that does not answer (a lock held, a host gone) must not slow the
    sightings: a pass waits for the write half the time between passes at most."""
    pods = Pods()
    service = GPUTime(POLICY, pods, store)
    pods.show(record("a", time.time() - 10))
    await service.record()
    release = asyncio.Event()
    loop = asyncio.get_running_loop()
    write = store.write

    def hanging(entries):
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(30)
        return write(entries)

    store.write = hanging
    task = BackgroundTask("GPU time", service.record, 0.2)
    task.start()
    try:
        await asyncio.sleep(3)
        # every pass failed, and the next ran at the interval (no backoff): the first
        # waited 1 s for the write, the others found it still under way
        assert task.status.runs >= 6, task.status
        assert task.status.failures == task.status.runs
        assert "has not answered" in task.status.last_error
        (kept,) = service.backlog.entries()
        assert time.time() - kept.seen < 1.0
    finally:
        release.set()
        await task.stop()
        await service._writing
    assert rows(store)["a"].last_seen > time.time() - 3.5


#: a writer that suspends itself inside its write transaction, at the last step before
#: the commit (the fence), as a replica stopped, frozen or paused mid-write does
FROZEN_WRITER = """
import os, signal, sys
from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.usage import UsageRecord

store = UsageStore(sys.argv[1])
store.fence = lambda: os.kill(os.getpid(), signal.SIGSTOP)
try:
    store.open([UsageRecord("frozen", "ns/frozen", "ann", "lab", "gpu", "a100", 1.0, 1, 1)])
except Exception as e:
    print(type(e).__name__, e)
else:
    print("written")
"""


def _suspended(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


async def test_a_writer_frozen_mid_write_holds_the_database_back_no_longer_than_its_limit(store):
    """A process suspended inside its write transaction holds the revision counter; the
    other writers (the hub, the replica acting after it) wait for it no longer than
    PostgreSQL's limit on an idle transaction, and what it meant to write is not
    written behind them when it resumes: it is told its write failed and keeps it."""
    store.open([record("before", time.time() - 60)])
    frozen = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FROZEN_WRITER,
        store.url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await eventually(
            lambda: asyncio.sleep(0, _suspended(frozen.pid)), "the writer to freeze", 30
        )
        began = time.monotonic()
        written = await asyncio.wait_for(
            asyncio.to_thread(store.open, [record("after", time.time())]),
            HELD_WRITE_LIMIT + 20,
        )
        waited = time.monotonic() - began
    finally:
        frozen.send_signal(signal.SIGCONT)
        output = (await asyncio.wait_for(frozen.communicate(), 30))[0].decode()
    assert written == 1
    # it waited for the frozen writer (the counter was held), then no longer than the limit
    assert 0.5 < waited < HELD_WRITE_LIMIT + 10, waited
    assert output.startswith("AccountingUnavailable"), output
    assert "frozen" not in rows(store)
