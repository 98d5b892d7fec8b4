"""The first read of a year's usage (the hub's budgets, the service's windows) never
stalls the event loop: spawns, pages and the API keep answering while it is read.

The database holds 150,000 rows (a 500-GPU cluster's first three months, a third of
its year; ``JHGPU_STARTUP_ROWS`` for more): reading and indexing them takes several
seconds on a test machine, all of it on the loop before."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

import pytest
from loop_helpers import Heartbeat
from usage_rows import YEAR, fill, year_policy

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.budgets import gpu_hours
from jupyterhub_gpu.hub.admission import SpawnAdmission
from jupyterhub_gpu.service.gpu_time import GPUTime

ROWS = int(os.environ.get("JHGPU_STARTUP_ROWS", "150000"))
NOW = 1_800_000_000.0
#: the longest the loop may go without a beat (10 ms apart) while the rows are read:
#: 50 ms is what is asked and what an idle machine shows (``benchmarks/service_year.py``);
#: the test machine is shared and loaded (a load of 5 on 2 cores), where the process
#: alone is pre-empted for tens of milliseconds, so the test allows 200 ms (the code
#: before stalled for over 2 s at this size)
STALL = 0.2


@pytest.fixture(scope="module")
def year_db(tmp_path_factory) -> str:
    return fill(tmp_path_factory.mktemp("usage") / "usage.sqlite", ROWS, NOW)


async def test_the_hubs_first_read_of_a_years_usage_leaves_the_loop_free(year_db):
    policy = year_policy()
    admission = SpawnAdmission()
    store = UsageStore(year_db)
    admission.use_store(store, fail_open=False)
    admission.clock = lambda: NOW
    with Heartbeat() as beat:
        await admission.read_usage(policy)
    store.dispose()
    assert admission.usage_current
    assert len(admission.usage.records) > ROWS // 2
    assert beat.worst < STALL, f"the hub's loop stalled {beat.worst:.3f} s"
    # what it read is what budgets are checked on: a department's year, summed again
    dept = admission.usage.group_records("dept0")
    assert admission.usage.used("dept0", None, int(YEAR), NOW) == pytest.approx(
        gpu_hours(list(dept), NOW - YEAR, NOW)
    )


async def test_the_services_first_read_of_a_years_usage_leaves_the_loop_free(year_db):
    policy = year_policy()
    store = UsageStore(year_db)
    state = SimpleNamespace(server_pods={}, server_pods_behind_since=None, dra=None)
    gpu_time = GPUTime(policy, state, store, clock=lambda: NOW)
    with Heartbeat() as beat:
        await gpu_time.read()
    store.dispose()
    assert gpu_time.snapshot.current
    assert beat.worst < STALL, f"the service's loop stalled {beat.worst:.3f} s"
    view = gpu_time.snapshot.groups["dept0"]
    assert view.period == int(YEAR)
    assert view.used == pytest.approx(
        gpu_hours(list(gpu_time.book.group_records("dept0")), NOW - YEAR, NOW)
    )
    assert gpu_time.snapshot.users, "no member's hours were summed"


async def test_a_pass_at_a_years_usage_sums_only_what_moved(year_db):
    """Every group's, parent's and member's hours at each pass: the closed records'
    sums are kept, so a pass costs the records that changed, not all of them."""
    policy = year_policy()
    store = UsageStore(year_db)
    state = SimpleNamespace(server_pods={}, server_pods_behind_since=None, dra=None)
    clock = [NOW]
    gpu_time = GPUTime(policy, state, store, clock=lambda: clock[0])
    await gpu_time.read()
    took = []
    for _ in range(5):
        clock[0] += 60.0
        began = time.perf_counter()
        # no row changed: the sums are the pass's work (timed whole, the database's
        # answer in its thread included: the loop's share is less)
        await gpu_time.read()
        took.append(time.perf_counter() - began)
    store.dispose()
    took.sort()
    assert took[len(took) // 2] < 0.05, f"a pass held the loop {took} s"
    now = clock[0]
    for name in ("dept0", "lab1-2"):
        view = gpu_time.snapshot.groups[name]
        records = list(gpu_time.book.group_records(name))
        assert view.used == pytest.approx(gpu_hours(records, now - view.period, now))
    (user, group), view = next(iter(gpu_time.snapshot.users.items()))
    records = list(gpu_time.book.user_records(user, group))
    assert view.used == pytest.approx(gpu_hours(records, now - view.period, now))


async def test_a_first_read_that_fails_is_said_and_retried(tmp_path):
    """A database that cannot be read at start: the hub says why, budgets wait for it."""
    admission = SpawnAdmission()
    missing = tmp_path / "gone" / "usage.sqlite"
    store = UsageStore(f"sqlite:///{missing}")
    admission.use_store(store, fail_open=False)
    admission.clock = lambda: NOW
    admission.retry_max = 3600.0
    await admission.read_usage(year_policy())
    assert not admission.usage_current
    assert admission.usage_error
    assert "usage" in admission.usage_error.lower()
    if admission._retrying is not None:
        admission._retrying.cancel()
        await asyncio.gather(admission._retrying, return_exceptions=True)
    store.dispose()
