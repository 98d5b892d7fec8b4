"""The service's pure parts: what a viewer may see, the page, the runtime rules, backoff."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyterhub_gpu.core.admission import IN_QUOTA, OVER_QUOTA, Charge, Ledger
from jupyterhub_gpu.core.capacity import flavor_capacity
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.service import rules
from jupyterhub_gpu.service.hubapi import servers_from_users
from jupyterhub_gpu.service.page import render_page
from jupyterhub_gpu.service.tasks import (
    BackgroundTask,
    TaskStatus,
    backoff_delay,
    describe_error,
)
from jupyterhub_gpu.service.views import Notice, Server, Snapshot, Viewer, server_view, usage_view

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

POLICY = parse_policy(
    flavors={"h200": {"kind": "gpu"}},
    profiles={"p": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}}, "cpu": {}},
    everyone={"profiles": ["cpu"]},
    groups={
        "alpha": {
            "display_name": "Alpha Lab",
            "quota": {"gpus": 4},
            "limit": {"gpus": 6},
            "profiles": ["p"],
        },
        "beta": {
            "display_name": "Beta Lab",
            "quota": {"gpus": 2, "flavors": {"h200": 2}},
            "max_runtime": "1h",
            "profiles": ["p"],
        },
        "sysadmins": {"admin": True, "unlimited": True, "profiles": ["p"]},
    },
)


def charge(key: str, user: str, group: str, gpus: int = 1, tier: str = IN_QUOTA) -> Charge:
    return Charge(
        key=f"ns/{key}",
        user=user,
        group=group,
        request=Request(gpus=Fraction(gpus), cpu=1000, memory=2**30, devices=(("h200", gpus),)),
        tier=tier,
    )


def server(user: str, group: str, minutes: int, **kw) -> Server:
    return Server(
        user=user,
        name=kw.pop("name", ""),
        group=group,
        profile="p",
        started=NOW - timedelta(minutes=minutes),
        ready=kw.pop("ready", True),
        pending=kw.pop("pending", None),
        has_pod=kw.pop("has_pod", True),
    )


def snapshot() -> Snapshot:
    ledger = Ledger.from_charges(
        POLICY,
        [
            charge("ann", "ann", "alpha", 5, OVER_QUOTA),
            charge("bob", "bob", "beta", 2),
        ],
    )
    return Snapshot(
        ledger=ledger,
        servers=[
            server("ann", "alpha", 10),
            server("bob", "beta", 70),
            server("cid", "beta", 1, pending="spawn", ready=False, has_pod=False),
        ],
        capacity=None,
        notices=[Notice(NOW, "Stopped bob's server in beta", group="beta", user="bob")],
        tasks=[
            TaskStatus(
                "watch nodes", 2.0, runs=3, failures=3, last_error="HTTP 403 nodes in namespace x"
            ).to_json()
        ],
        over_limit={"beta": "Beta Lab uses 3 GPUs, over its limit of 2"},
    )


def test_a_member_sees_only_their_groups_own_servers_and_nothing_else():
    view = usage_view(POLICY, snapshot(), Viewer("ann", groups=frozenset({"alpha"})), NOW)
    raw = json.dumps(view)
    assert [g["name"] for g in view["groups"]] == ["alpha", "everyone"]
    assert [s["user"] for s in view["servers"]] == ["ann"]
    for leaked in ("beta", "Beta", "bob", "cid", "403", "sysadmins"):
        assert leaked not in raw
    assert view["notices"] == []
    assert view["tasks"] == []
    alpha = view["groups"][0]
    assert alpha["gpus"] == {"used": 5, "quota": 4, "limit": 6, "text": "5 of 6"}


def test_groups_the_user_is_in_but_the_policy_lacks_are_ignored():
    viewer = Viewer("eve", groups=frozenset({"not-in-policy"}))
    view = usage_view(POLICY, snapshot(), viewer, NOW)
    assert [g["name"] for g in view["groups"]] == ["everyone"]
    assert view["servers"] == []


def test_hub_admins_and_policy_admin_groups_see_everything():
    for viewer in (Viewer("root", admin=True), Viewer("olga", groups=frozenset({"sysadmins"}))):
        view = usage_view(POLICY, snapshot(), viewer, NOW)
        assert [g["name"] for g in view["groups"]] == ["alpha", "beta", "sysadmins", "everyone"]
        assert {s["user"] for s in view["servers"]} == {"ann", "bob", "cid"}
        assert view["notices"][0]["text"] == "Stopped bob's server in beta"
        assert view["tasks"]
        assert view["admin"] is True


def test_own_notices_runtime_and_queue_position():
    view = usage_view(POLICY, snapshot(), Viewer("cid", groups=frozenset({"beta"})), NOW)
    (mine,) = view["servers"]
    assert mine["queue_position"] == 1
    beta = view["groups"][0]
    assert beta["waiting"] == 1
    assert beta["over_limit"] == "Beta Lab uses 3 GPUs, over its limit of 2"
    assert beta["flavors"] == [
        {
            "flavor": "h200",
            "display_name": "h200",
            "used": 2,
            "quota": 2,
            "limit": 2,
            "text": "2 of 2",
        }
    ]
    bob = usage_view(POLICY, snapshot(), Viewer("bob", groups=frozenset({"beta"})), NOW)
    assert [n["text"] for n in bob["notices"]] == ["Stopped bob's server in beta"]
    assert bob["servers"][0]["runtime_seconds"] == 70 * 60
    assert bob["servers"][0]["stops_in_seconds"] == 0


def test_page_renders_bars_and_escapes_names():
    policy = parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"p": {"gpu": {"flavor": "h200"}}},
        groups={
            "lab": {
                "display_name": "<script>x</script>",
                "quota": {"gpus": 4},
                "limit": {"gpus": 8},
                "profiles": ["p"],
            }
        },
    )
    ledger = Ledger.from_charges(policy, [charge("a", "ann", "lab", 2)])
    nodes = [
        {
            "metadata": {"name": "n0", "labels": {}},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
    ]
    snap = Snapshot(ledger=ledger, servers=[], capacity=flavor_capacity(policy, nodes, []))
    html = render_page(usage_view(policy, snap, Viewer("ann", groups=frozenset({"lab"})), NOW))
    assert "<script>x" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html
    assert "2 of 8 GPUs" in html
    assert 'style="width:25.0%"' in html  # 2 of 8
    assert 'class="quota" style="left:50.0%"' in html  # quota 4 of limit 8
    assert "0 of 8 GPUs in use" in html  # cluster capacity
    assert "8 free on 1 node" in html
    assert "http" not in html.lower().replace('http-equiv="refresh"', "")  # no external assets


def test_page_says_capacity_unknown_rather_than_zero():
    view = usage_view(POLICY, snapshot(), Viewer("ann", groups=frozenset({"alpha"})), NOW)
    assert "Cluster capacity unknown" in render_page(view)


def test_overdue_servers_are_past_their_groups_max_runtime_only():
    servers = [
        server("bob", "beta", 61),
        server("ann", "alpha", 600),  # no max_runtime in alpha
        server("bea", "beta", 59),
        server("cid", "beta", 120, pending="stop"),  # already stopping
        server("dan", "gone", 600),  # group no longer in the policy
    ]
    assert [(s.user, limit) for s, limit in rules.overdue(POLICY, servers, NOW)] == [("bob", 3600)]


def test_over_limit_after_a_policy_change_and_who_to_stop():
    ledger = Ledger.from_charges(
        POLICY,
        [
            charge("b1", "bob", "beta", 1),
            charge("b2", "bea", "beta", 1),
            charge("b3", "cid", "beta", 1),
        ],
    )
    over = rules.over_limit(POLICY, ledger)
    assert over == {"beta": "Beta Lab uses 3 GPUs, over its limit of 2 GPUs"}
    created = {f"ns/b{i}": NOW - timedelta(minutes=10 - i) for i in (1, 2, 3)}
    victims = rules.to_stop_for_limit(POLICY, ledger, "beta", created)
    assert [v.key for v in victims] == ["ns/b3"]  # the youngest, and only as many as needed
    assert rules.over_limit(POLICY, Ledger()) == {}


def test_hub_server_models_become_servers_charged_to_the_profile_group():
    users = [
        {
            "name": "ann",
            "servers": {
                "": {
                    "user_options": {"profile": "alpha--p"},
                    "started": "2026-11-22T11:00:00Z",
                    "ready": True,
                    "pending": None,
                },
                "x": {"user_options": {}, "started": None, "ready": False, "pending": "spawn"},
            },
        }
    ]
    first, second = servers_from_users(users)
    assert (first.group, first.profile, first.started) == (
        "alpha",
        "p",
        datetime(2026, 11, 22, 11, tzinfo=UTC),
    )
    assert (second.group, second.name, second.pending) == (None, "x", "spawn")


def test_backoff_doubles_to_its_cap():
    assert backoff_delay(5, 0, 300) == 5
    assert 8 <= backoff_delay(5, 1, 300) <= 12
    assert 240 <= backoff_delay(5, 10, 300) <= 360


def test_describe_error_names_status_and_fix():
    class Forbidden(Exception):
        status = 403
        reason = "Forbidden"

    text = describe_error(Forbidden('nodes is forbidden: cannot list resource "nodes"'))
    assert text.startswith("HTTP 403 permission denied")
    assert "nodes is forbidden" in text


async def test_a_failing_task_reports_retries_and_recovers():
    calls = []

    async def job():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("hub unreachable")
        return "fine"

    task = BackgroundTask("flaky", job, interval=0.01, max_backoff=0.05)
    task.start()
    try:
        for _ in range(200):
            if task.status.last_success:
                break
            await asyncio.sleep(0.01)
    finally:
        await task.stop()
    status = task.status.to_json()
    assert len(calls) >= 3
    assert status["ok"] is True
    assert status["last_error"] == "RuntimeError: hub unreachable"
    assert status["last_result"] == "fine"
    assert status["consecutive_failures"] == 0


@pytest.mark.parametrize("failures", [1, 3])
async def test_a_task_that_keeps_failing_never_stops_the_loop(failures):
    seen = []
    enough = asyncio.Event()

    def job():
        seen.append(1)
        if len(seen) > failures:
            enough.set()
        raise KeyError("missing")

    task = BackgroundTask("broken", job, interval=0.005, max_backoff=0.01)
    task.start()
    await asyncio.wait_for(enough.wait(), 10)
    await task.stop()
    assert task.status.failures >= failures
    assert task.status.last_error == "KeyError: 'missing'"


def test_admins_page_through_many_servers():
    snap = snapshot()
    snap.servers = [server(f"u{i:04d}", "alpha", 1) for i in range(450)]
    admin = Viewer("root", admin=True)
    first = usage_view(POLICY, snap, admin, NOW)
    assert (len(first["servers"]), first["servers_total"]) == (200, 450)
    last = usage_view(POLICY, snap, admin, NOW, servers_offset=400)
    assert last["servers"][0]["user"] == "u0400"
    assert len(last["servers"]) == 50
    html = render_page(first)
    assert "and 250 more" in html
    # the admin sees the failing watch, with its error and that it is retried
    assert "failing (3 in a row, retrying with backoff)" in html
    assert "HTTP 403 nodes in namespace x" in html


def pod_json(
    name: str, user: str, group: str, gpus: int, *, phase: str = "Running", namespace: str = "ns"
) -> dict:
    from jupyterhub_gpu.core.shaping import CHARGE_ANNOTATION, GROUP_LABEL

    request = Request(gpus=Fraction(gpus), cpu=1000, memory=2**30, devices=(("h200", gpus),))
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {GROUP_LABEL: group},
            "annotations": {
                CHARGE_ANNOTATION: json.dumps({"user": user, "request": request.to_json()}),
                "hub.jupyter.org/username": user,
            },
        },
        "spec": {
            "nodeName": "n0",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 7),  # which pod
            st.sampled_from(["alpha", "beta", "gone"]),
            st.integers(1, 3),
            st.sampled_from(["Running", "Pending", "Succeeded", "deleted"]),
        ),
        max_size=40,
    )
)
def test_watch_events_keep_ledger_and_capacity_equal_to_a_fresh_list(events):
    """Event-by-event updates end where a restarted service's full list starts."""
    from jupyterhub_gpu.kube.reflector import slim_pod
    from jupyterhub_gpu.service.state import ServiceState, server_pod

    live = ServiceState(POLICY)
    pods, _, bound = live.watches(None, None)  # the service's own watches, fed by hand
    node = {
        "metadata": {"name": "n0", "labels": {}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": "64"}},
    }
    live.nodes_changed({"n0": node})
    current: dict[str, dict] = {}
    for reflector in (pods, bound):
        reflector.items = {}
        reflector.on_change(reflector)
    for index, group, gpus, phase in events:
        key = f"ns/p{index}"
        obj = (
            None
            if phase == "deleted"
            else pod_json(f"p{index}", f"u{index}", group, gpus, phase=phase)
        )
        if obj is None:
            current.pop(key, None)
        else:
            current[key] = obj
        for reflector in (pods, bound):
            reflector._set(key, obj)
            reflector.on_change(reflector)

    fresh = ServiceState(POLICY)
    fresh.server_pods_listed({k: server_pod(p) for k, p in current.items()})
    fresh.bound_pods_listed({k: slim_pod(p) for k, p in current.items()})
    fresh.nodes_changed({"n0": node})
    for group in ("alpha", "beta", "gone", "everyone"):
        assert live.ledger.usage(group) == fresh.ledger.usage(group)
    assert live.capacity == fresh.capacity


def test_listen_address_follows_the_service_url():
    from jupyterhub_gpu.service.startup import listen_address

    assert listen_address("127.0.0.1") == "127.0.0.1"
    assert listen_address("localhost") == "127.0.0.1"
    assert listen_address("hub") == ""  # z2jh: http://hub:10101, reached from the proxy pod


HUB_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.spawner_class = "gpu-kubespawner"
c.KubeSpawner.namespace = "jhub"
c.GPUPolicy.update({policy!r})
c.GPUService.rules_interval = 7
"""


def service_from_config(tmp_path, policy: dict):
    from jupyterhub_gpu.service.app import GPUService

    config = tmp_path / "jupyterhub_config.py"
    config.write_text(HUB_CONFIG.format(policy=policy))
    service = GPUService()
    service.initialize(["--config", str(config)])
    return service


def test_the_service_reads_the_hubs_policy_and_its_own_settings_from_the_hub_config(tmp_path):
    values = {
        "flavors": {"h200": {"kind": "gpu"}},
        "profiles": {"p": {"gpu": {"flavor": "h200"}}},
        "groups": {"alpha": {"quota": {"gpus": 3}, "profiles": ["p"]}},
    }
    service = service_from_config(tmp_path, values)
    assert service.policy == parse_policy(**values)
    assert service.rules_interval == 7
    assert service.namespace == "jhub"  # c.KubeSpawner.namespace, as the hub spawns


def test_a_broken_policy_stops_the_service_with_every_error(tmp_path):
    with pytest.raises(SystemExit, match=r"groups\.alpha\.quota\.gpus: expected a number"):
        service_from_config(
            tmp_path,
            {"groups": {"alpha": {"quota": {"gpus": "ten"}}}},
        )
    from jupyterhub_gpu.service.app import GPUService

    with pytest.raises(SystemExit, match="does not exist; pass --config PATH"):
        GPUService().initialize(["--config", str(tmp_path / "missing.py")])


def test_view_json_is_the_view_with_group_parts_encoded_once(tmp_path):
    service = service_from_config(
        tmp_path,
        {
            "flavors": {"h200": {"kind": "gpu"}},
            "profiles": {"p": {"gpu": {"flavor": "h200"}}},
            "groups": {f"g{i}": {"quota": {"gpus": 3}, "profiles": ["p"]} for i in range(5)},
        },
    )
    pods, _, _ = service.make_reflectors(None)
    pods.items = {}
    pods.on_change(pods)
    # in the hub's namespace (c.KubeSpawner.namespace), as the service watches it
    pods._set("jhub/p1", pod_json("p1", "ann", "g1", 2, namespace="jhub"))
    pods.on_change(pods)
    admin = Viewer("root", admin=True)
    first = json.loads(service.view_json(admin))
    assert first == json.loads(json.dumps(service.view(admin)))
    assert first["groups"][1]["gpus"]["used"] == 2
    # a change after the first encoding is seen by the next request
    pods._set("jhub/p1", None)
    pods.on_change(pods)
    assert json.loads(service.view_json(admin))["groups"][1]["gpus"]["used"] == 0


def test_durations_read_as_max_runtime_is_written():
    from jupyterhub_gpu.core.quantities import format_duration, parse_duration

    for written in ("25s", "1m", "1h30m", "8h", "1h1m1s"):
        assert format_duration(parse_duration(written)) == written
    assert [format_duration(s) for s in (25, 60, 5400, 8 * 3600, 0)] == [
        "25s",
        "1m",
        "1h30m",
        "8h",
        "0s",
    ]


async def test_over_limit_stops_are_announced_once_and_forgotten_with_their_pods():
    """The runtime rules keep what they announced only while the pod exists."""
    from jupyterhub_gpu.service.runtime_rules import RuntimeRules
    from jupyterhub_gpu.service.state import ServiceState, server_pod

    state = ServiceState(POLICY)
    pods = {f"ns/b{i}": pod_json(f"b{i}", f"u{i}", "beta", 1) for i in (1, 2, 3)}
    state.server_pods_listed({k: server_pod(p) for k, p in pods.items()})
    state.set_servers([])
    asked: list[tuple[str, str]] = []

    async def stop(user: str, name: str, reason: str, pod=None) -> str | None:
        asked.append((user, reason))
        return None  # the hub stops it later: the pod stays until then

    runtime_rules = RuntimeRules(POLICY, state, stop, stop_over_limit_after=0)
    for second in range(3):  # beta is over its limit of 2 GPUs: its youngest server goes
        await runtime_rules.run(NOW + timedelta(seconds=second))
    stopping = [n.text for n in state.notices if n.text.startswith("Stopping")]
    assert len(stopping) == 1, stopping  # announced once, while the hub is asked each run
    assert len(asked) == 3
    assert len(set(asked)) == 1
    (key,) = runtime_rules.announced_pods

    del pods[key]  # the hub stopped it: its pod is gone
    state.server_pods_listed({k: server_pod(p) for k, p in pods.items()})
    summary = await runtime_rules.run(NOW + timedelta(seconds=3))
    assert summary == "0 stopped, 0 group(s) over limit"
    assert runtime_rules.announced_pods == set()


def test_a_server_without_a_labelled_pod_is_in_no_group_whatever_its_slug_says():
    """max_runtime acts on the pod's group label, never on a parse of the profile slug:
    a server from before the policy whose slug is ``beta--big`` is not beta's."""
    from jupyterhub_gpu.service.state import ServiceState, server_pod

    state = ServiceState(POLICY)
    state.server_pods_listed({"ns/b1": server_pod(pod_json("b1", "bob", "beta", 1))})
    users = [
        {
            "name": name,
            "servers": {
                "": {
                    "user_options": {"profile": "beta--big"},
                    "started": (NOW - timedelta(hours=5)).isoformat(),
                    "ready": True,
                    "pending": pending,
                }
            },
        }
        for name, pending in (("old", None), ("bob", None), ("new", "spawn"))
    ]
    state.set_servers(servers_from_users(users))
    groups = {s.user: s.group for s in state.servers}
    # bob's pod says beta; old's server has no pod of ours; new's spawn waits for one
    assert groups == {"old": None, "bob": "beta", "new": "beta"}
    overdue = rules.overdue(POLICY, state.servers, NOW)
    assert [s.user for s, _ in overdue] == ["bob"]


def test_max_runtime_counts_from_the_pods_start_not_from_the_time_queued():
    """A server that waited four hours in its scheduler's queue (the hub's ``started`` is
    when the spawn began) and has run for 30 minutes is not past beta's 1 h."""
    from jupyterhub_gpu.service.state import ServiceState, server_pod

    state = ServiceState(POLICY)
    pods = {}
    for user, ran in (("queued", 30), ("long", 90)):
        pod = pod_json(f"b-{user}", user, "beta", 1)
        pod["status"]["startTime"] = (NOW - timedelta(minutes=ran)).isoformat()
        pods[f"ns/b-{user}"] = server_pod(pod)
    state.server_pods_listed(pods)
    spawned = (NOW - timedelta(hours=4)).isoformat()
    state.set_servers(
        servers_from_users(
            [
                {
                    "name": user,
                    "servers": {"": {"user_options": {}, "started": spawned, "ready": True}},
                }
                for user in ("queued", "long")
            ]
        )
    )
    overdue = rules.overdue(POLICY, state.servers, NOW)
    assert [(s.user, s.started) for s, _ in overdue] == [("long", NOW - timedelta(minutes=90))]


def test_a_server_from_before_the_policy_is_charged_recorded_shown_and_never_stopped():
    """The service charges a server stock KubeSpawner started (no policy labels) by its
    user's groups, records its GPU time from when it is first charged, shows it as
    started before the policy, and no rule stops it; another hub's is not its own."""
    from jupyterhub_gpu.service.state import ServiceState

    def stock_pod(name: str, user: str, namespace: str = "ns") -> dict:
        return {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "labels": {"component": "singleuser-server"},
                "annotations": {"hub.jupyter.org/username": user},
            },
            "spec": {
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
            },
            "status": {"phase": "Running", "startTime": (NOW - timedelta(hours=3)).isoformat()},
        }

    state = ServiceState(POLICY, hub_namespace="ns")
    pods = {
        key: found
        for key, pod in (
            ("ns/old-ann", stock_pod("old-ann", "ann")),
            ("ns/old-cat", stock_pod("old-cat", "cat")),
            ("elsewhere/x", stock_pod("x", "ann", namespace="elsewhere")),
        )
        if (found := state.server_pod(pod)) is not None
    }
    assert set(pods) == {"ns/old-ann", "ns/old-cat"}  # another namespace: another hub's
    state.server_pods_listed(pods)
    # the groups are not known yet: nobody is charged
    assert state.ledger.charges == {}
    # ann is in beta alone of the groups offering h200 (alpha and beta both do; ann is
    # not in alpha); cat is in both, so her server is charged to no group and announced
    state.set_user_groups({"ann": ["beta"], "cat": ["alpha", "beta"]})
    ann = state.server_pods["ns/old-ann"]
    assert (ann.charge.group, ann.charge.request.gpus) == ("beta", 2)
    assert ann.usage.group == "beta"
    assert ann.usage.gpus == 2
    # counted from when it was first charged, not from its pod's start three hours ago
    assert ann.usage.started > (NOW - timedelta(hours=1)).timestamp()
    assert set(state.ledger.charges) == {"ns/old-ann"}
    assert state.server_pods["ns/old-cat"].charge is None
    told = [n.text for n in state.notices]
    assert len(told) == 1
    assert told[0].startswith("cat's server ns/old-cat, started before the GPU policy, is")
    assert "2 of cat's groups offer flavor h200 (alpha, beta)" in told[0]
    # beta's max_runtime (1 h) never stops it
    users = [
        {
            "name": name,
            "servers": {
                "": {
                    "user_options": {"profile": "old"},
                    "started": (NOW - timedelta(hours=3)).isoformat(),
                    "ready": True,
                }
            },
        }
        for name in ("ann", "cat")
    ]
    state.set_servers(servers_from_users(users))
    servers = {s.user: s for s in state.servers}
    assert (servers["ann"].group, servers["ann"].before_policy) == ("beta", True)
    assert rules.overdue(POLICY, state.servers, NOW) == []
    shown = server_view(POLICY, servers["ann"], NOW, None)
    assert shown["before_policy"] is True
    assert shown["stops_in_seconds"] is None


def test_the_service_counts_only_its_own_hubs_servers():
    """Two hubs on one cluster (production and staging, group namespaces of the same
    names): each pod says its hub, and the service counts only its own hub's; a pod
    from before hubs were labelled counts where this hub's servers run."""
    from jupyterhub_gpu.core.shaping import HUB_LABEL
    from jupyterhub_gpu.service.state import ServiceState

    policy = parse_policy(
        flavors={"h200": {"kind": "gpu"}},
        profiles={"p": {"gpu": {"flavor": "h200"}}},
        groups={"alpha": {"quota": {"gpus": 4}, "profiles": ["p"]}},
        namespace_per_group=True,
    )
    state = ServiceState(policy, hub_namespace="prod")
    group_ns = "jupyterhub-gpu-alpha"

    def labelled(name, hub=None, namespace=group_ns):
        pod = pod_json(name, "ann", "alpha", 1, namespace=namespace)
        if hub:
            pod["metadata"]["labels"][HUB_LABEL] = hub
        return state.server_pod(pod)

    assert labelled("mine", hub="prod") is not None
    assert labelled("staging", hub="staging") is None
    assert labelled("legacy") is not None  # no hub label, in one of this policy's namespaces
    assert labelled("elsewhere", namespace="other-team") is None


def test_the_service_watches_the_namespace_the_gpu_spawner_uses(tmp_path):
    """A namespace set on GPUKubeSpawner wins over KubeSpawner's for the hub's spawner
    (traitlets' class hierarchy), and so for the service: it would otherwise watch an
    empty namespace and end every server the hub starts."""
    from jupyterhub_gpu.service.app import GPUService

    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        HUB_CONFIG.format(policy={"profiles": {"cpu": {}}, "everyone": {"profiles": ["cpu"]}})
        + 'c.GPUKubeSpawner.namespace = "gpu-servers"\n'
    )
    service = GPUService()
    service.initialize(["--config", str(config)])
    assert service.namespace == "gpu-servers"


async def test_no_pod_is_taken_for_an_orphan_without_a_complete_answer_from_the_hub():
    """A role without read:servers gets users without their servers: such an answer
    must never make a server pod look unowned, let alone deleted."""
    from jupyterhub_gpu.service.orphans import OrphanPods
    from jupyterhub_gpu.service.state import ServiceState, server_pod

    state = ServiceState(POLICY)
    pod = pod_json("lost", "ann", "alpha", 1)
    pod["metadata"]["uid"] = "uid-lost"
    pod["metadata"]["creationTimestamp"] = "1970-01-01T00:10:00Z"  # 600 s
    young = pod_json("young", "bob", "alpha", 1)
    young["metadata"]["uid"] = "uid-young"
    young["metadata"]["creationTimestamp"] = "1970-01-01T00:16:38Z"  # 998 s
    state.server_pods_listed({"ns/lost": server_pod(pod), "ns/young": server_pod(young)})
    deleted: list[tuple[str, str, str]] = []

    async def delete(namespace: str, name: str, uid: str) -> None:
        deleted.append((namespace, name, uid))

    clock = [1000.0]
    orphans = OrphanPods(state, delete, grace=60, clock=lambda: clock[0])
    with pytest.raises(RuntimeError, match="no complete server list from the hub"):
        await orphans.run()
    state.set_servers([], complete=False)
    with pytest.raises(RuntimeError, match="nothing is taken for an orphan without one"):
        await orphans.run()
    # a complete answer in which ann has no server: reported, then deleted after the grace;
    # bob's pod is younger than the answer (its server may be one the answer predates)
    state.set_servers([], complete=True)
    state.servers_asked_at = 1000.0
    assert await orphans.run() == "1 orphaned server pod(s), 0 deleted"
    clock[0] += 61
    assert await orphans.run() == "1 orphaned server pod(s), 1 deleted"
    assert deleted == [("ns", "lost", "uid-lost")]
    # a dry run only ever reports
    dry = OrphanPods(state, delete, grace=0, dry_run=True, clock=lambda: clock[0])
    assert await dry.run() == "1 orphaned server pod(s), 0 deleted"
    assert dry.orphans[0].deletes_at is None
    assert len(deleted) == 1


def test_a_servers_group_comes_from_its_pod_even_when_the_hub_answered_first():
    """After a service restart the hub's first answer may come before the pods are
    listed: the servers are joined to their pods again when the list arrives."""
    from jupyterhub_gpu.service.state import ServiceState, server_pod

    state = ServiceState(POLICY)
    users = [
        {
            "name": "ann",
            "servers": {"": {"user_options": {}, "started": NOW.isoformat(), "ready": True}},
        }
    ]
    state.set_servers(servers_from_users(users))
    assert [s.group for s in state.servers] == [None]  # no pod listed yet
    state.server_pods_listed({"ns/a": server_pod(pod_json("a", "ann", "alpha", 1))})
    assert [s.group for s in state.servers] == ["alpha"]


def test_the_dashboards_line_is_in_the_order_the_hub_lets_servers_go_with_fair_share():
    from jupyterhub_gpu.service.fair_share import FairShareSnapshot, Owner, fair_lines

    policy = parse_policy(
        fair_share={"half_life": "1d", "max_wait": "1h"},
        flavors={"h200": {"kind": "gpu"}},
        profiles={"gpu": {"gpu": {"flavor": "h200"}}},
        groups={"lab": {"quota": {"gpus": 1}, "profiles": ["gpu"]}},
    )
    now = datetime(2026, 11, 25, 12, tzinfo=UTC)

    def waiting(user: str, minutes_ago: float) -> Server:
        started = now - timedelta(minutes=minutes_ago)
        return Server(user, "", "lab", "gpu", started, False, "spawn", has_pod=False)

    # arrival order: bob (6 GPU-hours lately), cy (1), dee (none), eve (9, but waited
    # past max_wait)
    line = [waiting("eve", 70), waiting("bob", 10), waiting("cy", 5), waiting("dee", 1)]
    users = {
        ("bob", "lab"): Owner(6.0, 0.25, 0.4, 0.4),
        ("cy", "lab"): Owner(1.0, 0.25, 0.1, 0.1),
        ("eve", "lab"): Owner(9.0, 0.25, 0.5, 0.5),
    }
    fair = FairShareSnapshot(86400, 3600, {"lab": Owner(16.0, 1.0, 1.0, 1.0)}, users)
    ordered = fair_lines(policy, fair, {"lab": line}, now.timestamp())
    assert [s.user for s in ordered["lab"]] == ["eve", "dee", "cy", "bob"]
    # the positions the dashboard and api/usage show follow it
    snapshot = Snapshot(Ledger(), line, None, waiting=ordered)
    view = usage_view(policy, snapshot, Viewer("root", admin=True), now)
    positions = {s["user"]: s["queue_position"] for s in view["servers"]}
    assert positions == {"eve": 1, "dee": 2, "cy": 3, "bob": 4}
    # without fair share (or before the service's first read): arrival order
    assert [s.user for s in fair_lines(policy, None, {"lab": line}, now.timestamp())["lab"]] == [
        "eve",
        "bob",
        "cy",
        "dee",
    ]


def database_task_failing() -> dict:
    """The GPU-time task as it fails on a PostgreSQL usage database that refuses the
    service (the store hides the password; a driver's own message might not)."""
    error = RuntimeError(
        "the GPU usage database (postgresql://gpu:hunter2@db.example:5432/usage) could not "
        'be written: OperationalError: password authentication failed for user "gpu"'
    )
    return TaskStatus(
        "GPU time", 30.0, runs=2, failures=2, last_error=describe_error(error)
    ).to_json()


def test_task_errors_carry_no_password_and_no_database_for_anyone_but_hub_admins():
    failing = database_task_failing()
    assert "hunter2" not in failing["last_error"]
    assert "postgresql://gpu:***@db.example:5432/usage" in failing["last_error"]
    dsn = describe_error(RuntimeError("invalid dsn: host=db user=gpu password=hunter2 x=1"))
    assert dsn == "RuntimeError: invalid dsn: host=db user=gpu password=*** x=1"
    watch = TaskStatus(
        "watch nodes", 2.0, failures=1, last_error="HTTP 403 at https://10.0.0.1:6443/api/v1"
    ).to_json()
    shot = snapshot()
    shot.tasks = [failing, watch]
    # a hub admin sees the whole error, password hidden
    root = usage_view(POLICY, shot, Viewer("root", admin=True), NOW)
    assert root["tasks"][0]["last_error"] == failing["last_error"]
    assert "db.example" in render_page(root)
    # a policy admin group's member (and a billing job's token) sees the tasks, but no
    # database's host, user or URL: a plain sentence instead
    for viewer in (
        Viewer("olga", groups=frozenset({"sysadmins"})),
        Viewer("billing", reads_all=True),
    ):
        view = usage_view(POLICY, shot, viewer, NOW)
        page = render_page(view)
        raw = json.dumps(view)
        for leaked in ("db.example", "gpu:", "hunter2", "postgresql", "10.0.0.1"):
            assert leaked not in raw, (viewer, leaked)
            assert leaked not in page, (viewer, leaked)
        assert view["tasks"][0]["last_error"] == (
            "the GPU usage database cannot be read or written now; a hub admin sees why on "
            "this page"
        )
        assert view["tasks"][1]["last_error"] == "HTTP 403 at (a URL an admin can see)"
    # a member sees no tasks at all
    assert usage_view(POLICY, shot, Viewer("ann", groups=frozenset({"alpha"})), NOW)["tasks"] == []


@pytest.mark.parametrize(
    "month",
    [
        "0000-01",
        "1969-12",
        "9999-12",
        "10000-01",
        "2026-13",
        "2026-00",
        "2026-1",
        "",
        "\uff12\uff10\uff12\uff16-11",
    ],
)
def test_an_impossible_showback_month_is_the_askers_mistake(month):
    from zoneinfo import ZoneInfo

    from tornado.web import HTTPError

    from jupyterhub_gpu.service.handlers import month_argument

    with pytest.raises(HTTPError) as refused:
        month_argument(month, ZoneInfo("Europe/Berlin"))
    assert refused.value.status_code == 400
    said = refused.value.log_message % refused.value.args
    if month[:4] in ("0000", "1969", "9999"):
        assert said == f"month: expected a month from 1970-01 to 9998-12, got {month!r}"
    else:
        assert said.startswith("month: expected YYYY-MM, such as 2026-11, got")


def test_possible_months_and_times_pass_and_impossible_times_are_refused():
    from zoneinfo import ZoneInfo

    from tornado.web import HTTPError

    from jupyterhub_gpu.service.handlers import month_argument, time_argument

    for month in ("1970-01", "2026-11", "9998-12"):
        assert month_argument(month, ZoneInfo("America/New_York")) == month
    assert time_argument("from", "2026-11-01T00:00:00Z", 0) == 1_793_491_200
    assert time_argument("from", "86400", 0) == 86400
    for value in ("0001-01-01T00:00:00", "999999999999", "9999-12-31T23:59:59Z", "soon"):
        with pytest.raises(HTTPError) as refused:
            time_argument("to", value, 0)
        assert refused.value.status_code == 400
        assert refused.value.log_message.startswith("to: expected")
