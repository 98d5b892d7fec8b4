"""Which replica acts, as the dashboard and the metrics show it, and the stops that fall
due while the hub does not answer (no cluster, no hub: the parts alone)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry, generate_latest

from jupyterhub_gpu.core.admission import Ledger
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.kube.leader import LeaseElector, LeaseTimings
from jupyterhub_gpu.service.acting import Acting, ReplicaCollector, StopsWithoutHub
from jupyterhub_gpu.service.hubapi import HubAPIError, HubUnreachable
from jupyterhub_gpu.service.page import render_page
from jupyterhub_gpu.service.state import ServerPod
from jupyterhub_gpu.service.views import Snapshot, Viewer, usage_view

POLICY = parse_policy(
    flavors={"a100": {"kind": "gpu"}},
    profiles={"p": {"cpu": 1, "memory": "1Gi", "gpu": {"flavor": "a100"}}},
    groups={"lab": {"quota": {"gpus": 2}, "profiles": ["p"]}},
)
NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


@pytest.fixture
async def elector():
    api = client.ApiClient()
    made = LeaseElector(
        api, "jhub", "jupyterhub-gpu-service", LeaseTimings(), identity="replica-b_1234"
    )
    made.state.holder = "replica-a_9876"
    made.state.renewed = NOW.timestamp()
    made.state.acquired = NOW.timestamp() - 3600
    made.state.transitions = 3
    yield made
    await api.close()


async def test_admins_see_who_acts_and_the_leases_timings_members_do_not(elector):
    snapshot = Snapshot(ledger=Ledger.from_charges(POLICY, []), servers=[], capacity=None)
    snapshot.lease = elector.to_json()
    admin = usage_view(POLICY, snapshot, Viewer("root", admin=True), NOW)
    admin["tasks"] = [
        {
            "name": "reconcile",
            "ok": False,
            "consecutive_failures": 0,
            "last_success": None,
            "last_error": None,
            "last_error_at": None,
            "last_result": "runs on the acting replica only",
        }
    ]
    html = render_page(admin)
    assert "<h2>Service replicas</h2>" in html
    assert "Lease jhub/jupyterhub-gpu-service" in html
    assert "<th>Acting replica</th><td>replica-a_9876</td>" in html
    assert "lease 15 seconds, renew deadline 10 seconds, retry 2 seconds" in html
    assert "replica-b_1234: stands by (answers the dashboard and the API)" in html
    member = usage_view(POLICY, snapshot, Viewer("ann", groups=frozenset({"lab"})), NOW)
    assert member["lease"] is None
    assert "replica" not in render_page(member)


async def test_metrics_say_who_leads_and_the_leases_timings(elector):
    registry = CollectorRegistry(auto_describe=False)
    stops = StopsWithoutHub("wait", None, lambda uid, at: None)  # type: ignore[arg-type]
    registry.register(ReplicaCollector(Acting(elector, {}), stops))
    text = generate_latest(registry).decode()
    assert 'jupyterhub_gpu_service_acting{identity="replica-b_1234"} 0.0' in text
    lease_info = 'lease="Lease jhub/jupyterhub-gpu-service"'
    assert f'jupyterhub_gpu_lease_info{{holder="replica-a_9876",{lease_info}}} 1.0' in text
    assert "jupyterhub_gpu_lease_duration_seconds 15.0" in text
    assert "jupyterhub_gpu_lease_renew_deadline_seconds 10.0" in text
    assert "jupyterhub_gpu_lease_transitions 3.0" in text
    assert "jupyterhub_gpu_stops_waiting_for_hub 0.0" in text


def a_pod(uid: str = "uid-1") -> ServerPod:
    return ServerPod(
        key="jhub/jupyter-cid", charge=None, user="cid", servername="", created=None, uid=uid
    )


async def test_while_the_hub_is_down_a_due_stop_waits_and_says_so():
    deleted = []

    async def delete(namespace, name, uid):
        deleted.append((namespace, name, uid))

    stops = StopsWithoutHub("wait", delete, lambda uid, at: None)
    down = HubUnreachable("DELETE /users/cid/server", 0, "the hub did not answer: refused")
    done, error = await stops.stop("cid", "", "budget", a_pod(), down)
    assert not done
    assert deleted == []
    assert error == (
        "cid's server (budget) not stopped: the hub does not answer (DELETE "
        "/users/cid/server: HTTP 0: the hub did not answer: refused); it is stopped "
        "through the hub's API once the hub answers"
    )
    assert set(stops.waiting) == {("cid", "")}


async def test_delete_pod_deletes_the_judged_pod_ends_its_time_and_tells_the_hub_later():
    deleted, ended, told = [], [], []

    async def delete(namespace, name, uid):
        deleted.append((namespace, name, uid))

    class Hub:
        async def stop_server(self, user, name):
            told.append((user, name))
            raise HubAPIError("DELETE /users/cid/server", 400, "cid is not running")

    stops = StopsWithoutHub("delete-pod", delete, lambda uid, at: ended.append((uid, at)))
    down = HubUnreachable("GET /users/cid", 0, "the hub did not answer")
    before = time.time()
    done, error = await stops.stop("cid", "", "max_runtime", a_pod("uid-7"), down)
    assert (done, error) == (True, None)
    assert deleted == [("jhub", "jupyter-cid", "uid-7")]
    ((uid, at),) = ended
    assert uid == "uid-7"
    assert before <= at <= time.time()
    assert stops.waiting == {}
    # the hub back: told, and a hub that found the server stopped itself (400) is fine
    assert (
        await stops.tell_hub(Hub()) == "told the hub of 1 server(s) stopped while it did not answer"
    )
    assert told == [("cid", "")]
    assert stops.to_tell == {}
    assert await stops.tell_hub(Hub()) is None


async def test_a_pod_that_could_not_be_deleted_is_not_counted_as_stopped():
    async def delete(namespace, name, uid):
        return "deleting pod jhub/jupyter-cid: 403 Forbidden"

    stops = StopsWithoutHub("delete-pod", delete, lambda uid, at: None)
    down = HubUnreachable("GET /users/cid", 0, "the hub did not answer")
    done, error = await stops.stop("cid", "", "idle", a_pod(), down)
    assert (done, error) == (False, "deleting pod jhub/jupyter-cid: 403 Forbidden")
    assert stops.to_tell == {}


async def test_a_replica_that_does_not_act_shows_the_announced_stop_and_makes_none(tmp_path):
    from test_budget_notices import T0, H, Service, start

    database = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    clock, pods = [T0], {}
    start(pods, "bea", "course", "u-bea", T0)
    acting = Service(database, clock, pods)
    for hour in range(0, 13):
        await acting.run(T0 + hour * H)
    standing_by = Service(database, clock, pods)
    for at in (T0 + 12 * H, T0 + 12.5 * H):  # the second at the announced stop
        clock[0] = at
        listed = {k: standing_by.state.server_pod(b) for k, b in pods.items()}
        standing_by.state.server_pods_listed(listed)
        await standing_by.gpu_time.read()
        assert await standing_by.rule.follow() == "1 server(s) over a budget"
        pod = standing_by.state.server_pods["jhub/jupyter-bea"]
        # what its JupyterLab reads from any replica: the stop the acting one announced
        assert standing_by.rule.scheduled_stop(pod) == (T0 + 12.5 * H, "bea in Course")
    assert standing_by.told() == []
    assert standing_by.stops == []
    acting.close()
    standing_by.close()


async def test_a_replica_that_does_not_act_reads_on_what_the_acting_one_writes(tmp_path):
    from jupyterhub_gpu.accounting.events import EventStore
    from jupyterhub_gpu.accounting.store import UsageStore
    from jupyterhub_gpu.service.server_events import ServerEvents
    from jupyterhub_gpu.service.views import Notice

    clock = [NOW.timestamp()]
    stores = [UsageStore(f"sqlite:///{tmp_path / 'usage.sqlite'}") for _ in range(2)]
    acting, standing_by = (
        ServerEvents(POLICY, EventStore(store), clock=lambda: clock[0]) for store in stores
    )
    acting.notice(Notice(NOW, "Stopping cid's server: max_runtime", user="cid", server=""))
    acting.stopping("cid", "", "max_runtime", "uid-1")
    acting.stopped("cid", "")
    await acting.run()
    assert (await standing_by.follow()).startswith("read 1 last stop(s) and 1 notice(s)")
    assert standing_by.last_stops[("cid", "")].reason == "max_runtime"
    # later: what it saw itself is never written; the acting one's next stop is read on
    standing_by.stopping("ann", "", "idle", "uid-2")
    standing_by.stopped("ann", "")
    clock[0] += 60
    acting.stopping("cid", "", "budget", "uid-3")
    acting.stopped("cid", "")
    await acting.run()
    said = await standing_by.follow()
    assert said.endswith("since the last read")
    assert standing_by.last_stops[("cid", "")].reason == "budget"
    assert len(standing_by.of_server("cid", "")) == 1  # the notice, once
    stops_of_ann = await asyncio.to_thread(EventStore(stores[0]).last_stops, 0, "ann")
    assert stops_of_ann == {}
    for store in stores:
        store.dispose()
