"""The example Alertmanager configuration: amtool accepts it, routes every shipped alert to
the receivers the operations guide's table says, a real Alertmanager holds back what its
inhibition rules say while the service or the usage database is down, and its
kube-prometheus-stack form holds the same configuration.

amtool and the Alertmanager come with Debian's ``prometheus-alertmanager`` package, which
the test command installs.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from test_alerts import CASES, alert_names

from jupyterhub_gpu.alerts import (
    ALERTMANAGER_FILE,
    ALERTMANAGER_SECRET,
    alertmanager_values_yaml,
    rule_groups,
)
from jupyterhub_gpu.alerts.__main__ import main as render_main
from jupyterhub_gpu_dev.localcluster.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
KPS_VALUES = ROOT / "helm-values" / "alerts" / "kube-prometheus-stack-alertmanager.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
#: the heading of the operations guide's table of where each alert goes
ROUTES_HEADING = "### Where each alert goes"
SEVERITY = {r["alert"]: r["labels"]["severity"] for g in rule_groups() for r in g["rules"]}


def amtool(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("amtool")
    assert tool, "amtool not found: the test command installs Debian's prometheus-alertmanager"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, check=False)


# ---- the operations guide's table -----------------------------------------------------


@dataclass(frozen=True)
class Route:
    alert: str
    labels: tuple[tuple[str, str], ...]
    receivers: frozenset[str]

    def __str__(self) -> str:
        return " ".join([self.alert, *(f"{k}={v}" for k, v in self.labels)])


def documented_routes() -> list[Route]:
    """The rows of the guide's table: an alert, example labels, the receivers told."""
    section = OPERATIONS.read_text().split(ROUTES_HEADING, 1)[1].split("\n#", 1)[0]
    routes = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`JupyterHubGPU"):
            continue
        labels = tuple(re.findall(r'`(\w+)="([^"]*)"`', cells[1]))
        receivers = frozenset(re.findall(r"`([\w-]+)`", cells[2]))
        routes.append(Route(cells[0].strip("`"), labels, receivers))
    return routes


ROUTES = documented_routes()


def labels_carried() -> dict[str, set[str]]:
    """The labels each alert fires with, as the rules' tests expect them."""
    carried: dict[str, set[str]] = {}
    for case in CASES:
        for check in case["alert_rule_test"]:
            for alert in check["exp_alerts"]:
                carried.setdefault(check["alertname"], set()).update(alert["exp_labels"])
    return carried


def test_the_guide_says_where_every_shipped_alert_goes_with_labels_it_carries():
    assert ROUTES, f"docs/operations.md has no table under {ROUTES_HEADING!r}"
    assert {r.alert for r in ROUTES} == set(alert_names())
    carried = labels_carried()
    for route in ROUTES:
        assert route.receivers, str(route)
        names = {name for name, _ in route.labels}
        assert names <= carried[route.alert] - {"severity"}, f"{route}: not its labels"


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_amtool_routes_each_alert_to_the_receivers_the_guide_says(route):
    labels = [f"alertname={route.alert}", f"severity={SEVERITY[route.alert]}"]
    labels += [f"{name}={value}" for name, value in route.labels]
    result = amtool("config", "routes", "test", "--config.file", str(ALERTMANAGER_FILE), *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    told = set(result.stdout.strip().splitlines()[-1].split(","))
    assert told == route.receivers, f"{route}: amtool routes it to {told}"


# ---- the configuration and its kube-prometheus-stack form -----------------------------


def test_amtool_accepts_the_configuration_and_its_kube_prometheus_stack_form(tmp_path):
    result = amtool("check-config", str(ALERTMANAGER_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    values = yaml.safe_load(KPS_VALUES.read_text())["alertmanager"]
    copy = tmp_path / "from-values.yaml"
    copy.write_text(yaml.safe_dump(values["config"]))
    result = amtool("check-config", str(copy))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_slack_messages_render(tmp_path):
    """Alertmanager reads a message's template only when it sends it: amtool renders each
    with its own example alerts."""
    (tmp_path / "none.tmpl").write_text("")
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    slack = [c for r in config["receivers"] for c in r.get("slack_configs", [])]
    assert len(slack) == 2
    for message in slack:
        for field in ("title", "text"):
            result = amtool(
                "template",
                "render",
                f"--template.glob={tmp_path / 'none.tmpl'}",
                f"--template.text={message[field]}",
            )
            assert result.returncode == 0, f"{field}: {result.stdout}{result.stderr}"
        assert "|What to do>" in result.stdout


def test_a_route_to_a_receiver_that_is_not_defined_is_refused(tmp_path):
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    config["route"]["routes"][1]["receiver"] = "gpu-platfrom"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(config))
    result = amtool("check-config", str(broken))
    assert result.returncode != 0, result.stdout
    assert 'undefined receiver "gpu-platfrom"' in result.stdout + result.stderr


def test_the_kube_prometheus_stack_values_are_rendered_from_the_configuration():
    regenerate = (
        "python3 -m jupyterhub_gpu.alerts kube-prometheus-stack-alertmanager"
        f" > {KPS_VALUES.relative_to(ROOT)}"
    )
    assert KPS_VALUES.read_text() == alertmanager_values_yaml(), f"out of date: {regenerate}"
    values = yaml.safe_load(KPS_VALUES.read_text())
    assert values["alertmanager"]["config"] == yaml.safe_load(ALERTMANAGER_FILE.read_text())
    # the files the configuration reads its secrets from are the mounted Secret's
    assert values["alertmanager"]["alertmanagerSpec"]["secrets"] == [ALERTMANAGER_SECRET]
    files = re.findall(r"_file: (\S+)", ALERTMANAGER_FILE.read_text())
    assert len(files) == 2
    assert all(f.startswith(f"/etc/alertmanager/secrets/{ALERTMANAGER_SECRET}/") for f in files)


@pytest.mark.parametrize("form", ["alertmanager", "kube-prometheus-stack-alertmanager"])
def test_the_command_prints_the_configuration(form, capsys):
    assert render_main([form]) == 0
    shipped = ALERTMANAGER_FILE if form == "alertmanager" else KPS_VALUES
    assert capsys.readouterr().out == shipped.read_text()


# ---- a real Alertmanager: what is held back -------------------------------------------


@dataclass
class LocalAlertmanager:
    url: str

    def post(self, *alerts: dict[str, str], resolved: bool = False) -> None:
        now = datetime.now(UTC)
        ends = now - timedelta(seconds=1) if resolved else now + timedelta(hours=1)
        body = [
            {
                "labels": {"severity": SEVERITY[labels["alertname"]], **labels},
                "startsAt": (now - timedelta(minutes=20)).isoformat(),
                "endsAt": ends.isoformat(),
            }
            for labels in alerts
        ]
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def held_back(self) -> dict[tuple[tuple[str, str], ...], bool]:
        """Every firing alert (by its labels, severity aside): whether it is inhibited."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?active=true", timeout=10) as r:
            alerts = json.loads(r.read())
        return {
            tuple(sorted((k, v) for k, v in a["labels"].items() if k != "severity")): bool(
                a["status"]["inhibitedBy"]
            )
            for a in alerts
        }


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory) -> Iterator[LocalAlertmanager]:
    """Debian's Alertmanager on 127.0.0.1 with the example's routes and inhibition rules,
    its receivers without their e-mail and Slack (it tells nobody)."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert binary, "no Alertmanager: the test command installs prometheus-alertmanager"
    directory = tmp_path_factory.mktemp("alertmanager")
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    config["receivers"] = [{"name": receiver["name"]} for receiver in config["receivers"]]
    (directory / "alertmanager.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (directory / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={directory / 'alertmanager.yaml'}",
            f"--storage.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # one instance: no peers
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response,
            ):
                if response.status == 200:
                    break
            assert process.poll() is None, (directory / "alertmanager.log").read_text()
            assert time.monotonic() < deadline, "the Alertmanager did not become ready"
            time.sleep(0.2)
        yield LocalAlertmanager(url)
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def until(probe, what: str, within: float = 30):
    deadline = time.monotonic() + within
    while True:
        if found := probe():
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {probe()}"
        time.sleep(0.2)


def alert(name: str, **labels: str) -> dict[str, str]:
    return {"alertname": f"JupyterHubGPU{name}", **labels}


def key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_while_the_service_is_down_its_group_alerts_are_held_back_and_the_hub_s_are_not(
    alertmanager,
):
    down = alert("ServiceDown")
    held = [
        alert("BudgetExhausted", group="vision"),
        alert("GroupFull", group="physics"),
        alert("GroupOverLimit", group="students"),
        alert("DatasetClaimMissing", group="vision", dataset="d", claim="c", namespace="n"),
        alert("ServiceTaskFailing", task="hub servers"),
        alert("UsageDatabaseDown", seen_by="GPU service"),
    ]
    told = [
        alert("SpawnsRefused", group="vision", reason="group_full"),
        alert("IdleGPUs", namespace="jupyterhub-gpu-vision", pod="jupyter-ann"),
    ]
    alertmanager.post(down, *held, *told)
    expected = {key(down): False} | {key(a): True for a in held} | {key(a): False for a in told}
    until(lambda: alertmanager.held_back() == expected, "the group alerts held back")
    # the service is back: its alerts are told again
    alertmanager.post(down, resolved=True)
    expected = {key(a): False for a in [*held, *told]}
    until(lambda: alertmanager.held_back() == expected, "the group alerts told again")
    alertmanager.post(*held, *told, resolved=True)
    until(lambda: alertmanager.held_back() == {}, "every alert resolved")


def test_while_the_usage_database_is_down_the_refusals_and_failures_it_causes_are_held_back(
    alertmanager,
):
    down = alert("UsageDatabaseDown", seen_by="hub")
    held = [
        alert("SpawnsRefused", group="vision", reason="usage_database"),
        alert("ServiceTaskFailing", task="GPU time"),
        alert("ServiceTaskFailing", task="GPU budgets"),
    ]
    told = [
        alert("SpawnsRefused", group="vision", reason="budget"),
        alert("ServiceTaskFailing", task="orphaned pods"),
        alert("BudgetLow", group="physics"),
    ]
    alertmanager.post(down, *held, *told)
    expected = {key(down): False} | {key(a): True for a in held} | {key(a): False for a in told}
    until(lambda: alertmanager.held_back() == expected, "what the database causes held back")
    alertmanager.post(down, *held, *told, resolved=True)
    until(lambda: alertmanager.held_back() == {}, "every alert resolved")
