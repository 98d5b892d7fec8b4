"""The usage database, against each database it runs on: a sqlite file (the default)
and a real PostgreSQL server (the hub's, where z2jh has one)."""

from __future__ import annotations

import pytest

from jupyterhub_gpu.accounting.store import AccountingUnavailable, UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(request, tmp_path_factory):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('usage') / 'usage.sqlite'}"
        return
    from jupyterhub_gpu.dev.postgres import throwaway_postgres

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


def test_a_witnessed_stop_ends_the_open_row_of_that_server_only(store):
    store.open([record("old", ended=900.0, started=800.0), record("new")], now=1000)
    assert store.end("ns/jupyter-ann", 1500) == 1
    rows = {r.uid: r for r in store.overlapping(0, 2000)}
    assert (rows["old"].ended, rows["new"].ended) == (900.0, 1500.0)
    # an inferred end never overrides a witnessed one
    assert store.end_missing(live=[], started_before=5000) == []


def test_readers_fetch_what_changed_and_what_overlaps_a_range(store):
    store.open([record("a", started=100.0, group="lab")], now=100)
    store.open([record("b", key="ns/b", started=5000.0, group="other")], now=5000)
    store.seen(["b"], 6000)
    assert [r.uid for r in store.changed_since(5500)] == ["b"]
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
