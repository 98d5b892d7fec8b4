"""A server's own answer (``api/servers/<user>/<name>``): who may read it, how its pod
is found, and its notices and last stop kept in the usage database across restarts.

No cluster: pods in the API's JSON form go through the service's own transform and
watch-event path (``ServiceState.server_pod``, ``server_pod_event``), into a real
sqlite usage database shared by two stores, as the hub and the service share it.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine

from jupyterhub_gpu.accounting.events import EventStore, NoticeRow, StopRow
from jupyterhub_gpu.accounting.store import AccountingUnavailable, UsageStore
from jupyterhub_gpu.core.admission import IN_QUOTA
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import select
from jupyterhub_gpu.core.shaping import shape
from jupyterhub_gpu.service.server_events import ServerEvents
from jupyterhub_gpu.service.server_status import may_read, server_status
from jupyterhub_gpu.service.state import ServiceState
from jupyterhub_gpu.service.views import Notice

POLICY = parse_policy(
    flavors={"h200": {"kind": "gpu"}},
    profiles={"one": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}},
    groups={"lab": {"quota": {"gpus": 4}, "profiles": ["one"]}},
)
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def pod_json(user: str, uid: str, server: str = "", conditions=(), created=NOW) -> dict:
    selection = select(POLICY, ["lab"], {"profile": "lab--one"})
    shaped = shape(POLICY, selection, IN_QUOTA, username=user)
    name = f"jupyter-{user}" + (f"--{server}" if server else "")
    return {
        "metadata": {
            "name": name,
            "namespace": "jhub",
            "uid": uid,
            "creationTimestamp": created.isoformat().replace("+00:00", "Z"),
            "labels": {"component": "singleuser-server", **shaped.labels},
            "annotations": {
                "hub.jupyter.org/username": user,
                "hub.jupyter.org/servername": server,
                **shaped.annotations,
            },
        },
        "spec": {"containers": [{"name": "notebook"}]},
        "status": {
            "phase": "Running",
            "startTime": "2026-11-25T12:00:00Z",
            "conditions": list(conditions),
        },
    }


# ---- who may read a server's answer --------------------------------------------------


@pytest.mark.parametrize(
    "scopes",
    [
        ["access:servers!server=ann/"],
        ["access:servers!user=ann"],
        ["access:servers"],
        ["read:users", "access:servers!server=ann/"],
    ],
)
def test_the_servers_own_scope_the_users_or_an_admins_reads_it(scopes):
    assert may_read(scopes, "ann", "")


@pytest.mark.parametrize(
    "scopes",
    [
        [],
        ["access:services!service=gpu"],  # the service, not the server
        ["access:servers!server=bob/"],  # another user's server
        ["access:servers!server=ann/other"],  # another server of hers
        ["access:servers!server=ann"],  # forged: no separator, names no server
        ["access:servers!server=ann/ "],  # forged: a name with a space
        ["access:servers!user=an"],  # a prefix of her name
        ["access:servers!user=ann "],
        ["access:servers!group=lab"],  # a group's servers are not read here
        ["admin:servers", "read:servers", "servers"],  # seeing or managing is not access
        ["ACCESS:SERVERS"],
        ["access:servers!server=*/"],
        ["access:servers!user=*"],
    ],
)
def test_forged_or_other_scopes_read_nothing(scopes):
    assert not may_read(scopes, "ann", "")


def test_a_named_server_is_read_with_its_own_scope_only():
    assert may_read(["access:servers!server=ann/gpu"], "ann", "gpu")
    assert not may_read(["access:servers!server=ann/"], "ann", "gpu")
    assert not may_read(["access:servers!server=ann/gp"], "ann", "gpu")


# ---- the server's pod, found by (user, server name) -----------------------------------


def fed_state() -> ServiceState:
    state = ServiceState(POLICY, hub_namespace="jhub")
    state.server_pods_listed({})
    return state


def event(state: ServiceState, obj: dict | None, key: str) -> None:
    old = state.server_pods.get(key)
    new = state.server_pod(obj) if obj is not None else None
    if new is None:
        state.server_pods.pop(key, None)
    else:
        state.server_pods[key] = new
    state.server_pod_event(key, old, new)


def test_the_index_follows_every_watch_event_and_a_relist():
    state = fed_state()
    event(state, pod_json("ann", "u1"), "jhub/jupyter-ann")
    event(state, pod_json("ann", "u2", "gpu"), "jhub/jupyter-ann--gpu")
    assert state.pod_of("ann", "").uid == "u1"
    assert state.pod_of("ann", "gpu").uid == "u2"
    assert state.pod_of("bob", "") is None
    # a new pod of the same server (same name, new uid) replaces the old one
    event(state, pod_json("ann", "u3"), "jhub/jupyter-ann")
    assert state.pod_of("ann", "").uid == "u3"
    event(state, None, "jhub/jupyter-ann")
    assert state.pod_of("ann", "") is None
    assert state.pod_of("ann", "gpu").uid == "u2"
    # a relist (a new dict) rebuilds it
    fresh = {"jhub/jupyter-bob": state.server_pod(pod_json("bob", "u9"))}
    state.server_pods_listed(fresh)
    assert state.pod_of("bob", "").uid == "u9"
    assert state.pod_of("ann", "gpu") is None


# ---- notices and stops, kept across restarts ------------------------------------------


@pytest.fixture
def database(tmp_path):
    return f"sqlite:///{tmp_path / 'usage.sqlite'}"


def test_hub_and_service_create_the_tables_at_once(database):
    stores = [EventStore(UsageStore(database)) for _ in range(4)]
    errors: list[BaseException] = []

    def read(store: EventStore) -> None:
        try:
            store.last_stops(0)
        except BaseException as e:  # reported below, with the store's own words
            errors.append(e)

    threads = [threading.Thread(target=read, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_the_last_stop_of_each_server_and_the_retention(database):
    store = EventStore(UsageStore(database), retention=86400)
    now = NOW.timestamp()
    old = StopRow("bob", "", "u3", "budget", "budget", now - 2 * 86400)
    assert store.write([], [old], now - 2 * 86400) == 0
    assert set(store.last_stops(0, user="bob")) == {("bob", "")}
    # a write two days later prunes what is older than the retention (a day here)
    pruned = store.write(
        [NoticeRow("ann", "", "u1", "idle", "ann's server is idle", now - 60, now + 60)],
        [
            StopRow("ann", "", "u0", "hub", "stopped through the hub", now - 3000),
            StopRow("ann", "", "u1", "idle", "idle", now - 100),
            StopRow("ann", "gpu", "u2", "preempted", "preempted", now - 200),
        ],
        now,
    )
    assert pruned == 1
    assert store.last_stops(0, user="bob") == {}
    last = store.last_stops(now - 86400)
    assert {k: v.reason for k, v in last.items()} == {
        ("ann", ""): "idle",
        ("ann", "gpu"): "preempted",
    }
    assert [n.kind for n in store.recent_notices(now - 3600)] == ["idle"]
    # within the hour, nothing is pruned again
    assert store.write([], [], now + 60) == 0


def test_a_database_that_cannot_be_reached_is_named():
    store = EventStore(UsageStore("sqlite:////nonexistent/dir/usage.sqlite"))
    with pytest.raises(AccountingUnavailable, match=r"usage database .*nonexistent"):
        store.last_stops(0)


def service_like(state: ServiceState, events: ServerEvents):
    """What ``server_status`` reads of the service."""
    return SimpleNamespace(
        policy=POLICY,
        state=state,
        server_events=events,
        gpu_time=SimpleNamespace(snapshot=SimpleNamespace(current=True, groups={}, users={})),
        budget_rule=SimpleNamespace(scheduled_stop=lambda pod: None),
        idle_servers=SimpleNamespace(warned={}),
        service_prefix="/services/gpu/",
        hub_prefix="/hub/",
        rules_interval=1,
    )


def wired(database: str, clock) -> tuple[ServiceState, ServerEvents]:
    state = fed_state()
    events = ServerEvents(POLICY, EventStore(UsageStore(database)), clock=clock)
    state.on_notice = events.notice
    state.on_pod_gone = events.pod_ended
    return state, events


def answer(state, events, user="ann", name=""):
    return server_status(
        service_like(state, events), user, name, NOW, events.last_stops.get((user, name))
    )


def test_why_a_pod_ended_nobody_scheduled(database):
    state, events = wired(database, lambda: NOW.timestamp())
    preempted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "default-scheduler: preempting to accommodate a higher priority pod",
    }
    kueue = {"type": "TerminationTarget", "status": "True", "reason": "StoppedByKueue"}
    for user, conditions in (("ann", [preempted]), ("bob", [kueue]), ("cid", [])):
        key = f"jhub/jupyter-{user}"
        event(state, pod_json(user, f"uid-{user}"), key)
        event(state, pod_json(user, f"uid-{user}", conditions=conditions), key)
        event(state, None, key)
    stops = {user: events.last_stops[(user, "")] for user in ("ann", "bob", "cid")}
    assert stops["ann"].reason == "preempted"
    assert "preempted it to make room" in stops["ann"].text
    assert "higher priority pod" in stops["ann"].text
    assert stops["bob"].reason == "evicted"
    assert "Kueue" in stops["bob"].text
    assert stops["cid"].reason == "hub"
    assert "through the hub" in stops["cid"].text
    # a pod whose profile the policy no longer has (the hub restarted with a new policy)
    gone = pod_json("dan", "uid-dan")
    gone["metadata"]["labels"] = {
        k: ("removed" if k.endswith("/profile") else v)
        for k, v in gone["metadata"]["labels"].items()
    }
    event(state, gone, "jhub/jupyter-dan")
    event(state, None, "jhub/jupyter-dan")
    assert events.last_stops[("dan", "")].reason == "policy"


async def test_the_services_own_stop_is_recorded_once_with_its_rule(database):
    state, events = wired(database, lambda: NOW.timestamp())
    event(state, pod_json("ann", "u1"), "jhub/jupyter-ann")
    # the service asks the hub; the pod's end arrives before the hub's answer
    events.stopping("ann", "", "idle", "u1")
    event(state, None, "jhub/jupyter-ann")
    events.stopped("ann", "")
    assert events.last_stops[("ann", "")].reason == "idle"
    assert (
        await events.run() == "read 0 last stop(s) and 0 notice(s); 0 notice(s), 1 stop(s) written"
    )
    # and the other way round: the hub answers first
    event(state, pod_json("ann", "u2"), "jhub/jupyter-ann")
    events.stopping("ann", "", "max_runtime", "u2")
    events.stopped("ann", "")
    event(state, None, "jhub/jupyter-ann")
    assert events.last_stops[("ann", "")].reason == "max_runtime"
    assert "1 stop(s) written" in await events.run()
    store = EventStore(UsageStore(database))
    assert [s.reason for s in store.last_stops(0).values()] == ["max_runtime"]


async def test_after_a_restart_the_server_is_told_why_it_last_stopped(database):
    clock = [NOW.timestamp()]
    state, events = wired(database, lambda: clock[0])
    event(state, pod_json("ann", "u1"), "jhub/jupyter-ann")
    stop_at = NOW + timedelta(seconds=25)
    state.notice(
        Notice(
            at=NOW,
            text="ann's server in lab is idle; it will be stopped",
            group="lab",
            user="ann",
            server="",
            kind="idle",
            stop_at=stop_at,
        )
    )
    assert [n["kind"] for n in answer(state, events)["notices"]] == ["idle"]
    events.stopping("ann", "", "idle", "u1")
    events.stopped("ann", "")
    await events.run()

    # a new service (and a new hub): nothing in memory, the database remembers
    clock[0] += 600
    state, events = wired(database, lambda: clock[0])
    assert answer(state, events)["last_stop"] is None
    said = await events.run()
    assert said.startswith("read 1 last stop(s) and 1 notice(s)")
    told = answer(state, events)
    assert told["last_stop"]["reason"] == "idle"
    assert "idle" in told["last_stop"]["text"]
    assert told["last_stop"]["what_to_do"].startswith("Start the server again")
    (notice,) = told["notices"]
    assert notice["stop_at"] == stop_at.timestamp()
    # another user's server is told nothing of ann's
    assert answer(state, events, "bob")["last_stop"] is None


async def test_a_write_the_database_refuses_is_kept_for_the_next_run(database):
    state, events = wired(database, lambda: NOW.timestamp())
    await events.run()
    event(state, pod_json("ann", "u1"), "jhub/jupyter-ann")
    event(state, None, "jhub/jupyter-ann")
    engine = events.store.usage.engine
    # the database's file is out of reach for a while (its volume gone)
    events.store.usage.engine = create_engine("sqlite:////nonexistent/usage.sqlite")
    with pytest.raises(AccountingUnavailable, match="nonexistent"):
        await events.run()
    events.store.usage.engine = engine
    assert "1 stop(s) written" in await events.run()
    assert set(EventStore(UsageStore(database)).last_stops(0)) == {("ann", "")}


def test_the_tables_are_there_for_a_reader_that_comes_first(database):
    # the hub reads before the service ever wrote: an empty answer, not an error
    assert asyncio.run(asyncio.to_thread(EventStore(UsageStore(database)).last_stops, 0)) == {}
