"""The Grafana dashboard: every query of every panel returns data from a real Prometheus
scraping a real hub and its GPU service, the panels show what the hub and the service
did, its template variables work as Grafana runs them, and the shipped JSON and its
kube-prometheus-stack ConfigMap are what the package builds.

The session's Prometheus (Debian's, scraping the simulated DCGM exporter) also scrapes
the hub's ``/hub/metrics`` and the service's ``/services/gpu/metrics`` for this module,
with a token that has ``read:metrics``, as a site's Prometheus does. The service runs
as its own Deployment's replica (so it has a Lease). In the hub: ann's server holds lab's
one GPU idle and bob waits for it; cid's busy server uses course's budget up, and
mallory is then refused for it, as she was for a group she is not in; dan's server is
stopped by the service past its group's max_runtime.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from replica_helpers import HUB_SETTINGS, deployment_replica

from hub_helpers import api, no_server, running_hub
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.grafana import (
    CONFIGMAP_KEY,
    DASHBOARD_FILE,
    DATASOURCE,
    GROUP_VALUES,
    SIDECAR_LABEL,
    build_dashboard,
    configmap_yaml,
    dashboard,
    dashboard_json,
    panel_queries,
)
from jupyterhub_gpu.grafana.__main__ import main as render_main
from jupyterhub_gpu.grafana.panels import Panel, Query, Row
from kube_helpers import eventually
from test_service_hub import start_server

ROOT = Path(__file__).resolve().parents[1]
CONFIGMAP = ROOT / "helm-values" / "alerts" / "grafana-dashboard.yaml"
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200-NVL"}
POLICY = {
    "fair_share": {"half_life": "1d"},
    # priced, so the month's cost per group has a series
    "currency": "EUR",
    "flavors": {
        "h200": {"kind": "gpu", "node_selector": H200, "billing": {"weight": 2, "price": 3}}
    },
    "profiles": {"small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {
        # one GPU, which ann's idle server holds while bob waits for it
        "lab": {
            "quota": {"gpus": 1, "flavors": {"h200": 1}},
            "limit": {"gpus": 1, "flavors": {"h200": 1}},
            "when_full": "wait",
            "idle": {"after": "1h"},
            "profiles": ["small"],
        },
        # 7.2 GPU-seconds, which cid's server goes on using (when_exhausted: warn)
        "course": {
            "quota": {"gpus": 1},
            "limit": {"gpus": 2},
            "profiles": ["small"],
            "budget": {"gpu_hours": 0.002, "period": "1h"},
        },
        # dan's server is stopped 10 seconds after its pod started
        "short": {"quota": {"gpus": 1}, "max_runtime": "10s", "profiles": ["small"]},
    },
}
GROUPS = sorted(group.name for group in parse_policy(**POLICY).all_groups)
LAB, COURSE, SHORT = "lab--small", "course--small", "short--small"
#: the step of the range queries (Grafana's $__interval over a short time range)
STEP = 2.0

# ---- evaluating the panels' queries as Grafana does -----------------------------------


@dataclass
class Answer:
    series: list[dict[str, Any]]
    error: str | None = None


def prometheus_api(base: str, path: str, params: dict[str, Any]) -> Answer:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        return Answer([], f"{body.get('errorType')}: {body.get('error')}")
    return Answer(body["data"]["result"] if isinstance(body["data"], dict) else body["data"])


def interpolated(expr: str, group: str, range_seconds: float, scrape_interval: float) -> str:
    """``expr`` with Grafana's variables as Grafana fills them in for Prometheus:
    ``$group`` (a regex: ``.*`` for all, ``(a|b)`` for several), ``$__range`` (the time
    range) and ``$__rate_interval`` (the step and a scrape, at least four scrapes)."""
    rate = max(STEP + scrape_interval, 4 * scrape_interval)
    return (
        expr.replace("$__rate_interval", f"{math.ceil(rate)}s")
        .replace("$__range", f"{math.ceil(range_seconds)}s")
        .replace("$group", group)
    )


def ask(prometheus, target: dict[str, Any], group: str, since: float) -> Answer:
    """One target's answer, as the panel asks: now (instant) or over the time range."""
    now = time.time()
    expr = interpolated(target["expr"], group, now - since, prometheus.scrape_interval)
    if "$" in expr:
        return Answer([], f"a variable Grafana would not fill in: {expr}")
    if target["instant"]:
        return prometheus_api(prometheus.url, "query", {"query": expr, "time": now})
    return prometheus_api(
        prometheus.url,
        "query_range",
        {"query": expr, "start": since, "end": now, "step": STEP},
    )


@dataclass(frozen=True)
class Unanswered:
    panel: str
    query: str
    #: Prometheus' error, or None: no series
    error: str | None
    expr: str

    def __str__(self) -> str:
        what = f": {self.error}" if self.error else " returns no data"
        return f"panel {self.panel!r} query {self.query}{what}: {self.expr}"


def unanswered(
    prometheus, model: dict[str, Any], since: float, group: str = ".*"
) -> list[Unanswered]:
    """Every panel query that errs or returns no series, named by its panel."""
    problems = []
    for panel, target in panel_queries(model):
        answer = ask(prometheus, target, group, since)
        if answer.error or not answer.series:
            problems.append(
                Unanswered(panel["title"], target["refId"], answer.error, target["expr"])
            )
    return problems


def panel(model: dict[str, Any], title: str) -> dict[str, Any]:
    found = {p["id"]: p for p, _ in panel_queries(model) if p["title"] == title}
    assert len(found) == 1, f"{len(found)} panels titled {title!r}"
    return found.popitem()[1]


def now_values(prometheus, title: str, group: str = ".*", by: tuple[str, ...] = ("group",)):
    """A panel's values now, per query (its refId), keyed by the series' ``by`` labels."""
    values: dict[str, dict[tuple[str, ...], float]] = {}
    for target in panel(dashboard(), title)["targets"]:
        answer = ask(prometheus, target, group, time.time() - 600)
        assert answer.error is None, answer.error
        values[target["refId"]] = {
            tuple(s["metric"].get(label, "") for label in by): float(
                (s["value"] if "value" in s else s["values"][-1])[1]
            )
            for s in answer.series
        }
    return values


# ---- a real hub and service, scraped ---------------------------------------------------


async def refused(hub, user: str, profile: str) -> None:
    status, body = await api(hub, "POST", f"/users/{user}/server", {"profile": profile})
    assert status == 403, body


async def series(prometheus, promql: str) -> list[dict[str, Any]]:
    return (
        await asyncio.to_thread(prometheus_api, prometheus.url, "query", {"query": promql})
    ).series


@pytest.fixture(scope="module")
async def scraped(local_cluster, core, priority_class_objects, gpu_metrics, tmp_path_factory):
    prometheus, exporter = gpu_metrics.prometheus, gpu_metrics.exporter
    began = time.time()
    async with running_hub(
        local_cluster,
        core,
        users={
            "ann": ["lab"],
            "bob": ["lab"],
            "cid": ["course"],
            "mallory": ["course"],
            "dan": ["short"],
        },
        policy=POLICY,
        gpu_service=True,
        external_gpu_service=True,
        # utilisation and power read every 2 s (the month's energy comes from them)
        service_settings={
            **HUB_SETTINGS,
            "prometheus_url": prometheus.url,
            "utilisation_refresh": 2,
        },
        extra_config=(
            "c.GPUKubeSpawner.wait_poll_interval = 0.5\n"
            # bob waits in lab's line for the module's length
            "c.KubeSpawner.start_timeout = 600\n"
        ),
        start=False,
    ) as hub:
        # the replica first, as a Deployment's runs beside the hub: the hub waits for an
        # external service it cannot reach at its start
        hub.write_config()
        service = await deployment_replica(
            hub, core, local_cluster, POLICY, tmp_path_factory.mktemp("service")
        )
        asking: list[asyncio.Task] = []
        try:
            await asyncio.to_thread(hub.start)
            # as a site's Prometheus scrapes the service's replicas and the hub
            await asyncio.to_thread(
                prometheus.scrape,
                {
                    "jupyterhub-gpu": f"http://127.0.0.1:{hub.service_port}/services/gpu/metrics",
                    "jupyterhub": f"{hub.url}/hub/metrics",
                },
                hub.api_token,
            )
            # cid's and dan's GPUs are busy from their pods' first scrape on; ann's stays
            # at the exporter's 0%
            for user in ("cid", "dan"):
                exporter.set_utilization(hub.namespace, f"jupyter-{user}", 80)
            # dan's server is stopped for its runtime, ready or (on a loaded machine)
            # still starting: its spawn's answer is not waited for
            asking.append(
                asyncio.create_task(api(hub, "POST", "/users/dan/server", {"profile": SHORT}))
            )
            # a request for a group mallory is not in
            await refused(hub, "mallory", LAB)
            # cid's server uses course's budget; ann's holds lab's one GPU, bob waits for it
            await asyncio.gather(start_server(hub, "cid", COURSE), start_server(hub, "ann", LAB))
            asking.append(
                asyncio.create_task(api(hub, "POST", "/users/bob/server", {"profile": LAB}))
            )
            # once cid has used course's budget twice over (the hub's reading of the usage
            # database is a pass behind the service's), mallory is refused for it
            await eventually(
                lambda: series(
                    prometheus,
                    'jupyterhub_gpu_group_gpu_hours_used{group="course"}'
                    ' >= 2 * jupyterhub_gpu_group_gpu_hours_budget{group="course"}',
                ),
                "course's budget to be used up twice over",
                120,
            )
            await refused(hub, "mallory", COURSE)
            await eventually(
                lambda: series(
                    prometheus, 'jupyterhub_gpu_servers_stopped_total{reason="max_runtime"}'
                ),
                "the service to stop dan's server for its runtime",
                120,
            )
            await eventually(lambda: no_server(hub, "dan"), "dan's server gone", 60)

            async def seen() -> bool:
                """Each counter scraped a few times since it was born (a rate needs two
                samples in its window), and bob's wait."""
                waiting = await series(prometheus, 'jupyterhub_gpu_group_waiting{group="lab"} > 0')
                scraped = await series(
                    prometheus,
                    "count_over_time(jupyterhub_gpu_servers_stopped_total[1m]) >= 5 or "
                    "count_over_time(jupyterhub_gpu_spawns_refused_total[1m]) >= 5",
                )
                return bool(waiting) and len(scraped) == 3

            await eventually(seen, "Prometheus to have scraped the waiting line and counts", 60)
            # the service has read cid's GPUs' power from the exporter, and says the kWh
            await eventually(
                lambda: series(prometheus, 'jupyterhub_gpu_group_month_energy_kwh{group="course"}'),
                "the month's energy of course",
                120,
            )
            yield SimpleNamespace(hub=hub, prometheus=prometheus, began=began)
        finally:
            await asyncio.to_thread(prometheus.unscrape, "jupyterhub-gpu", "jupyterhub")
            for user in ("cid", "dan"):
                exporter.set_utilization(hub.namespace, f"jupyter-{user}", None)
            service.stop()
            for task in asking:
                task.cancel()


@pytest.mark.k8s
@pytest.mark.hub
async def test_every_panel_s_query_returns_data_from_a_real_hub_and_service(scraped):
    problems = await asyncio.to_thread(unanswered, scraped.prometheus, dashboard(), scraped.began)
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.k8s
@pytest.mark.hub
async def test_the_panels_show_what_the_hub_and_the_service_did(scraped):
    prometheus = scraped.prometheus

    def shown(title: str, by: tuple[str, ...] = ("group",)):
        return now_values(prometheus, title, by=by)

    groups = await asyncio.to_thread(shown, "Groups now")
    # ann holds lab's one GPU and bob waits; cid's server runs; dan's was stopped
    assert groups["A"][("lab",)] == 1
    assert groups["A"][("course",)] == 1
    assert groups["A"][("short",)] == 0
    assert groups["B"][("lab",)] == 1
    assert groups["C"][("lab",)] == 1
    assert groups["C"][("course",)] == 2
    assert groups["D"][("lab",)] == 1
    assert groups["E"][("lab",)] == 1
    assert groups["E"][("course",)] == 0
    devices = await asyncio.to_thread(shown, "Devices per group and flavor", ("group", "flavor"))
    assert devices["A"][("lab", "h200")] == 1
    assert devices["B"][("lab", "h200")] == 1

    refusals = await asyncio.to_thread(
        shown, "Refused spawns in the time range", ("group", "reason")
    )
    assert refusals == {"A": {("course", "budget"): 1.0, ("", "options"): 1.0}}
    stops = await asyncio.to_thread(
        shown, "Servers stopped by the rules in the time range", ("reason",)
    )
    # dan's, once: the rule asks again while the hub is still stopping a server, and
    # that is one stop
    assert list(stops["A"]) == [("max_runtime",)]
    assert stops["A"][("max_runtime",)] == 1
    budget = await asyncio.to_thread(shown, "Budget used")
    assert list(budget["A"]) == [("course",)]
    assert budget["A"][("course",)] >= 2
    month = await asyncio.to_thread(shown, "This billing month per group")
    assert month["A"][("course",)] > 0
    assert month["D"][("course",)] > 0  # cid's busy GPU drew power
    # an H200's hour is billed 2 units and costs 3 EUR (each ratio of one scrape's series)
    for metric, rate in (("billed_units", 2), ('cost{currency="EUR"}', 3)):
        (ratio,) = await series(
            prometheus,
            f"jupyterhub_gpu_group_month_{metric} / ignoring(currency) "
            'jupyterhub_gpu_group_month_gpu_hours{group="course"}',
        )
        assert float(ratio["value"][1]) == pytest.approx(rate, rel=1e-9), metric

    idle = await asyncio.to_thread(
        shown, "Server pods under 5% for 30 minutes", ("namespace", "pod")
    )
    # the exporter serves every pod on the session's shared nodes: this hub's are ours
    ours = {k: v for k, v in idle["A"].items() if k[0] == scraped.hub.namespace}
    assert ours == {(scraped.hub.namespace, "jupyter-ann"): 0.0}

    acting = await asyncio.to_thread(shown, "Acting replicas", ())
    assert acting == {"A": {(): 1.0}}
    lease = await asyncio.to_thread(shown, "The Lease", ("lease", "holder"))
    ((name, holder),) = lease["A"]
    assert name.endswith("jupyterhub-gpu-service")
    assert holder.startswith("gpu-service")
    database = await asyncio.to_thread(shown, "Usage database", ())
    assert database == {"A": {(): 1.0}, "B": {(): 1.0}}


@pytest.mark.k8s
@pytest.mark.hub
async def test_the_group_variable_lists_the_policy_s_groups_and_narrows_the_panels(scraped):
    prometheus = scraped.prometheus
    # label_values(metric, label): the values of the label on the metric's series
    metric, label = GROUP_VALUES.removeprefix("label_values(").removesuffix(")").split(", ")
    answer = await asyncio.to_thread(
        prometheus_api, prometheus.url, f"label/{label}/values", {"match[]": metric}
    )
    assert answer.error is None
    assert sorted(answer.series) == GROUPS

    def groups_shown(title: str, group: str) -> set[str]:
        values = now_values(prometheus, title, group)
        return {key[0] for by_key in values.values() for key in by_key}

    assert await asyncio.to_thread(groups_shown, "Groups now", "lab") == {"lab"}
    assert await asyncio.to_thread(groups_shown, "Groups now", "(lab|course)") == {"lab", "course"}
    assert await asyncio.to_thread(groups_shown, "Groups now", ".*") == set(GROUPS)
    # lab has no budget and nothing refused
    assert await asyncio.to_thread(groups_shown, "Budget used", "lab") == set()
    assert await asyncio.to_thread(groups_shown, "Refused spawns in the time range", "lab") == set()
    # every other panel answers for lab alone; these have nothing of lab's to show
    nothing_of_lab = {
        ("Refused spawns per hour, by group and reason", "A"),
        ("Refused spawns in the time range", "A"),
        ("Budget used", "A"),
        ("GPU-hours in each group's budget window", "B"),
    }
    problems = await asyncio.to_thread(unanswered, prometheus, dashboard(), scraped.began, "lab")
    assert all(p.error is None for p in problems), problems
    assert {(p.panel, p.query) for p in problems} == nothing_of_lab


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_query_without_data_or_with_an_error_is_named_by_its_panel(scraped):
    broken = build_dashboard(
        (
            Row(
                "Broken",
                (
                    Panel(
                        "Misspelt", "stat", (Query("max(jupyterhub_gpu_group_gpus_alocated)"),), ""
                    ),
                    Panel("Unparsable", "timeseries", (Query("sum by (group) (rate(x[5m])"),), ""),
                    Panel(
                        "Fine",
                        "stat",
                        (Query('max(jupyterhub_gpu_group_gpus_quota{group=~"$group"})'),),
                        "",
                    ),
                ),
            ),
        )
    )
    problems = await asyncio.to_thread(unanswered, scraped.prometheus, broken, scraped.began)
    assert [(p.panel, p.query) for p in problems] == [("Misspelt", "A"), ("Unparsable", "A")]
    assert str(problems[0]) == (
        "panel 'Misspelt' query A returns no data: max(jupyterhub_gpu_group_gpus_alocated)"
    )
    assert str(problems[1]).startswith("panel 'Unparsable' query A: bad_data: ")


# ---- the dashboard's JSON and its ConfigMap -------------------------------------------


def test_the_shipped_dashboard_is_built_from_its_panels():
    regenerate = (
        "python3 -c 'import jupyterhub_gpu.grafana as g; print(g.dashboard_json(), end=\"\")'"
        f" > {DASHBOARD_FILE.relative_to(ROOT)}"
    )
    assert DASHBOARD_FILE.read_text() == dashboard_json(), f"out of date: {regenerate}"


def test_the_configmap_holds_the_shipped_dashboard_for_the_grafana_sidecar():
    regenerate = f"python3 -m jupyterhub_gpu.grafana configmap > {CONFIGMAP.relative_to(ROOT)}"
    assert CONFIGMAP.read_text() == configmap_yaml(), f"out of date: {regenerate}"
    configmap = yaml.safe_load(CONFIGMAP.read_text())
    assert (configmap["apiVersion"], configmap["kind"]) == ("v1", "ConfigMap")
    label, value = SIDECAR_LABEL
    assert configmap["metadata"]["labels"][label] == value == "1"
    assert "namespace" not in configmap["metadata"]  # kubectl apply -n <Grafana's namespace>
    assert json.loads(configmap["data"][CONFIGMAP_KEY]) == dashboard()


def test_every_panel_asks_the_chosen_data_source_and_the_layout_fits_the_grid():
    model = dashboard()
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    group = variables["group"]
    assert group["datasource"] == DATASOURCE == {"type": "prometheus", "uid": "${datasource}"}
    assert group["query"] == GROUP_VALUES
    assert group["multi"]
    assert group["includeAll"]
    ids, cells = set(), set()
    for item in model["panels"]:
        assert item["id"] not in ids, item["title"]
        ids.add(item["id"])
        grid = item["gridPos"]
        assert 0 <= grid["x"] < grid["x"] + grid["w"] <= 24, item["title"]
        taken = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not taken & cells, f"panel {item['title']!r} overlaps another"
        cells |= taken
        if item["type"] == "row":
            continue
        assert item["datasource"] == DATASOURCE, item["title"]
        assert item["description"], item["title"]
        for target in item["targets"]:
            assert target["datasource"] == DATASOURCE, item["title"]
            assert target["expr"].strip(), item["title"]
    titles = [p["title"] for p, _ in panel_queries(model)]
    assert len(set(titles)) == len({p["id"] for p, _ in panel_queries(model)}), "titles repeat"


def test_a_panel_wider_than_the_grid_is_refused():
    with pytest.raises(ValueError, match="panel 'Too wide': width 30 not in 1-24"):
        build_dashboard((Row("Row", (Panel("Too wide", "stat", (Query("up"),), "", width=30),)),))


@pytest.mark.parametrize("form", ["dashboard", "configmap"])
def test_the_command_prints_the_shipped_forms(form, capsys):
    assert render_main([form]) == 0
    out = capsys.readouterr().out
    assert out == (DASHBOARD_FILE.read_text() if form == "dashboard" else CONFIGMAP.read_text())
