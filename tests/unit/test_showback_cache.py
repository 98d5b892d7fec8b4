"""The service's showback cache: a finished month none of whose rows changed is not
computed again at the next pass; a change to one of its rows changes the answer."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import UsageRecord
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.service.gpu_time import GPUTime

POLICY = parse_policy(
    flavors={"a100": {"kind": "gpu"}},
    profiles={"gpu": {"gpu": {"flavor": "a100"}}},
    groups={"lab": {"quota": {"gpus": 8}, "profiles": ["gpu"]}},
)
DEC = datetime(2026, 12, 3, tzinfo=UTC).timestamp()
NOW = datetime(2027, 1, 15, tzinfo=UTC).timestamp()
H = 3600.0


def ended(uid: str, started: float, hours: float) -> UsageRecord:
    end = started + hours * H
    return UsageRecord(
        uid, f"ns/jupyter-{uid}", "ann", "lab", "gpu", "a100", 1.0, started, end, end
    )


@pytest.fixture
def store(tmp_path):
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    yield store
    store.dispose()


async def test_an_unchanged_month_is_kept_and_a_changed_row_changes_it(store):
    # a's end inferred at its last sighting (the service found its pod gone)
    store.open([UsageRecord("a", "ns/jupyter-a", "ann", "lab", "gpu", "a100", 1.0, DEC, DEC)])
    store.end("a", DEC + 2 * H, inferred=True)
    gpu_time = GPUTime(
        POLICY,
        SimpleNamespace(server_pods={}, server_pods_behind_since=None, dra=None),
        store,
        clock=lambda: NOW,
    )
    await gpu_time.read()
    december = await gpu_time.showback("2026-12", None)
    assert december.groups == {"lab": 2.0}
    # a pass that read a row of January only: December is not computed again
    store.open([ended("b", NOW - 5 * H, 1)])
    await gpu_time.read()
    assert await gpu_time.showback("2026-12", None) is december
    assert (await gpu_time.showback("2027-01", None)).groups == {"lab": 1.0}
    # a's stop is witnessed after all, an hour earlier: the answer follows its row
    store.end("a", DEC + H)
    await gpu_time.read()
    again = await gpu_time.showback("2026-12", None)
    assert again is not december
    assert again.groups == {"lab": 1.0}
    # a new row in December too
    store.open([ended("c", DEC + 10 * H, 3)])
    await gpu_time.read()
    assert (await gpu_time.showback("2026-12", None)).groups == {"lab": 4.0}


async def test_a_reopened_row_and_a_running_server_count_in_this_month(store):
    clock, pods = [NOW], {}
    state = SimpleNamespace(server_pods=pods, server_pods_behind_since=None, dra=None)
    gpu_time = GPUTime(POLICY, state, store, clock=lambda: clock[0])
    # a server from 2 hours ago, its end inferred an hour ago (its pod found gone)
    started = NOW - 2 * H
    store.open(
        [UsageRecord("a", "ns/jupyter-a", "ann", "lab", "gpu", "a100", 1.0, started, started)]
    )
    store.end("a", NOW - H, inferred=True)
    # and a server of September, older than the months kept in memory
    store.open([ended("s", datetime(2026, 9, 10, tzinfo=UTC).timestamp(), 5)])
    await gpu_time.read()
    assert (await gpu_time.showback("2027-01", None)).groups == {"lab": 1.0}
    # seen again after all: the inferred end is undone, and it runs on up to now
    store.seen(["a"], NOW)
    pods["ns/jupyter-a"] = object()
    clock[0] = NOW + H
    await gpu_time.read()
    assert (await gpu_time.showback("2027-01", None)).groups == {"lab": 3.0}
    assert (await gpu_time.showback("2027-01", {"lab"})).users == {("lab", "ann"): 3.0}
    assert (await gpu_time.showback("2026-09", None)).groups == {"lab": 5.0}
