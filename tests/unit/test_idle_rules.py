"""Which signal judges a server idle, and when it is not idle yet (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest

from jupyterhub_gpu.config.service_settings import prometheus_url_error
from jupyterhub_gpu.core.admission import Charge
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.service import metrics
from jupyterhub_gpu.service.idle import (
    ENGINE_ACTIVE,
    GPU_UTIL,
    IdleServers,
    NoDCGMSeries,
    Utilization,
    candidates,
    judge,
    utilization_queries,
)
from jupyterhub_gpu.service.state import ServerPod, ServiceState
from jupyterhub_gpu.service.views import Server

POLICY = parse_policy(
    flavors={
        "h200": {"kind": "gpu"},
        "mig": {"kind": "mig", "profile": "1g.5gb", "strategy": "mixed"},
        "shared": {"kind": "timeslice", "replicas": 4},
    },
    profiles={
        "whole": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "h200"}},
        "mig": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "mig"}},
        "slice": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "shared"}},
        "cpu": {"cpu": 1, "memory": "1Gi"},
    },
    groups={
        "lab": {
            "quota": {"gpus": 4},
            "profiles": ["whole", "mig", "slice", "cpu"],
            "idle": {"after": "2h"},
        },
        "free": {"quota": {"gpus": 4}, "profiles": ["whole"]},
    },
)
NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def server(user: str, group: str, started_ago: float, active_ago: float | None = None) -> Server:
    return Server(
        user=user,
        name="",
        group=group,
        profile=None,
        started=NOW - timedelta(seconds=started_ago),
        ready=True,
        pending=None,
        last_activity=None if active_ago is None else NOW - timedelta(seconds=active_ago),
    )


def pod(user: str, group: str, flavor: str | None) -> ServerPod:
    devices = ((flavor, 1),) if flavor else ()
    charge = Charge(f"jhub/jupyter-{user}", user, group, Request(devices=devices), "in-quota")
    return ServerPod(key=charge.key, charge=charge, user=user, servername="", created=NOW)


def judged(flavor: str | None, started_ago: float, active_ago=None, seen=None, prom=True):
    found = candidates(
        POLICY, [server("ann", "lab", started_ago, active_ago)], {"p": pod("ann", "lab", flavor)}
    )
    if not found:
        return None
    (candidate,) = found
    utilization = {} if seen is None else {("jhub", "jupyter-ann"): seen}
    return judge(candidate, NOW, utilization, prometheus=prom)


def test_whole_gpus_and_mig_slices_are_judged_by_dcgm_shared_gpus_by_activity():
    servers = [server(u, "lab", 9000) for u in ("ann", "bob", "carl", "dave")]
    pods = {
        "a": pod("ann", "lab", "h200"),
        "b": pod("bob", "lab", "mig"),
        "c": pod("carl", "lab", "shared"),
        "d": pod("dave", "lab", None),  # CPU only: nothing to reclaim
    }
    found = {c.server.user: c.metric for c in candidates(POLICY, servers, pods)}
    assert found == {"ann": GPU_UTIL, "bob": ENGINE_ACTIVE, "carl": None}
    # a group without an idle rule: never judged
    eve = {"e": pod("eve", "free", "h200")}
    assert candidates(POLICY, [server("eve", "free", 9000)], eve) == []


def test_dcgm_below_the_threshold_for_the_whole_window_is_idle():
    reading = judged("h200", 9000, seen=Utilization(highest=4.9, covered=True))
    assert (reading.idle, reading.signal) == (True, "GPU utilisation below 5% for 2 hours")
    reading = judged("h200", 9000, seen=Utilization(highest=5, covered=True))
    assert (reading.idle, reading.signal) == (False, "GPU utilisation reached 5%")


def test_not_idle_without_enough_samples_or_before_the_idle_time():
    # samples only for part of the window (e.g. the exporter started an hour ago)
    assert judged("h200", 9000, seen=Utilization(highest=0, covered=False)).idle is False
    # running for less than 2h
    assert judged("h200", 7000, seen=Utilization(highest=0, covered=True)).idle is False
    assert judged("shared", 7000).idle is False


def test_activity_where_utilisation_cannot_be_attributed_or_is_not_configured():
    reading = judged("shared", 9000, active_ago=7300, seen=Utilization(0, True))
    assert reading.idle is True
    assert reading.signal == (
        "no notebook activity for 2 hours, and a shared GPU's use cannot be measured per server"
    )
    assert judged("shared", 9000, active_ago=60).idle is False
    # Prometheus answered without a series for the shared device's pod: activity as before
    assert judged("shared", 9000, active_ago=7300).idle is True
    assert judged("h200", 9000, active_ago=7300, prom=False).signal.endswith(
        ", and no GPU metrics are configured"
    )


@pytest.mark.parametrize("flavor", ["h200", "mig"])
def test_no_series_for_an_attributable_gpu_is_unknown_never_notebook_activity(flavor):
    # no notebook activity for the whole run (a training run in a terminal), and
    # Prometheus answered without a series for the pod (exporter down, no honorLabels)
    reading = judged(flavor, 9000, active_ago=None)
    assert reading.idle is None
    assert (reading.dcgm, reading.no_series) == (True, True)
    assert reading.signal == "no DCGM series for its pod"
    # whatever the activity says
    assert judged(flavor, 90000, active_ago=80000).idle is None
    # a series (any series) is judged by it
    reading = judged(flavor, 9000, seen=Utilization(highest=0, covered=True))
    assert (reading.idle, reading.dcgm, reading.no_series) == (True, True, False)


def test_prometheus_not_answering_decides_nothing():
    found = candidates(POLICY, [server("ann", "lab", 9000)], {"p": pod("ann", "lab", "h200")})
    assert judge(found[0], NOW, None, prometheus=True).idle is None


def test_the_queries_read_the_window_and_its_edges():
    values, covered = utilization_queries(ENGINE_ACTIVE, ["b", "a"], 7200)
    assert values == (
        "max by (namespace, pod) (max_over_time("
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE{namespace=~\"a|b\",pod!=''}[7200s])) * 100"
    )
    assert "[720s] offset 6480s" in covered
    with pytest.raises(ValueError, match="not a namespace name"):
        utilization_queries(GPU_UTIL, ['x"}) or vector(1'], 20)


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://p", "http://", 9090])
def test_a_prometheus_url_must_be_http(url):
    assert "expected the Prometheus server's http(s) URL" in prometheus_url_error(url)


# ---- a whole run, against a Prometheus that answers what each test says ---------------


class AnsweringPrometheus:
    """Answers the idle rule's two queries with a series for each pod in ``percent``
    (covering the whole window); pods not in it have no series."""

    def __init__(self, percent: dict[str, float]) -> None:
        self.percent = percent

    async def query(self, promql: str) -> list[dict]:
        return [
            {"metric": {"namespace": "jhub", "pod": pod}, "value": [0, str(value)]}
            for pod, value in self.percent.items()
        ]


def idle_pass(users: dict[str, str], percent: dict[str, float]):
    """An IdleServers over ``users`` (user -> flavor), every server started 3h ago with no
    notebook activity, the bound pods on node gpu-<user>; and what it stopped."""
    state = ServiceState(POLICY)
    state.server_pods = {f"p-{u}": pod(u, "lab", flavor) for u, flavor in users.items()}
    state.cluster_pods = {f"jhub/jupyter-{u}": {"spec": {"nodeName": f"gpu-{u}"}} for u in users}
    state.set_servers([server(u, "lab", 3 * 3600) for u in users])
    stopped = []

    async def stop(user: str, name: str, reason: str, pod=None) -> None:
        stopped.append((user, reason))

    rule = IdleServers(POLICY, state, stop, AnsweringPrometheus(percent), notice_period=60)
    return rule, state, stopped


async def test_most_servers_without_series_fail_the_task_and_stop_nothing_by_activity():
    users = {"ann": "h200", "bob": "mig", "carl": "shared", "dave": "h200"}
    rule, state, stopped = idle_pass(users, {"jupyter-dave": 80})
    with pytest.raises(NoDCGMSeries) as caught:
        await rule.run(NOW)
    message = str(caught.value)
    assert message.startswith(
        "2 of 3 servers judged by GPU utilisation have no DCGM series in Prometheus, "
        "so are neither warned nor stopped: is dcgm-exporter down on their nodes, scraped "
        "without honorLabels (labels renamed exported_pod) or not mapping DRA devices to pods?"
    ), message
    assert message.endswith("nodes gpu-ann, gpu-bob; pods jhub/jupyter-ann, jhub/jupyter-bob")
    # carl's shared GPU is still judged by his (missing) notebook activity
    assert [n.user for n in state.notices] == ["carl"]
    assert "no notebook activity" in state.notices[0].text
    # past the notice: carl is stopped, ann and bob (no series) are never warned nor stopped
    with pytest.raises(NoDCGMSeries):
        await rule.run(NOW + timedelta(seconds=61))
    assert stopped == [("carl", "idle")]
    assert {n.user for n in state.notices} == {"carl"}
    assert (rule.coverage.judged, rule.coverage.without_series) == (
        3,
        ("jhub/jupyter-ann", "jhub/jupyter-bob"),
    )


async def test_a_few_servers_without_series_are_left_alone_without_failing():
    users = {"ann": "h200", "bob": "mig", "dave": "h200"}
    rule, state, stopped = idle_pass(users, {"jupyter-bob": 0, "jupyter-dave": 80})
    result = await rule.run(NOW)
    assert result == (
        "3 server(s) checked, 1 without DCGM series (left alone), 1 warned, 0 stopped, "
        "1 awaiting their stop"
    )
    await rule.run(NOW + timedelta(seconds=61))
    # bob's slice measured idle is stopped; ann, with no series, is neither warned nor stopped
    assert stopped == [("bob", "idle")]
    assert all(n.user == "bob" for n in state.notices)
    assert rule.coverage.without_series == ("jhub/jupyter-ann",)
    assert not rule.coverage.degraded


async def test_the_metrics_say_how_many_servers_have_no_series():
    rule, state, _ = idle_pass({"ann": "h200", "bob": "h200"}, {})
    with pytest.raises(NoDCGMSeries):
        await rule.run(NOW)

    def snapshot():
        snap = state.snapshot([])
        snap.idle = rule.coverage
        return snap

    registry, _ = metrics.registry(POLICY, snapshot)
    lines = generate_latest(registry).decode().splitlines()
    assert "jupyterhub_gpu_idle_servers_judged_by_dcgm 2.0" in lines
    assert "jupyterhub_gpu_idle_servers_without_dcgm_series 2.0" in lines


def test_a_server_from_before_the_policy_is_never_an_idle_candidate():
    from dataclasses import replace

    old = replace(server("ann", "lab", 99_000), before_policy=True)
    assert candidates(POLICY, [old], {"p": pod("ann", "lab", "h200")}) == []
    # the same server started by the policy is one
    assert candidates(POLICY, [server("ann", "lab", 99_000)], {"p": pod("ann", "lab", "h200")})
