"""When a server's GPU time ends: a stop the hub asked for at the moment it asked, a
server found stopped at its pod's own end or its last sighting, never when the hub
noticed. The pod's own words (pure), and the hub's book against a real usage store."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from test_usage_outage import POLICY, gpu_pod

from jupyterhub_gpu.accounting.store import UsageStore
from jupyterhub_gpu.core.ends import has_ended, pod_ended_at
from jupyterhub_gpu.hub.admission import SpawnAdmission

NOW = 1_800_000_000.0


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(phase: str = "Running", *, deleted: float | None = None, finished: float | None = None):
    state = {"running": {"startedAt": iso(NOW - 3600)}}
    if finished is not None:
        state = {"terminated": {"exitCode": 0, "finishedAt": iso(finished)}}
    metadata = {"name": "jupyter-ann", "namespace": "ns", "uid": "u1"}
    if deleted is not None:
        metadata["deletionTimestamp"] = iso(deleted)
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "notebook"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "notebook", "state": state}]},
    }


def test_a_running_pod_has_not_ended_and_says_no_end():
    assert not has_ended(pod())
    assert pod_ended_at(pod(), NOW) is None


def test_a_pod_gone_finished_or_deleted_has_ended():
    assert has_ended(None)
    assert has_ended(pod(deleted=NOW - 5))
    assert has_ended(pod("Succeeded"))
    assert has_ended(pod("Failed"))
    # the process exited, the pod not marked yet
    assert has_ended(pod(finished=NOW - 5))


def test_a_pod_ends_when_its_server_container_finished_else_at_its_deletion():
    assert pod_ended_at(pod("Succeeded", finished=NOW - 40), NOW) == NOW - 40
    # the container's end wins over the deletion's deadline (the end of its grace)
    assert pod_ended_at(pod(deleted=NOW - 10, finished=NOW - 38), NOW) == NOW - 38
    assert pod_ended_at(pod(deleted=NOW - 10), NOW) == NOW - 10
    # a deletion's deadline still ahead: it is running until now at most
    assert pod_ended_at(pod(deleted=NOW + 30), NOW) == NOW
    # a pod that says neither (gone from the watch, or kwok's): unknown
    assert pod_ended_at(pod("Failed"), NOW) is None
    assert pod_ended_at(None, NOW) is None


def test_a_pod_shaped_otherwise_is_read_by_its_first_container():
    shaped = pod(finished=NOW - 7)
    shaped["spec"]["containers"] = [{"name": "server"}, {"name": "sidecar"}]
    shaped["status"]["containerStatuses"][0]["name"] = "server"
    assert pod_ended_at(shaped, NOW) == NOW - 7


# ---- the hub's book and the usage database ------------------------------------------


def hub_on(store: UsageStore, clock: list[float]) -> SpawnAdmission:
    hub = SpawnAdmission()
    hub.use_store(store, fail_open=False)
    hub.clock = lambda: clock[0]
    return hub


async def written(hub: SpawnAdmission) -> None:
    await asyncio.gather(*hub.finishing)


async def test_a_server_found_gone_keeps_the_end_at_its_last_sighting(tmp_path):
    """The reproduction: a pod last seen 30 minutes before the hub's poll noticed it
    gone was billed until the poll. Found gone, the hub's end is an inferred one: it
    never moves the end the service wrote at the last sighting, and without one it
    ends at the latest sighting anyone wrote."""
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    clock = [NOW - 7200]
    hub = hub_on(store, clock)
    await hub.read_usage(POLICY)
    hub.record_start(POLICY, gpu_pod("seen", NOW - 7200))
    hub.record_start(POLICY, gpu_pod("unended", NOW - 7200))
    await written(hub)
    # the service saw both until 30 minutes ago, and ended one at that sighting
    store.seen(["seen", "unended"], NOW - 1800)
    store.end("seen", NOW - 1800, inferred=True)
    await hub.read_usage(POLICY)
    # the hub's poll finds both gone now: the hub's own last sighting was earlier still
    clock[0] = NOW
    hub.record_stop("ns/jupyter-seen", at=NOW - 1900, uid="seen", inferred=True)
    hub.record_stop("ns/jupyter-unended", at=NOW - 1900, uid="unended", inferred=True)
    await written(hub)
    ends = {r.uid: r.ended for r in store.overlapping(0, NOW + 1)}
    assert ends == {"seen": NOW - 1800, "unended": NOW - 1800}


async def test_a_pods_own_end_replaces_the_end_inferred_at_its_last_sighting(tmp_path):
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    clock = [NOW - 600]
    hub = hub_on(store, clock)
    await hub.read_usage(POLICY)
    hub.record_start(POLICY, gpu_pod("shut", NOW - 600))
    await written(hub)
    # the service saw it alive after its process had exited (the pod still there) and
    # ended it at that sighting; the hub's book read it
    store.seen(["shut"], NOW - 20)
    store.end("shut", NOW - 20, inferred=True)
    await hub.read_usage(POLICY)
    clock[0] = NOW
    # the hub stops it and reads the container's finishedAt from the pod
    hub.record_stop("ns/jupyter-shut", at=NOW - 45, uid="shut", inferred=False)
    await written(hub)
    (row,) = store.overlapping(0, NOW + 1)
    assert row.ended == NOW - 45
    # final: a later inferred end (the service, another poll) does not move it
    store.end("shut", NOW - 5, inferred=True)
    (row,) = store.overlapping(0, NOW + 1)
    assert row.ended == NOW - 45


async def test_a_stop_the_hub_asked_for_ends_when_asked_and_replaces_an_inferred_end(tmp_path):
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}")
    clock = [NOW - 600]
    hub = hub_on(store, clock)
    await hub.read_usage(POLICY)
    hub.record_start(POLICY, gpu_pod("asked", NOW - 600))
    await written(hub)
    clock[0] = NOW
    hub.record_stop("ns/jupyter-asked", at=NOW - 3)
    await written(hub)
    (row,) = store.overlapping(0, NOW + 1)
    assert row.ended == NOW - 3
