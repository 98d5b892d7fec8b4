"""Two replicas of the GPU service against the real API server: one acts, the other takes
over when it dies mid-pass, a suspended leader never acts beside the new one, and what
they wrote matches the pods' lives (one usage row and one recorded end per pod).

The replicas run without a hub (pods are created as the spawner labels them, so the
service records them from their own start); their Lease is 3 s with a 2 s renew
deadline and passes every half second, and they share a PostgreSQL database
(``replica_helpers``).
"""

from __future__ import annotations

import asyncio
import re
import signal
import time

import pytest
from replica_helpers import (
    SETTINGS,
    Replica,
    delete_pod,
    gpu_pod,
    never_overlap,
    started_at,
    stop_rows,
    usage_rows,
    wait_acting,
    write_config,
)
from sqlalchemy import create_engine

from jupyterhub_gpu_dev.localcluster.ports import free_port
from kube_helpers import eventually

pytestmark = pytest.mark.k8s

#: an end the acting replica witnessed is off by at most a pass and a second of slack
END_ERROR = SETTINGS["usage_interval"] + 1.0
#: a row is ended only once its pod is older than this (a list may miss a newer pod)
YOUNG = 10.0


@pytest.fixture(scope="module")
def postgres():
    """The site's database the replicas share (each test its own database in it)."""
    from jupyterhub_gpu_dev.postgres import postgres_server

    with postgres_server("replicas") as server:
        yield server


@pytest.fixture
async def replicas(local_cluster, namespace, tmp_path, postgres):
    """``await replicas("a", "b")``: started replicas, first one acting."""
    # the hub's API: a port nobody listens on (these replicas run without a hub)
    hub_api = f"http://127.0.0.1:{free_port()}/hub/api"
    database = await asyncio.to_thread(postgres.create_database, namespace.replace("-", "_"))
    config = write_config(tmp_path, namespace, hub_api, database)
    made: list[Replica] = []

    async def start(*names: str) -> list[Replica]:
        for name in names:
            replica = Replica(name, config, local_cluster.state.kubeconfig, hub_api)
            replica.start()
            made.append(replica)
            if len(made) == 1:
                await wait_acting(replica)
        return made

    start.database = database  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for replica in made:
            replica.stop()


async def row_of(database, namespace: str, name: str, ended: bool = False):
    async def one():
        rows = (await asyncio.to_thread(usage_rows, database)).get(f"{namespace}/{name}", [])
        if rows and (not ended or rows[0][1] is not None):
            return rows
        return None

    return await eventually(one, f"the usage row of {name}" + (" ended" if ended else ""), 60)


async def test_the_leader_killed_mid_pass_is_replaced_within_the_lease_and_nothing_is_lost(
    replicas, core, namespace
):
    database = replicas.database
    a, b = await replicas("replica-a", "replica-b")
    for replica in (a, b):  # both answer
        await eventually(replica.answers, f"{replica.name}'s web server", 30)
    uids = {"early": await gpu_pod(core, namespace, "early", "ann")}
    uids["brief"] = await gpu_pod(core, namespace, "brief", "bob")
    starts = {n: await started_at(core, namespace, n) for n in uids}
    await row_of(database, namespace, "brief")
    await asyncio.sleep(YOUNG)
    ends = {"brief": await delete_pod(core, namespace, "brief")}
    await row_of(database, namespace, "brief", ended=True)
    # the leader is mid-pass: its write waits for the revision counter, which the test holds
    holder = create_engine(database).connect()
    holder.exec_driver_sql("SELECT value FROM jupyterhub_gpu_usage_revision FOR UPDATE")
    try:
        await asyncio.sleep(3 * SETTINGS["usage_interval"])
        a.signal(signal.SIGKILL)
        killed = time.time()
    finally:
        holder.rollback()
        holder.close()
    a.process.wait()
    # a server that starts while nobody acts
    uids["orphaned-start"] = await gpu_pod(core, namespace, "orphaned-start", "cid")
    starts["orphaned-start"] = await started_at(core, namespace, "orphaned-start")
    took_over = await wait_acting(b, within=30)
    # within the Lease's duration from the leader's death (its last renewal was before),
    # plus a retry period and two seconds of slack for a loaded machine
    assert took_over - killed <= SETTINGS["lease_duration"] + SETTINGS["lease_retry_period"] + 2
    assert never_overlap(a, b, killed={a.name: killed}) == []
    await row_of(database, namespace, "orphaned-start")
    await asyncio.sleep(YOUNG)
    for name in ("early", "orphaned-start"):
        ends[name] = await delete_pod(core, namespace, name)
    for name in ends:
        await row_of(database, namespace, name, ended=True)
    rows = await asyncio.to_thread(usage_rows, database)
    for name in uids:
        ((started, ended, _),) = rows[f"{namespace}/{name}"]  # one row per pod
        assert started == starts[name], name
        assert ends[name] - END_ERROR <= ended <= ends[name] + 1, (name, ended, ends[name])

    # each end recorded once: by the leader it happened under
    async def every_end():
        stops = await asyncio.to_thread(stop_rows, database)
        return stops if all(uids[n] in stops for n in ends) else None

    stops = await eventually(every_end, "every end recorded", 30)
    assert {n: len(stops[uids[n]]) for n in ends} == dict.fromkeys(ends, 1)
    # who leads, on the survivor's metrics
    metrics = await b.metrics()
    assert 'jupyterhub_gpu_service_acting{identity="replica-b_' in metrics
    assert 'holder="replica-b_' in metrics
    assert "jupyterhub_gpu_lease_duration_seconds 3.0" in metrics


async def test_a_suspended_leader_stops_acting_before_the_other_starts_and_writes_nothing(
    replicas, core, namespace
):
    database = replicas.database
    a, b = await replicas("replica-a", "replica-b")
    await eventually(b.answers, "replica-b's web server", 30)
    uid = await gpu_pod(core, namespace, "held", "ann")
    await row_of(database, namespace, "held")
    await asyncio.sleep(YOUNG)
    a.signal(signal.SIGSTOP)
    try:
        suspended = time.time()
        took_over = await wait_acting(b, within=30)
        assert took_over - suspended >= SETTINGS["lease_renew_deadline"]
        # under the new leader the server ends; the suspended one still holds it running
        deleted = await delete_pod(core, namespace, "held")
        (row,) = await row_of(database, namespace, "held", ended=True)
        await asyncio.sleep(SETTINGS["lease_duration"])
    finally:
        a.signal(signal.SIGCONT)
    resumed = time.time()
    # the old leader notices it no longer acts, dated at its renew deadline, long past
    await eventually(lambda: asyncio.sleep(0, not a.acting()), "replica-a to stop acting", 10)
    ((_, a_until),) = a.acting_periods()
    assert a_until < took_over < resumed
    assert never_overlap(a, b) == []
    # a few of its passes later: it wrote nothing with what it held while suspended
    await asyncio.sleep(6 * SETTINGS["usage_interval"])
    assert (await asyncio.to_thread(usage_rows, database))[f"{namespace}/held"] == [row]
    assert deleted - END_ERROR <= row[1] <= deleted + 1
    stops = await asyncio.to_thread(stop_rows, database)
    assert len(stops[uid]) == 1
    # and says who acts
    metrics = await a.metrics()
    assert re.search(r'jupyterhub_gpu_service_acting\{identity="replica-a_\w+"\} 0\.0', metrics)
    assert 'holder="replica-b_' in metrics


async def test_a_leader_stopped_as_a_rolling_update_stops_it_hands_over_at_once(replicas):
    a, b = await replicas("replica-a", "replica-b")
    await eventually(b.answers, "replica-b's web server", 30)
    a.signal(signal.SIGTERM)  # what the kubelet sends an old replica
    stopped = time.time()
    took_over = await wait_acting(b, within=30)
    assert a.process.wait(15) == 0
    # it gave the Lease up: sooner than any wait for the Lease to expire could end (its
    # last renewal was at most a retry period before the signal)
    assert took_over - stopped < SETTINGS["lease_duration"] - SETTINGS["lease_retry_period"]
    assert "gave it up" in a.log()
    assert never_overlap(a, b) == []
