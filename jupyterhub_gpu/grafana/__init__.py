"""A Grafana dashboard for the GPU service's and the hub's metrics, in the package.

``DASHBOARD_FILE`` is the dashboard's JSON model, to import into Grafana (Dashboards >
New > Import) or provision from a file. For kube-prometheus-stack, whose Grafana
sidecar loads every ConfigMap labelled ``grafana_dashboard: "1"``, ``configmap_yaml``
renders it as such a ConfigMap; the repository keeps it as
``helm-values/alerts/grafana-dashboard.yaml``, and its tests keep both equal to what
``dashboard_json`` builds from ``panels.ROWS``. After a change to the panels::

    python3 -c 'import jupyterhub_gpu.grafana as g; print(g.dashboard_json(), end="")' \\
        > jupyterhub_gpu/grafana/jupyterhub-gpu.json
    python3 -m jupyterhub_gpu.grafana configmap > helm-values/alerts/grafana-dashboard.yaml

The dashboard asks for a Prometheus data source (``$datasource``) and the groups
to show (``$group``, all by default).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .panels import ROWS, Panel, Row

DASHBOARD_FILE = Path(__file__).with_name("jupyterhub-gpu.json")
UID = "jupyterhub-gpu"
TITLE = "JupyterHub GPU"
#: the key of the dashboard in the ConfigMap (the file the sidecar writes)
CONFIGMAP_KEY = "jupyterhub-gpu.json"
CONFIGMAP_NAME = "jupyterhub-gpu-dashboard"
#: the label kube-prometheus-stack's Grafana sidecar loads dashboards by (its default)
SIDECAR_LABEL = ("grafana_dashboard", "1")
#: Grafana's grid is 24 columns wide
GRID_WIDTH = 24

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: the query the group variable's values come from: every group of the policy
GROUP_VALUES = "label_values(jupyterhub_gpu_group_gpus_allocated, group)"

TEMPLATING = [
    {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    },
    {
        "name": "group",
        "label": "Group",
        "type": "query",
        "datasource": DATASOURCE,
        "query": GROUP_VALUES,
        "definition": GROUP_VALUES,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "includeAll": True,
        # all: any group, and the hub's refusals before a group was chosen (group="")
        "allValue": ".*",
        "multi": True,
        "options": [],
        "refresh": 2,
        "regex": "",
        "sort": 1,
    },
]


def _field_config(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.minimum is not None:
        defaults["min"] = panel.minimum
    if panel.maximum is not None:
        defaults["max"] = panel.maximum
    if panel.thresholds:
        defaults["color"] = {"mode": "thresholds"}
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": color, "value": value} for value, color in panel.thresholds],
        }
    if panel.mappings:
        defaults["mappings"] = [
            {
                "type": "value",
                "options": {
                    f"{value:g}": {"text": text, "color": color, "index": index}
                    for index, (value, text, color) in enumerate(panel.mappings)
                },
            }
        ]
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "fillOpacity": 10, "showPoints": "never"}
    return {"defaults": defaults, "overrides": []}


_NOW = {"calcs": ["lastNotNull"], "fields": "", "values": False}
_OPTIONS: dict[str, dict[str, Any]] = {
    "timeseries": {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    },
    "stat": {
        "reduceOptions": _NOW,
        "colorMode": "value",
        "graphMode": "none",
        "textMode": "value_and_name",
    },
    "bargauge": {
        "reduceOptions": _NOW,
        "orientation": "horizontal",
        "displayMode": "gradient",
        "showUnfilled": True,
    },
    "table": {"showHeader": True, "cellHeight": "sm"},
}


def _targets(panel: Panel) -> list[dict[str, Any]]:
    instant = panel.kind != "timeseries"
    targets = []
    for index, query in enumerate(panel.queries):
        target: dict[str, Any] = {
            "refId": chr(ord("A") + index),
            "datasource": DATASOURCE,
            "expr": query.expr,
            "instant": instant,
            "range": not instant,
        }
        if panel.kind == "table":
            target["format"] = "table"
        else:
            target["legendFormat"] = query.legend
        targets.append(target)
    return targets


def _table_columns(panel: Panel) -> list[dict[str, Any]]:
    """One row per series: the queries' frames merged on their labels, each value
    column named by its query, Grafana's time column left out."""
    if len(panel.queries) == 1:
        names = {"Value": panel.queries[0].legend}
    else:
        names = {f"Value #{chr(ord('A') + i)}": q.legend for i, q in enumerate(panel.queries)}
    return [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": names}},
    ]


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    if panel.kind not in _OPTIONS:
        raise ValueError(f"panel {panel.title!r}: no panel kind {panel.kind!r}")
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": _field_config(panel),
        "options": _OPTIONS[panel.kind],
        "targets": _targets(panel),
    }
    if panel.kind == "table":
        body["transformations"] = _table_columns(panel)
    return body


def _layout(rows: tuple[Row, ...]) -> list[dict[str, Any]]:
    """Each row's title bar, then its panels left to right, wrapping at the grid's width."""
    panels: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = line_height = 0
        for panel in row.panels:
            if not 0 < panel.width <= GRID_WIDTH:
                raise ValueError(f"panel {panel.title!r}: width {panel.width} not in 1-24")
            if x + panel.width > GRID_WIDTH:
                y, x, line_height = y + line_height, 0, 0
            panels.append(_panel(panel, len(panels) + 1, x, y))
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return panels


def build_dashboard(rows: tuple[Row, ...] = ROWS) -> dict[str, Any]:
    """The dashboard's JSON model, from its rows."""
    return {
        "title": TITLE,
        "uid": UID,
        "description": "GPU quota, use, waiting lines, budgets, idle GPUs and the health "
        "of the jupyterhub-gpu service, from its metrics and the hub's.",
        "tags": ["jupyterhub", "gpu"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "1m",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": TEMPLATING},
        "panels": _layout(rows),
    }


def dashboard_json(rows: tuple[Row, ...] = ROWS) -> str:
    """The dashboard as the package ships it (``DASHBOARD_FILE``)."""
    return json.dumps(build_dashboard(rows), indent=2, ensure_ascii=False) + "\n"


def dashboard() -> dict[str, Any]:
    """The shipped dashboard, parsed."""
    return json.loads(DASHBOARD_FILE.read_text())


def panel_queries(model: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (panel, target) of a dashboard's JSON model, rows' own panels included."""
    for panel in model["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner, target


def configmap_yaml() -> str:
    """The shipped dashboard as a ConfigMap kube-prometheus-stack's Grafana sidecar loads."""
    label, value = SIDECAR_LABEL
    text = DASHBOARD_FILE.read_text()
    body = "".join("    " + line if line.strip() else line for line in text.splitlines(True))
    return (
        "# The jupyterhub-gpu Grafana dashboard as a ConfigMap for kube-prometheus-stack's\n"
        "# Grafana, whose sidecar loads the dashboards of every ConfigMap labelled\n"
        f'# {label}: "{value}" (in any namespace, by the chart\'s default). The same\n'
        "# dashboard as the package's jupyterhub_gpu/grafana/jupyterhub-gpu.json (rendered\n"
        "# from it by jupyterhub_gpu.grafana.configmap_yaml). Apply it in the namespace\n"
        "# of your Grafana:\n"
        "#\n"
        "#   kubectl apply --server-side -n monitoring \\\n"
        "#       -f helm-values/alerts/grafana-dashboard.yaml\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        f"  name: {CONFIGMAP_NAME}\n"
        "  labels:\n"
        "    app.kubernetes.io/name: jupyterhub-gpu\n"
        f'    {label}: "{value}"\n'
        "data:\n"
        f"  {CONFIGMAP_KEY}: |\n" + body
    )
