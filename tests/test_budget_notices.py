"""One notice and one grace per used-up budget, kept across restarts of the service.

The decision alone (pure): which budget is told, with which grace, and the earliest
announced stop. Then the service's own parts without a cluster or a hub, on a clock
the test holds: its state fed the server pods' JSON, its GPU-time pass writing and
reading a real sqlite usage database, its server events and budget rule as the
service wires them; a restart is all of them made anew on the same database, and a
stop is what the service would ask the hub (the pod then goes).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from jupyterhub_gpu.accounting.events import BudgetToldStore, EventStore
from jupyterhub_gpu.accounting.store import AccountingUnavailable, UsageStore
from jupyterhub_gpu.core.admission import IN_QUOTA
from jupyterhub_gpu.core.budgets import Told, UsedUp, budget_notices, earliest_stop
from jupyterhub_gpu.core.model import Budget, parse_policy
from jupyterhub_gpu.core.selection import select
from jupyterhub_gpu.core.shaping import shape
from jupyterhub_gpu.service.budget_rules import BudgetRule
from jupyterhub_gpu.service.gpu_time import GPUTime
from jupyterhub_gpu.service.server_events import ServerEvents
from jupyterhub_gpu.service.state import ServiceState

H = 3600.0
DAY = 86400.0
T0 = datetime(2026, 11, 23, 0, 0, tzinfo=UTC).timestamp()

GROUP = ("lab", "")
MEMBER = ("lab", "ann")


def used(key, when="stop", grace=H, owner=None):
    budget = Budget(gpu_hours=10, period=7 * 86400, when_exhausted=when, grace=int(grace))
    return UsedUp(key, owner or key[1] or key[0], budget, 10.0)


# ---- the decision (pure) ------------------------------------------------------------------


def test_a_warn_budget_told_first_gives_no_stop_and_does_not_shorten_a_stop_budgets_grace():
    day0 = budget_notices([used(GROUP, "warn")], [], T0)
    (warned,) = day0.tell
    assert (warned.key, warned.at, warned.stop_at) == (GROUP, T0, None)
    assert (day0.stop, day0.due) == (None, False)
    # two days on, the member's own stop budget is used up too
    day2 = T0 + 2 * DAY
    later = budget_notices([used(GROUP, "warn"), used(MEMBER, "stop", H)], [warned], day2)
    (stopping,) = later.tell
    assert (stopping.key, stopping.at, stopping.stop_at) == (MEMBER, day2, day2 + H)
    assert later.stop == stopping
    assert not later.due
    told = [warned, stopping]
    assert not budget_notices([used(GROUP, "warn"), used(MEMBER)], told, day2 + H - 1).due
    at_stop = budget_notices([used(GROUP, "warn"), used(MEMBER)], told, day2 + H)
    assert (at_stop.tell, at_stop.stop, at_stop.due) == ((), stopping, True)


def test_two_stop_budgets_stop_at_the_earliest_announced_time_never_earlier():
    # the group's (grace 2h) used up first, the member's (grace 30m) an hour later
    first = budget_notices([used(GROUP, grace=2 * H)], [], T0).tell[0]
    assert first.stop_at == T0 + 2 * H
    both = [used(GROUP, grace=2 * H), used(MEMBER, grace=H / 2)]
    decision = budget_notices(both, [first], T0 + H)
    (second,) = decision.tell
    assert second.stop_at == T0 + 1.5 * H
    assert decision.stop == second
    assert not decision.due
    told = [first, second]
    # the old rule took the shortest grace from the first notice: due at T0 + 30m
    for now in (T0 + H + 1, T0 + 1.5 * H - 1):
        assert not budget_notices(both, told, now).due
    assert budget_notices(both, told, T0 + 1.5 * H).due
    # the other way round: a later budget's longer grace does not put off the stop
    first = budget_notices([used(GROUP, grace=H / 2)], [], T0).tell[0]
    both = [used(GROUP, grace=H / 2), used(MEMBER, grace=2 * H)]
    decision = budget_notices(both, [first], T0 + 10 * 60)
    assert decision.tell[0].stop_at == T0 + 10 * 60 + 2 * H
    assert decision.stop == first
    assert budget_notices(both, [first, decision.tell[0]], T0 + H / 2).due


def test_told_is_not_told_again_a_budget_with_room_again_is_forgotten_and_told_anew():
    told = budget_notices([used(GROUP)], [], T0).tell
    # read back after a restart: nothing new to tell, the same stop
    again = budget_notices([used(GROUP)], told, T0 + 600)
    assert (again.tell, again.forget, again.stop) == ((), (), told[0])
    # room again: forgotten; used up again later: a notice and a grace of its own
    room = budget_notices([], told, T0 + 700)
    assert (room.forget, room.stop, room.due) == ((GROUP,), None, False)
    anew = budget_notices([used(GROUP)], [], T0 + 800)
    assert anew.tell[0].stop_at == T0 + 800 + H
    # a stop whose budget has room again when it falls due stops nothing
    assert not budget_notices([used(MEMBER, "warn")], told, T0 + 2 * H).due


def test_a_budget_that_turned_from_warn_to_stop_is_told_anew_as_a_stop():
    warned = budget_notices([used(GROUP, "warn")], [], T0).tell
    decision = budget_notices([used(GROUP, "stop", H)], warned, T0 + 60)
    assert decision.forget == (GROUP,)
    assert [t.stop_at for t in decision.tell] == [T0 + 60 + H]
    assert earliest_stop([*warned, *decision.tell]) == decision.tell[0]
    assert earliest_stop(warned) is None


def test_a_budget_with_no_grace_is_due_at_its_notice():
    decision = budget_notices([used(GROUP, grace=0)], [], T0)
    assert decision.tell[0].stop_at == T0
    assert decision.due
    stopped = Told(GROUP, T0 - 60, T0 - 1, stop_said=T0 - 1)
    assert budget_notices([used(GROUP)], [stopped], T0).stop == stopped


# ---- the service's parts, on a held clock and a real usage database ------------------------

POLICY = parse_policy(
    flavors={"a100": {"kind": "gpu"}},
    profiles={"one": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "a100"}}},
    groups={
        "lab": {
            "display_name": "Lab",
            "quota": {"gpus": 4},
            "profiles": ["one"],
            # used up by one GPU in 10 hours: told, never stopped
            "budget": {"gpu_hours": 10, "period": "7d"},
            # a member's own: used up by one GPU in 2 days, then an hour's grace
            "per_user": {
                "budget": {"gpu_hours": 48, "period": "7d", "when_exhausted": "stop", "grace": "1h"}
            },
        },
        "course": {
            "display_name": "Course",
            "quota": {"gpus": 4},
            "profiles": ["one"],
            # used up in 10 hours, stops 3 hours later
            "budget": {"gpu_hours": 10, "period": "7d", "when_exhausted": "stop", "grace": "3h"},
            # used up in 12 hours, stops 30 minutes later: before the group's
            "per_user": {
                "budget": {
                    "gpu_hours": 12,
                    "period": "7d",
                    "when_exhausted": "stop",
                    "grace": "30m",
                }
            },
        },
    },
)


def pod_json(user: str, group: str, uid: str, started: float) -> dict:
    selection = select(POLICY, [group], {"profile": f"{group}--one"})
    shaped = shape(POLICY, selection, IN_QUOTA, username=user)
    at = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {
            "name": f"jupyter-{user}",
            "namespace": "jhub",
            "uid": uid,
            "creationTimestamp": at,
            "labels": {"component": "singleuser-server", **shaped.labels},
            "annotations": {"hub.jupyter.org/username": user, **shaped.annotations},
        },
        "spec": {"containers": [{"name": "notebook"}]},
        "status": {"phase": "Running", "startTime": at},
    }


class Service:
    """The service's GPU-time pass, server events and budget rule, wired as the service
    wires them, on ``clock``; ``pods``: the server pods the cluster has (shared by
    every life of the service, as the cluster is)."""

    def __init__(self, database: str, clock: list[float], pods: dict[str, dict]) -> None:
        self.clock = clock
        self.pods = pods
        self.state = ServiceState(POLICY, hub_namespace="jhub")
        self.store = UsageStore(database)
        self.gpu_time = GPUTime(POLICY, self.state, self.store, clock=lambda: clock[0])
        events = EventStore(self.store)
        self.events = ServerEvents(POLICY, events, clock=lambda: clock[0])
        self.state.on_notice = self.events.notice
        self.stops: list[tuple[str, float]] = []
        self.rule = BudgetRule(
            POLICY, self.state, self.gpu_time, self.stop, BudgetToldStore(events)
        )

    async def stop(self, user, name, reason, pod=None):
        assert reason == "budget"
        self.stops.append((user, self.clock[0]))
        del self.pods[pod.key]  # the hub stops it: its pod goes
        return None

    async def run(self, at: float) -> None:
        """One pass at ``at``: the pods as listed now, GPU time, the budgets, the
        notices written."""
        self.clock[0] = at
        listed = {}
        for body in self.pods.values():
            pod = self.state.server_pod(body)
            assert pod is not None
            listed[pod.key] = pod
        self.state.server_pods_listed(listed)
        await self.gpu_time.record()
        await self.rule.run()
        await self.events.run()

    def told(self) -> list[str]:
        """The notices this life gave."""
        return [n.text for n in self.state.notices]

    def close(self) -> None:
        self.store.dispose()


@pytest.fixture
def database(tmp_path):
    return f"sqlite:///{tmp_path / 'usage.sqlite'}"


def start(pods: dict, user: str, group: str, uid: str, at: float) -> None:
    body = pod_json(user, group, uid, at)
    pods[f"jhub/{body['metadata']['name']}"] = body


def clock_of(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def stored_notices(database: str) -> list[str]:
    store = UsageStore(database)
    try:
        return [n.message for n in EventStore(store).recent_notices(0)]
    finally:
        store.dispose()


async def test_a_warn_budget_on_day_0_leaves_a_member_stop_budget_its_grace_on_day_2(database):
    clock, pods = [T0], {}
    start(pods, "ann", "lab", "u-ann", T0)
    service = Service(database, clock, pods)
    await service.run(T0)
    assert service.told() == []
    # 10 hours in: the group's warn budget is used up
    await service.run(T0 + 10 * H)
    (warned,) = service.told()
    assert warned == (
        "GPU budget used up: Lab used 10 of 10 GPU-hours in the last 7 days; new GPU "
        "servers are refused until some of it is free again; ann's server keeps running"
    )
    # day 2: ann's own stop budget is used up, told with its own grace and numbers
    day2 = T0 + 48 * H
    await service.run(day2)
    assert service.stops == []
    stop_notice = service.told()[1]
    assert stop_notice == (
        "GPU budget used up: ann in Lab used 48 of 48 GPU-hours in the last 7 days; "
        f"ann's server stops at {clock_of(day2 + H)}, in 1 hour: save your work"
    )
    await service.run(day2 + H - 60)
    assert service.stops == []
    await service.run(day2 + H)
    assert service.stops == [("ann", day2 + H)]
    assert service.told()[2].startswith(
        "Stopping ann's server: ann in Lab used 49 of 48 GPU-hours in the last 7 days, "
        "and the 1 hour it had after the notice at "
    )
    assert len(service.told()) == 3
    assert stored_notices(database) == service.told()
    service.close()


async def test_two_stop_budgets_each_told_with_its_grace_stop_at_the_earliest_announced(
    database,
):
    clock, pods = [T0], {}
    start(pods, "bea", "course", "u-bea", T0)
    service = Service(database, clock, pods)
    for hour in range(0, 13):
        await service.run(T0 + hour * H)
    # 10 h: the group's (stop at 13 h); 12 h: bea's own (30 m: stop at 12 h 30)
    group_notice, own_notice = service.told()
    assert group_notice == (
        "GPU budget used up: Course used 10 of 10 GPU-hours in the last 7 days; "
        f"bea's server stops at {clock_of(T0 + 13 * H)}, in 3 hours: save your work"
    )
    assert own_notice == (
        "GPU budget used up: bea in Course used 12 of 12 GPU-hours in the last 7 days; "
        f"bea's server stops at {clock_of(T0 + 12.5 * H)}, in 30 minutes: save your work"
    )
    assert service.rule.scheduled_stop(service.state.server_pods["jhub/jupyter-bea"]) == (
        T0 + 12.5 * H,
        "bea in Course",
    )
    await service.run(T0 + 12.5 * H - 1)
    assert service.stops == []
    await service.run(T0 + 12.5 * H)
    assert service.stops == [("bea", T0 + 12.5 * H)]
    assert service.told()[2].startswith("Stopping bea's server: bea in Course used 12.5 of 12")
    service.close()


async def test_a_restart_during_the_grace_neither_tells_again_nor_forgets_the_stop(database):
    clock, pods = [T0], {}
    start(pods, "ann", "lab", "u-ann", T0)
    first = Service(database, clock, pods)
    for at in (T0, T0 + 10 * H, T0 + 48 * H):
        await first.run(at)
    warned, told = first.told()
    assert told.endswith(
        f"ann's server stops at {clock_of(T0 + 49 * H)}, in 1 hour: save your work"
    )
    first.close()
    # the service restarts 20 minutes into the grace: a new process, the same database
    second = Service(database, clock, pods)
    await second.run(T0 + 48 * H + 20 * 60)
    assert second.told() == []
    pod = second.state.server_pods["jhub/jupyter-ann"]
    assert second.rule.scheduled_stop(pod) == (T0 + 49 * H, "ann in Lab")
    await second.run(T0 + 49 * H - 1)
    assert second.stops == []
    await second.run(T0 + 49 * H)
    assert second.stops == [("ann", T0 + 49 * H)]
    (stopping,) = second.told()
    assert stopping.startswith("Stopping ann's server: ann in Lab used 49 of 48 GPU-hours")
    assert stored_notices(database) == [warned, told, stopping]
    second.close()


async def test_a_service_killed_in_a_loop_still_stops_at_the_announced_time(database):
    """Each life of the service lasts one pass, killed before its notices are written:
    the old rule told every life anew with a fresh grace and never stopped anyone."""
    clock, pods = [T0], {}
    start(pods, "ann", "lab", "u-ann", T0)
    told: list[tuple[float, str]] = []
    stops: list[tuple[str, float]] = []
    t = T0
    while pods and t < T0 + 60 * H:
        t += 30 * 60
        life = Service(database, clock, pods)
        clock[0] = t
        life.state.server_pods_listed({k: life.state.server_pod(b) for k, b in pods.items()})
        await life.gpu_time.record()
        await life.rule.run()
        told += [(t, text) for text in life.told()]
        stops += life.stops
        life.close()
    assert [(at - T0) / H for at, _ in told] == [10, 48, 49]
    assert told[1][1].endswith(
        f"ann's server stops at {clock_of(T0 + 49 * H)}, in 1 hour: save your work"
    )
    assert stops == [("ann", T0 + 49 * H)]


async def test_a_database_that_cannot_be_read_tells_nobody_and_stops_nothing(database):
    clock, pods = [T0], {}
    start(pods, "bea", "course", "u-bea", T0)
    service = Service(database, clock, pods)
    await service.run(T0 + 10 * H)
    assert len(service.told()) == 1
    await service.run(T0 + 12 * H)
    assert len(service.told()) == 2
    # the usage database goes before the stop falls due: the GPU-time pass fails first
    told_store = service.rule.store
    told_store.events.usage.engine = UsageStore("sqlite:////nonexistent/usage.sqlite").engine
    clock[0] = T0 + 13 * H
    with pytest.raises(AccountingUnavailable, match=re.escape("nonexistent")):
        await service.rule.run()
    assert service.stops == []
    assert len(service.told()) == 2
    service.close()


# ---- the table, on each database the usage store runs on ------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'usage.sqlite'}"
        return
    from jupyterhub_gpu_dev.postgres import throwaway_postgres

    with throwaway_postgres("told") as url:
        yield url


def test_what_was_told_is_kept_once_per_pod_and_budget_the_first_telling_stands(any_database):
    """Two services telling at once (an old one still stopping, a new one started): the
    first row stands, and the second is told it added nothing, so it gives no notice."""
    from jupyterhub_gpu.accounting.events import ToldRow

    stores = [UsageStore(any_database) for _ in range(2)]
    first, second = (BudgetToldStore(EventStore(s)) for s in stores)
    group = ToldRow("uid-a", "ann", "", Told(GROUP, T0, T0 + H))
    own = ToldRow("uid-a", "ann", "", Told(MEMBER, T0, None))
    assert first.write([group, own], [], [], []) == {("uid-a", GROUP), ("uid-a", MEMBER)}
    later = ToldRow("uid-a", "ann", "", Told(GROUP, T0 + 60, T0 + 60 + H))
    other = ToldRow("uid-b", "bob", "gpu", Told(GROUP, T0 + 60, T0 + 60 + H))
    assert second.write([later, other], [], [], [("uid-a", GROUP, T0 + H)]) == {("uid-b", GROUP)}
    rows = {(r.pod, r.told.key): r for r in second.read()}
    assert rows[("uid-a", GROUP)].told == Told(GROUP, T0, T0 + H, stop_said=T0 + H)
    assert rows[("uid-a", MEMBER)].told == own.told
    assert rows[("uid-b", GROUP)] == other
    # room again for ann's own budget; bob's pod gone
    first.write([], [("uid-a", MEMBER)], ["uid-b"], [])
    assert [(r.pod, r.told.key) for r in first.read()] == [("uid-a", GROUP)]
    for s in stores:
        s.dispose()
