"""Which signal judges a server idle, and when it is not idle yet (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jupyterhub_gpu.core.admission import Charge
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.core.selection import Request
from jupyterhub_gpu.service.idle import (
    ENGINE_ACTIVE,
    GPU_UTIL,
    Utilization,
    candidates,
    judge,
    prometheus_url_error,
    utilization_queries,
)
from jupyterhub_gpu.service.state import ServerPod
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
    assert (reading.idle, reading.signal) == (True, "GPU utilisation below 5% for 2h (DCGM)")
    reading = judged("h200", 9000, seen=Utilization(highest=5, covered=True))
    assert (reading.idle, reading.signal) == (False, "GPU utilisation reached 5% (DCGM)")


def test_not_idle_without_enough_samples_or_before_the_idle_time():
    # samples only for part of the window (e.g. the exporter started an hour ago)
    assert judged("h200", 9000, seen=Utilization(highest=0, covered=False)).idle is False
    # running for less than 2h
    assert judged("h200", 7000, seen=Utilization(highest=0, covered=True)).idle is False
    assert judged("shared", 7000).idle is False


def test_activity_where_utilisation_cannot_be_attributed_or_is_missing():
    reading = judged("shared", 9000, active_ago=7300, seen=Utilization(0, True))
    assert reading.idle is True
    assert reading.signal == (
        "no notebook activity for 2h (GPU use of a shared GPU cannot be attributed)"
    )
    assert judged("shared", 9000, active_ago=60).idle is False
    assert judged("h200", 9000, active_ago=7300).signal.endswith("(no DCGM metrics for its pod)")
    assert judged("h200", 9000, active_ago=7300, prom=False).signal.endswith(
        "(no GPU metrics configured)"
    )


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
