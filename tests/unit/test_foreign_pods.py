"""Pods whose labels cannot be true never cost a real server (pure: the core's rules and
the service's state, fed pods as the API server lists them).

Whoever may create pods in a namespace can write any group label, charge annotation,
user and server. Reproduced in the demo: a pod made beside research-1's running
server, copying its pod's annotations (which start made it included), took the
server's place in the service's view; the idle rule judged the copy (its GPU unused)
and stopped research-1's server, whose GPU was busy. Here the copy is foreign: it is
charged to nobody, records no GPU time, and no rule judges a server by it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from jupyterhub.utils import isoformat

from jupyterhub_gpu.core.claims import Claim, foreign_namespace, foreign_user, impostors
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.core.shaping import (
    CHARGE_ANNOTATION,
    GROUP_LABEL,
    HUB_LABEL,
    SPAWN_ANNOTATION,
)
from jupyterhub_gpu.service.idle import IdleServers
from jupyterhub_gpu.service.orphans import OrphanPods
from jupyterhub_gpu.service.page import render_page
from jupyterhub_gpu.service.state import ServiceState
from jupyterhub_gpu.service.views import Server, Viewer, usage_view

HUB = "jhub"


def policy(per_group: bool = False):
    return parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"gpu": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}},
        groups={
            "research": {
                "quota": {"gpus": 4},
                "profiles": ["gpu"],
                "idle": {"after": "1m", "gpu_utilization_below": 5},
                "per_user": {"budget": {"gpu_hours": 1, "period": "1h"}},
            },
            "students": {"quota": {"gpus": 1}, "profiles": ["gpu"], "max_runtime": "1h"},
        },
        namespace_per_group=per_group,
        namespace_prefix="gpu-",
    )


NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=30, microseconds=123456)


def when(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def server_pod(
    name: str,
    user: str = "research-1",
    group: str = "research",
    *,
    namespace: str = HUB,
    created: datetime = STARTED + timedelta(seconds=2),
    spawn: datetime | None = STARTED,
    uid: str | None = None,
    servername: str = "",
    charged_user: str | None = None,
) -> dict:
    """A server pod as the API server lists it, labelled as the spawner labels one."""
    request = Request(gpus=Fraction(1), cpu=1000, memory=2**30, devices=(("h200", 1),))
    annotations = {
        "hub.jupyter.org/username": user,
        CHARGE_ANNOTATION: json.dumps({"user": charged_user or user, "request": request.to_json()}),
    }
    if servername:
        annotations["hub.jupyter.org/servername"] = servername
    if spawn is not None:
        annotations[SPAWN_ANNOTATION] = isoformat(spawn)
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "creationTimestamp": when(created),
            "labels": {"component": "singleuser-server", GROUP_LABEL: group, HUB_LABEL: HUB},
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {"name": "notebook", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
            ],
        },
        "status": {"phase": "Running", "startTime": when(created + timedelta(seconds=1))},
    }


def hub_server(user: str = "research-1", name: str = "", started=STARTED) -> Server:
    return Server(
        user=user,
        name=name,
        group=None,
        profile=None,
        started=started,
        ready=True,
        pending=None,
        last_activity=NOW,
    )


def state_of(pods: list[dict], servers: list[Server], per_group: bool = False) -> ServiceState:
    state = ServiceState(policy(per_group), hub_namespace=HUB)
    items = {}
    for pod in pods:
        found = state.server_pod(pod)
        if found is not None:
            items[found.key] = found
    state.server_pods_listed(items)
    state.set_servers(servers)
    return state


def add(state: ServiceState, pod: dict) -> None:
    """A watch's ADDED event, as the reflector hands it on."""
    found = state.server_pod(pod)
    assert found is not None
    assert state.server_pods is not None
    state.server_pods[found.key] = found
    state.server_pod_event(found.key, None, found)


def remove(state: ServiceState, key: str) -> None:
    assert state.server_pods is not None
    old = state.server_pods.pop(key)
    state.server_pod_event(key, old, None)


REAL = f"{HUB}/jupyter-research-1"
COPY = f"{HUB}/copy"


# ---- the core's rules ----------------------------------------------------------------


def test_a_pod_counts_for_a_group_only_where_its_servers_run():
    per_group = policy(per_group=True)
    assert foreign_namespace(per_group, "research", "gpu-research", HUB) is None
    # the hub's own namespace: servers from before a namespace per group run there
    assert foreign_namespace(per_group, "research", HUB, HUB) is None
    why = foreign_namespace(per_group, "research", "gpu-students", HUB)
    assert why == (
        "labelled for research, whose servers run in namespace gpu-research, not in gpu-students"
    )
    shared = policy()
    assert foreign_namespace(shared, "research", HUB, HUB) is None
    assert "run in namespace jhub, not in elsewhere" in foreign_namespace(
        shared, "research", "elsewhere", HUB
    )
    assert foreign_user("research-1", "research-1") is None
    assert foreign_user("research-2", "research-1") == (
        "its charge names research-1 while it says it is research-2's server"
    )


def test_of_the_pods_naming_one_start_of_a_server_the_first_made_is_its_pod():
    first = Claim("ns/real", STARTED + timedelta(seconds=2), STARTED)
    copy = Claim("ns/copy", STARTED + timedelta(minutes=5), STARTED)
    unsaid = Claim("ns/unsaid", STARTED + timedelta(minutes=6), None)
    later = Claim("ns/later", STARTED + timedelta(minutes=7), STARTED + timedelta(minutes=1))
    earlier = Claim("old/earlier", STARTED - timedelta(hours=1), STARTED - timedelta(hours=1))
    found = impostors([copy, first, unsaid, later, earlier], STARTED, "ann")
    assert set(found) == {"ns/copy", "ns/unsaid", "ns/later"}
    assert (
        found["ns/copy"] == "it names ann's server, whose pod is ns/real (made first by that start)"
    )
    assert "never made" in found["ns/later"]
    assert "says no start of it" in found["ns/unsaid"]
    # an earlier start's pod in the server's own namespace would have had its pod's name
    beside = Claim("ns/beside", earlier.created, earlier.spawn_started)
    assert (
        "which would have had its name" in impostors([first, beside], STARTED, "ann")["ns/beside"]
    )
    # where the hub has no such server (or has not answered yet), only copies of one
    # start are told apart; the rest is the orphan rule's
    assert set(impostors([copy, first], None, "ann")) == {"ns/copy"}
    assert impostors([first, unsaid, later], None, "ann") == {}
    # made in the same second: neither can be told for the server's
    twin = Claim("ns/twin", first.created, STARTED)
    assert set(impostors([first, twin], STARTED, "ann")) == {"ns/real", "ns/twin"}
    # a server from before starts were written down: its pod says none
    assert impostors([Claim("ns/old", STARTED, None)], STARTED, "ann") == {}


# ---- the service's state -------------------------------------------------------------


def test_a_copy_of_a_running_servers_pod_is_charged_to_nobody_and_never_its_pod():
    state = state_of(
        [server_pod("jupyter-research-1"), server_pod("copy", created=NOW)],
        [hub_server()],
    )
    assert state.pod_of("research-1", "").key == REAL
    assert set(state.ledger.charges) == {REAL}
    assert state.ledger.usage("research").gpus == 1
    assert state.ledger.user_usage("research-1", "research").servers == 1
    copy = state.server_pods[COPY]
    assert copy.charge is None
    assert copy.usage is None
    assert copy.user is None
    assert copy.foreign == (
        "it names research-1's server, whose pod is jhub/jupyter-research-1 (made first by "
        "that start)"
    )
    (shown,) = state.snapshot([]).foreign_pods
    assert shown["pod"] == COPY
    assert shown["user"] == "research-1"
    assert shown["group"] == "research"
    # the hub's server is joined to its own pod
    (joined,) = state.servers
    assert joined.group == "research"


def test_a_copy_made_while_the_server_runs_changes_nothing_and_is_forgotten_when_gone():
    state = state_of([server_pod("jupyter-research-1")], [hub_server()])
    ended = []
    state.on_pod_gone = ended.append
    add(state, server_pod("copy", created=NOW))
    assert state.pod_of("research-1", "").key == REAL
    assert set(state.ledger.charges) == {REAL}
    assert set(state.foreign) == {COPY}
    remove(state, COPY)
    assert state.foreign == {}
    assert set(state.ledger.charges) == {REAL}
    # the copy's end is no stop of research-1's server
    assert [p for p in ended if p.user is not None] == []


def test_a_copy_labelled_for_another_user_charges_nobody():
    # the demo's: research-1's annotations, research-2's name on it
    state = state_of(
        [
            server_pod("jupyter-research-1"),
            server_pod("copy", user="research-2", charged_user="research-1", created=NOW),
        ],
        [hub_server()],
    )
    assert set(state.ledger.charges) == {REAL}
    assert "its charge names research-1" in state.server_pods[COPY].foreign


def test_a_pod_labelled_for_a_group_outside_its_namespace_is_reported_never_charged():
    state = state_of(
        [
            server_pod("jupyter-ann", user="ann", group="students", namespace="gpu-students"),
            # in the students' namespace, labelled for research: research is not charged
            server_pod("fake", user="bob", group="research", namespace="gpu-students"),
            # a server from before the namespace per group: in the hub's, still counted
            server_pod("jupyter-cy", user="cy", group="research", namespace=HUB),
        ],
        [hub_server("ann"), hub_server("bob"), hub_server("cy")],
        per_group=True,
    )
    assert set(state.ledger.charges) == {"gpu-students/jupyter-ann", f"{HUB}/jupyter-cy"}
    assert state.ledger.usage("research").gpus == 1
    assert state.pod_of("bob", "") is None
    (shown,) = state.snapshot([]).foreign_pods
    assert shown["pod"] == "gpu-students/fake"
    assert shown["group"] == "research"
    assert "not in gpu-students" in shown["why"]


def test_once_the_server_is_started_again_its_new_pod_is_its_pod():
    # a stop that failed, then a start in the group's own namespace: the old start's pod
    # is still there, charged until it is gone
    old = server_pod(
        "jupyter-research-1",
        created=STARTED - timedelta(hours=2),
        spawn=STARTED - timedelta(hours=2),
    )
    new = server_pod("jupyter-research-1", namespace="gpu-research")
    state = state_of([old, new], [hub_server()], per_group=True)
    assert set(state.ledger.charges) == {REAL, "gpu-research/jupyter-research-1"}
    assert state.foreign == {}
    assert state.pod_of("research-1", "").key == "gpu-research/jupyter-research-1"


def test_a_copy_naming_a_start_the_hub_never_made_is_told_once_the_hub_answers():
    state = ServiceState(policy(), hub_namespace=HUB)
    later = server_pod("later", created=NOW, spawn=STARTED + timedelta(minutes=1))
    pods = [server_pod("jupyter-research-1"), server_pod("copy", created=NOW), later]
    state.server_pods_listed({p.key: p for p in map(state.server_pod, pods)})
    # before the hub's answer, the copy of the same start is told already
    assert set(state.ledger.charges) == {REAL, f"{HUB}/later"}
    state.set_servers([hub_server()])
    assert set(state.ledger.charges) == {REAL}
    assert state.ledger.user_usage("research-1", "research").gpus == 1
    assert "never made" in state.server_pods[f"{HUB}/later"].foreign
    # the server stopped: the hub's start no longer tells the later one apart (an orphan)
    state.set_servers([])
    assert set(state.ledger.charges) == {REAL, f"{HUB}/later"}
    assert set(state.foreign) == {COPY}


async def test_the_idle_rule_judges_the_servers_own_pod_not_a_copy():
    state = state_of(
        [server_pod("jupyter-research-1"), server_pod("copy", created=NOW - timedelta(minutes=5))],
        [hub_server()],
    )
    stops = []

    async def stop(user, name, reason, pod=None):
        stops.append((user, name, reason, pod.key if pod else None))

    class Busy:
        """Prometheus: the server's GPU busy, the copy's unused."""

        async def query(self, promql: str) -> list[dict]:
            percent = {"jupyter-research-1": 90.0, "copy": 0.0}
            return [
                {"metric": {"namespace": HUB, "pod": pod}, "value": [0, str(value)]}
                for pod, value in percent.items()
            ]

    idle = IdleServers(state.policy, state, stop, Busy(), 0)
    for _ in range(3):
        await idle.run(NOW)
    assert stops == []


async def test_a_copy_is_never_deleted_as_an_orphan_nor_the_real_server():
    state = state_of(
        [server_pod("jupyter-research-1"), server_pod("copy", created=NOW - timedelta(hours=1))],
        [hub_server()],
    )
    state.servers_asked_at = NOW.timestamp()
    deleted = []

    async def delete(namespace, name, uid):
        deleted.append((namespace, name, uid))

    orphans = OrphanPods(state, delete, grace=0, clock=lambda: NOW.timestamp())
    await orphans.run()
    await orphans.run()
    assert deleted == []
    assert orphans.orphans == []


def test_admins_see_foreign_pods_on_the_dashboard_and_others_do_not():
    state = state_of(
        [server_pod("jupyter-research-1"), server_pod("copy", created=NOW)], [hub_server()]
    )
    task = {
        "name": "watch server pods",
        "ok": True,
        "consecutive_failures": 0,
        "last_error": None,
        "last_error_at": None,
        "last_success": None,
        "last_result": "",
    }
    snapshot = state.snapshot([task])

    admin = usage_view(state.policy, snapshot, Viewer("root", admin=True), NOW)
    assert [p["pod"] for p in admin["foreign_pods"]] == [COPY]
    member = Viewer("research-1", groups=frozenset({"research"}))
    assert usage_view(state.policy, snapshot, member, NOW)["foreign_pods"] == []
    page = render_page(admin, "GPU usage")
    assert "Foreign pods" in page
    assert COPY in page
