"""The usage database, against each database it runs on: a sqlite file (the default)
and a real PostgreSQL server (the hub's, where z2jh has one)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sqlalchemy import Boolean, Column, Float, MetaData, String, Table, create_engine, event

from jupyterhub_gpu.accounting.store import AccountingUnavailable, UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.hub.admission import SpawnAdmission


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(request, tmp_path_factory):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('usage') / 'usage.sqlite'}"
        return
    from jupyterhub_gpu_dev.postgres import throwaway_postgres

    with throwaway_postgres("usage") as url:
        yield url


@pytest.fixture
def store(database_url):
    store = UsageStore(database_url)
    yield store
    with store.engine.begin() as connection:
        connection.exec_driver_sql("DELETE FROM jupyterhub_gpu_usage")
    store.dispose()


def record(uid: str, key: str = "ns/jupyter-ann", started: float = 1000.0, **kw) -> UsageRecord:
    values = dict(user="ann", group="lab", profile="gpu", flavor="a100", gpus=1.0)
    values.update(kw)
    return UsageRecord(uid, key, started=started, last_seen=started, **values)


def rows(store: UsageStore) -> dict[str, UsageRecord]:
    return {r.uid: r for r in store.overlapping(0, 1e10)}


def fresh_database(database_url: str, name: str) -> str:
    """Another, empty database on the same server (or another sqlite file)."""
    if database_url.startswith("sqlite"):
        return database_url.replace("usage.sqlite", f"{name}.sqlite")
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    return f"{database_url.rsplit('/', 1)[0]}/{name}"


def test_a_pod_is_recorded_once_whoever_records_it(store):
    assert store.open([record("p1")], now=1000) == 1
    # the service finds the pod the hub already recorded: nothing new
    assert store.open([record("p1"), record("p2", key="ns/jupyter-bob")], now=1010) == 1
    assert {r.uid for r in store.overlapping(0, 2000)} == {"p1", "p2"}


def test_an_end_inferred_from_the_last_sighting_is_undone_by_a_later_sighting(store):
    store.open([record("p1")], now=1000)
    store.seen(["p1"], 1030)
    # listed at 1060 without p1 (a stale list, say): ended at its last sighting
    (gone,) = store.end_missing(live=[], started_before=1060)
    assert (gone.uid, gone.ended) == ("p1", 1030)
    # seen again: it runs on
    store.seen(["p1"], 1090)
    (row,) = store.overlapping(0, 2000)
    assert (row.ended, row.last_seen) == (None, 1090)


def test_a_witnessed_stop_ends_the_row_of_that_pod_only(store):
    store.open([record("old", ended=900.0, started=800.0), record("new")], now=1000)
    assert store.end("new", 1500) == 1
    rows = {r.uid: r for r in store.overlapping(0, 2000)}
    assert (rows["old"].ended, rows["new"].ended) == (900.0, 1500.0)
    # an inferred end never overrides a witnessed one
    assert store.end_missing(live=[], started_before=5000) == []
    assert store.end("new", 1600, inferred=True) == 0


def test_the_end_of_an_old_pod_never_ends_the_newer_pod_of_the_same_server(store):
    # a stop failed; the user started again at once: a new pod of the same name
    store.open([record("old", started=1000.0), record("new", started=1200.0)], now=1200)
    # the failed stop's deletion finally answers 409 (the name is the new pod's now):
    # the old pod is gone
    assert store.end("old", 1300) == 1
    assert (rows(store)["old"].ended, rows(store)["new"].ended) == (1300.0, None)
    # a witnessed end is final: a late sighting of that pod does not undo it
    store.seen(["old", "new"], 1400)
    assert (rows(store)["old"].ended, rows(store)["new"].ended) == (1300.0, None)
    assert rows(store)["new"].last_seen == 1400


def test_an_inferred_end_is_undone_by_a_later_sighting_and_replaced_by_a_witnessed_one(store):
    store.open([record("p1", started=1000.0)], now=1000)
    store.seen(["p1"], 1030)
    # the hub's ledger resync: not listed now, listed at 1060
    assert store.end("p1", 1060, inferred=True) == 1
    assert rows(store)["p1"].ended == 1060
    # a sighting from before that end says nothing new
    store.seen(["p1"], 1050)
    assert rows(store)["p1"].ended == 1060
    # a later one: the pod runs on (the hub's listing was short of it)
    store.seen(["p1"], 1090)
    assert (rows(store)["p1"].ended, rows(store)["p1"].last_seen) == (None, 1090)
    # the service finds it gone: inferred at its last sighting; then the hub's stop
    # of it is seen through: that end is final
    store.end_missing(live=[], started_before=5000)
    assert rows(store)["p1"].ended == 1090
    assert store.end("p1", 1100) == 1
    store.seen(["p1"], 1200)
    assert rows(store)["p1"].ended == 1100


def test_an_end_is_never_before_its_pods_start_nor_an_inferred_one_before_its_last_sighting(
    store,
):
    store.open([record("p1"), record("p2", key="ns/b"), record("p3", key="ns/c")], now=1000)
    store.seen(["p2"], 1045)
    # the resync's last listing was before p1 started (another replica started it)
    store.end("p1", 940, inferred=True)
    # the hub last listed p2 at 1010; the service saw it at 1045
    store.end("p2", 1010, inferred=True)
    # a witnessed stop, by a clock a little behind the pod's
    store.end("p3", 990)
    ended = {uid: r.ended for uid, r in rows(store).items()}
    assert ended == {"p1": 1000.0, "p2": 1045.0, "p3": 1000.0}


def test_a_reader_sees_a_write_dated_before_its_last_read(store):
    store.open([record("p1", started=1000.0)], now=1000)
    found, revision = store.snapshot(0, 2000)
    assert [r.uid for r in found] == ["p1"]
    # written after that read, with earlier times (a resync after an outage)
    store.end("p1", 1010, inferred=True)
    changed, newer = store.changed_since(revision)
    assert [(r.uid, r.ended) for r in changed] == [("p1", 1010.0)]
    assert newer > revision
    assert store.changed_since(newer) == ([], newer)


def test_writers_take_revisions_in_the_order_they_commit(database_url, store):
    other, reader = UsageStore(database_url), UsageStore(database_url)
    store.open([record("a"), record("b", key="ns/b")], now=1000)
    start = reader.revision()
    paused, go = threading.Event(), threading.Event()

    def pause(connection, cursor, statement, *args):
        if statement.startswith("UPDATE jupyterhub_gpu_usage SET") and not paused.is_set():
            paused.set()
            go.wait(10)

    event.listen(store.engine, "before_cursor_execute", pause)
    try:
        # one writer has taken its revision and not committed; another writes after it
        first = threading.Thread(target=store.end, args=("a", 1100))
        first.start()
        assert paused.wait(10)
        second = threading.Thread(target=other.end, args=("b", 1200))
        second.start()
        time.sleep(0.5)
        seen, revision = reader.changed_since(start)
    finally:
        go.set()
        first.join(15)
        second.join(15)
        event.remove(store.engine, "before_cursor_execute", pause)
    later, _ = reader.changed_since(revision)
    assert seen == []
    assert {r.uid: r.ended for r in later} == {"a": 1100.0, "b": 1200.0}
    other.dispose()
    reader.dispose()


def test_the_hub_and_the_service_recording_one_pod_at_once_make_one_row(database_url, store):
    service = UsageStore(database_url)
    store.overlapping(0, 1)
    service.overlapping(0, 1)  # both have their tables
    outcome: dict[str, object] = {}

    def service_records() -> None:
        try:
            outcome["service"] = service.open([record("p1")], now=1005)
        except Exception as e:
            outcome["service"] = e

    threads: list[threading.Thread] = []

    def hub_inserting(connection, cursor, statement, *args):
        # the service records the pod while the hub is about to
        if statement.startswith("INSERT INTO jupyterhub_gpu_usage (") and not threads:
            threads.append(threading.Thread(target=service_records))
            threads[0].start()
            threads[0].join(1.0)

    event.listen(store.engine, "before_cursor_execute", hub_inserting)
    try:
        outcome["hub"] = store.open([record("p1")], now=1000)
    finally:
        event.remove(store.engine, "before_cursor_execute", hub_inserting)
        for thread in threads:
            thread.join(15)
    assert sorted([outcome["hub"], outcome["service"]]) == [0, 1]
    assert list(rows(store)) == ["p1"]
    service.dispose()


def test_a_database_of_the_previous_version_is_brought_up_to_date(database_url):
    url = fresh_database(database_url, "previous_version")
    # the table as the previous version created it, with one row
    previous = Table(
        "jupyterhub_gpu_usage",
        MetaData(),
        Column("uid", String(64), primary_key=True),
        Column("key", String(320), nullable=False),
        Column("user", String(255), nullable=False),
        Column("group", String(255), nullable=False),
        Column("profile", String(255), nullable=False),
        Column("flavor", String(255)),
        Column("gpus", Float, nullable=False),
        Column("started", Float, nullable=False),
        Column("last_seen", Float, nullable=False),
        Column("ended", Float),
        Column("end_inferred", Boolean, nullable=False, default=False),
        Column("updated", Float, nullable=False),
    )
    engine = create_engine(url)
    previous.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(
            previous.insert(),
            {
                **{f: getattr(record("old"), f) for f in ("uid", "key", "user", "group")},
                "profile": "gpu",
                "gpus": 1.0,
                "started": 1000.0,
                "last_seen": 1000.0,
                "end_inferred": False,
                "updated": 1000.0,
            },
        )
    engine.dispose()
    # the hub and the service start on it at once
    stores = [UsageStore(url), UsageStore(url)]
    snapshots = []
    threads = [
        threading.Thread(target=lambda s=s: snapshots.append(s.snapshot(0, 5000))) for s in stores
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [[r.uid for r in found] for found, _ in snapshots] == [["old"], ["old"]]
    hub, service = stores
    revision = snapshots[0][1]
    assert service.open([record("new", key="ns/b")], now=2000) == 1
    hub.end("old", 1500)
    changed, _ = hub.changed_since(revision)
    assert {r.uid: r.ended for r in changed} == {"old": 1500.0, "new": None}
    for store in stores:
        store.dispose()


# ---- through the hub's admission: what its stops write, what its reads see -----------

NOW = 1_800_000_000.0


def lab_policy():
    return parse_policy(
        flavors={"a100": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "a100"}}},
        groups={
            "lab": {
                "quota": {"gpus": 4},
                "profiles": ["gpu"],
                "budget": {"gpu_hours": 100, "period": "30d"},
            }
        },
    )


def admission(store: UsageStore) -> SpawnAdmission:
    hub = SpawnAdmission()
    hub.use_store(store, fail_open=False)
    hub.clock = lambda: NOW
    return hub


async def test_a_deletion_seen_through_after_a_restart_ends_the_old_pods_use_only(store):
    policy = lab_policy()
    hub = admission(store)
    store.open([record("old", started=NOW - 600)], now=NOW - 600)
    await hub.read_usage(policy)
    # the stop failed; the user started again: the hub records the new pod's start
    new = record("new", started=NOW - 60)
    new.last_seen = NOW
    hub.usage.put(policy, new)
    store.open([new], now=NOW)
    # the failed stop's deletion answers 409: the old pod (that uid) is gone
    hub.record_stop("ns/jupyter-ann", uid="old")
    await asyncio.gather(*hub.finishing)
    found = rows(store)
    assert found["new"].ended is None
    # when it went is not known: at its last sighting, as the hub's book has it
    assert found["old"].ended == NOW - 600
    assert hub.usage.records["old"].ended == NOW - 600
    assert hub.usage.open_by_key["ns/jupyter-ann"].uid == "new"


async def test_an_end_written_late_with_an_earlier_time_reaches_every_reader(store):
    policy = lab_policy()
    hub, replica = admission(store), admission(store)
    store.open([record("p1", started=NOW - 600)], now=NOW - 600)
    await hub.read_usage(policy)
    await replica.read_usage(policy)
    # the hub's resync: not listed now, listed a minute ago
    hub.record_stop("ns/jupyter-ann", at=NOW - 60)
    await asyncio.gather(*hub.finishing)
    await replica.read_usage(policy)
    assert replica.usage.records["p1"].ended == NOW - 60


async def test_the_resyncs_end_is_undone_when_the_service_sees_the_pod_again(store):
    policy = lab_policy()
    hub = admission(store)
    store.open([record("p1", started=NOW - 600)], now=NOW - 600)
    await hub.read_usage(policy)
    hub.record_stop("ns/jupyter-ann", at=NOW - 60, inferred=True)
    await asyncio.gather(*hub.finishing)
    assert rows(store)["p1"].ended == NOW - 60
    # the service's next pass lists it: it runs on, for the hub too
    store.seen(["p1"], NOW)
    await hub.read_usage(policy)
    assert hub.usage.open_by_key["ns/jupyter-ann"].uid == "p1"
    assert rows(store)["p1"].ended is None


def test_readers_fetch_what_changed_and_what_overlaps_a_range(store):
    store.open([record("a", started=100.0, group="lab")], now=100)
    _, revision = store.snapshot(0, 1)
    store.open([record("b", key="ns/b", started=5000.0, group="other")], now=5000)
    store.seen(["b"], 6000)
    changed, _ = store.changed_since(revision)
    assert [r.uid for r in changed] == ["b"]
    assert [r.uid for r in store.overlapping(4000, 7000, groups=["other"])] == ["b"]
    assert store.overlapping(4000, 7000, groups=["nobody"]) == []
    # "a" never ended and was last seen at 100: still an open row (a reader decides)
    assert {r.uid for r in store.overlapping(4000, 7000)} == {"a", "b"}


def test_an_unreachable_database_is_named_without_its_password():
    store = UsageStore("postgresql+psycopg2://hub:s3cret@127.0.0.1:1/hub")
    with pytest.raises(AccountingUnavailable) as caught:
        store.overlapping(0, 1)
    message = str(caught.value)
    assert message.startswith(
        "the GPU usage database (postgresql+psycopg2://hub:***@127.0.0.1:1/hub) could not be read: "
    )
    assert "s3cret" not in message
