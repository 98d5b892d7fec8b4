"""The service stops a server only if it is still the one a rule judged (pure): the
hub's answer right before the stop and the service's own view of the pods decide."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from types import SimpleNamespace

from jupyterhub.utils import isoformat

from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.core.shaping import CHARGE_ANNOTATION, GROUP_LABEL, SPAWN_ANNOTATION
from jupyterhub_gpu.service.budget_rules import BudgetRule
from jupyterhub_gpu.service.gpu_time import GPUTimeSnapshot
from jupyterhub_gpu.service.hours import HoursView
from jupyterhub_gpu.service.runtime_rules import SAME_SERVER_SLACK, not_the_judged_server
from jupyterhub_gpu.service.state import ServiceState, server_pod

CREATED = datetime(2026, 11, 25, 14, 0, 7, tzinfo=UTC)


def pod_of(
    uid: str,
    created: datetime = CREATED,
    user: str = "ann",
    name: str = "jupyter-ann",
    spawn: datetime | None = None,
):
    """A server pod as the API gives it; ``spawn``: the start that made it, as the
    spawner writes it (None: a pod made before it did)."""
    request = Request(gpus=Fraction(1), cpu=1000, memory=2**30, devices=(("h200", 1),))
    annotations = {
        CHARGE_ANNOTATION: json.dumps({"user": user, "request": request.to_json()}),
        "hub.jupyter.org/username": user,
    }
    if spawn is not None:
        annotations[SPAWN_ANNOTATION] = isoformat(spawn.replace(tzinfo=None))
    return server_pod(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": uid,
                "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "labels": {GROUP_LABEL: "course"},
                "annotations": annotations,
            },
            "spec": {"containers": []},
            "status": {"phase": "Running"},
        }
    )


def hub_server(started: datetime | str | None) -> dict:
    """The hub's model of a server (``started`` as the REST API writes it)."""
    if isinstance(started, datetime):
        started = isoformat(started.replace(tzinfo=None))
    return {"name": "", "started": started, "ready": True, "pending": None}


def test_the_start_that_made_the_judged_pod_is_stopped_another_is_not():
    """The pod says which start of its server made it; the hub's answer says which
    start runs now: equal, stopped; not, left alone, however close in time, whatever
    the service's view shows."""
    spawn = CREATED - timedelta(seconds=0.4321)
    judged = pod_of("A", spawn=spawn)
    again = pod_of("B", CREATED + timedelta(seconds=2), spawn=spawn + timedelta(seconds=1.5))
    assert not_the_judged_server(hub_server(spawn), judged, None) is None
    # the hub's start is the authority: a view showing another pod does not count
    assert not_the_judged_server(hub_server(spawn), judged, {again.key: again}) is None
    # a restart a second and a half later, within any slack for clocks
    why = not_the_judged_server(hub_server(spawn + timedelta(seconds=1.5)), judged, None)
    assert why == (
        "the hub's server started at 14:00:08 UTC, the judged pod ns/jupyter-ann was made "
        "by its start at 14:00:06 UTC: it was started again since"
    )
    # a start before the judged pod's (a view of the hub behind): not the one judged either
    assert not_the_judged_server(hub_server(spawn - timedelta(hours=1)), judged, None)


def test_without_the_start_on_the_pod_the_start_must_not_be_after_its_creation():
    judged = pod_of("A")
    # the hub notes the start before the pod is made; the pod's time is in whole seconds
    for started in (
        CREATED - timedelta(seconds=40),
        CREATED - timedelta(seconds=0.3),
        CREATED + timedelta(seconds=0.9),
        CREATED + timedelta(seconds=SAME_SERVER_SLACK),
    ):
        assert not_the_judged_server(hub_server(started), judged, None) is None
        assert not_the_judged_server(hub_server(started), judged, {judged.key: judged}) is None
    # a hub that writes its times without a zone writes UTC
    assert not_the_judged_server(hub_server("2026-11-25T14:00:05.123456"), judged, None) is None


def test_without_the_start_on_the_pod_a_later_start_is_another():
    judged = pod_of("A")
    why = not_the_judged_server(hub_server(CREATED + timedelta(seconds=30)), judged, None)
    assert why == (
        "the hub's server started at 14:00:37 UTC, after the judged pod ns/jupyter-ann was "
        "created (14:00:07 UTC): it was started again since"
    )
    assert not_the_judged_server(None, judged, None) == "the hub has no such server running now"


def test_without_the_start_on_the_pod_the_services_view_shows_a_new_pod():
    judged = pod_of("A")
    again = pod_of("B", CREATED + timedelta(seconds=2))  # a quick restart, within the slack
    other = pod_of("C", user="bob", name="jupyter-bob")
    started = hub_server(CREATED)
    assert not_the_judged_server(started, judged, {again.key: again, other.key: other}) == (
        "its pod is now ns/jupyter-ann (uid B), not the judged one (uid A): it was started "
        "again since"
    )
    # the judged pod still there, or no pod of the server in view: the hub's answer decides
    assert not_the_judged_server(started, judged, {judged.key: judged, other.key: other}) is None
    assert not_the_judged_server(started, judged, {other.key: other}) is None
    # a view that may be behind is not asked
    assert not_the_judged_server(started, judged, None) is None
    # no start time from the hub: the view decides
    assert not_the_judged_server(hub_server(None), judged, {again.key: again}) is not None


async def test_a_new_pod_of_a_server_told_of_its_used_up_budget_is_told_anew():
    """The budget rule remembers whom it told by pod: a server started again (a new
    pod of the same name) gets its own notice and grace, not the old pod's."""
    policy = parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"small": {"gpu": {"flavor": "h200"}}},
        groups={
            "course": {
                "quota": {"gpus": 2},
                "profiles": ["small"],
                "budget": {
                    "gpu_hours": 1,
                    "period": "1h",
                    "when_exhausted": "stop",
                    "grace": "60s",
                },
            }
        },
    )
    state = ServiceState(policy)
    clock = [1_800_000_000.0]
    snapshot = GPUTimeSnapshot(
        groups={"course": HoursView(2.0, 1.0, 3600, exhausted=True)}, read_at=clock[0]
    )
    gpu_time = SimpleNamespace(snapshot=snapshot, clock=lambda: clock[0])
    stopped = []

    async def stop(user, name, reason, pod=None):
        stopped.append(pod.uid)

    rule = BudgetRule(policy, state, gpu_time, stop)
    old = pod_of("A")
    state.server_pods_listed({old.key: old})
    await rule.run()
    assert rule.scheduled_stop(old) == (clock[0] + 60, "course")
    clock[0] += 61
    await rule.run()
    assert stopped == ["A"]
    # A went; the server started again: pod B, same name
    new = pod_of("B", CREATED + timedelta(minutes=2))
    state.server_pods_listed({new.key: new})
    await rule.run()
    assert stopped == ["A"]
    assert rule.scheduled_stop(new) == (clock[0] + 60, "course")
    told = [n.text for n in state.notices if n.text.startswith("GPU budget used up")]
    assert len(told) == 2
    clock[0] += 61
    await rule.run()
    assert stopped == ["A", "B"]
