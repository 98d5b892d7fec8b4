"""The alerting rules: every alert fires when it should and stays quiet when it should
not, as Prometheus's own `promtool test rules` evaluates them over series in time,
and the PrometheusRule and kube-prometheus-stack forms hold the very same rules.

promtool comes with Debian's `prometheus` package, which the test command installs.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyterhub_gpu.alerts import (
    DOCS_URL,
    RULES_FILE,
    RUNBOOK_PAGE,
    kube_prometheus_stack_values_yaml,
    prometheus_rule_yaml,
    rule_groups,
    rules_text,
)
from jupyterhub_gpu.alerts.__main__ import main as render_main

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "helm-values" / "alerts"
PROMETHEUS_RULE = ALERTS / "prometheusrule.yaml"
KPS_VALUES = ALERTS / "kube-prometheus-stack.yaml"
SEVERITIES = {"critical", "warning", "info"}
JOB = 'job="jupyterhub-gpu"'
OPERATIONS = ROOT / "docs" / "operations.md"
LAB_SETTINGS = ROOT / "jupyterlab-gpu" / "jupyterhub_gpu_jupyterlab" / "handlers.py"


def promtool(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    assert tool, "promtool not found: the test command installs Debian's prometheus package"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, check=False)


def alert_names() -> list[str]:
    return [rule["alert"] for group in rule_groups() for rule in group["rules"]]


# ---- the expected alerts, with their words -------------------------------------------


def fired(severity: str, labels: dict[str, str], summary: str, description: str, anchor: str):
    return {
        "exp_labels": {"severity": severity, **labels},
        "exp_annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{DOCS_URL}{RUNBOOK_PAGE}#{anchor}",
        },
    }


def budget_low(group: str, percent: str) -> dict:
    return fired(
        "info",
        {"job": "jupyterhub-gpu", "group": group},
        f"Group {group} has used {percent} of its GPU budget",
        f"Group {group} has used {percent} of its GPU budget in the budget's window. "
        "Once it is used up, new GPU servers of the group are refused (and with "
        "when_exhausted: stop its running GPU servers are stopped after their grace). "
        "Tell the group, or raise budget.gpu_hours (or budget.units) of the group in the "
        "policy.",
        "alert-budget-low",
    )


def budget_exhausted(group: str, hours: str) -> dict:
    return fired(
        "warning",
        {"job": "jupyterhub-gpu", "group": group},
        f"Group {group} has used up its GPU budget",
        f"Group {group} has used {hours} GPU-hours (billed units, for a budget in units) "
        "in its budget's window, its whole budget: new GPU servers of the group are "
        "refused (and with when_exhausted: stop its running GPU servers are stopped after "
        "their grace) until older use leaves the window. If the group needs more, raise "
        "budget.gpu_hours (or budget.units) of the group in the policy.",
        "alert-budget-exhausted",
    )


def group_full(group: str, waiting: int) -> dict:
    return fired(
        "warning",
        {"job": "jupyterhub-gpu", "group": group},
        f"Spawns have been waiting in group {group} for 15 minutes",
        f"Group {group} is at its limit (or a parent group is at its own) and its waiting "
        f"line has not been empty for 15 minutes ({waiting} waiting now or within 5 "
        "minutes). Raise the group's limit or quota in the policy, ask its members to stop "
        "servers they do not use, or give it an idle rule; the GPU dashboard shows who "
        "holds its GPUs.",
        "alert-group-full",
    )


def over_limit(group: str, held: str, flavor: str | None = None) -> dict:
    labels = {"job": "jupyterhub-gpu", "group": group}
    if flavor:
        labels["flavor"] = flavor
    what = f"{flavor} devices" if flavor else "GPU-equivalents"
    return fired(
        "warning",
        labels,
        f"Group {group}'s server pods hold more than its limit",
        f"The server pods of group {group} hold {held} {what}, more than its limit, which "
        "the hub never admits: the hub's ledger and the pods disagree. If the limit was "
        "lowered under running servers (the GPU dashboard lists the group as over its "
        "limit), ask the group to stop servers, stop some from the dashboard, or set "
        "GPUService.stop_over_limit_after so the service stops its youngest ones. "
        "Otherwise pods run that the hub did not admit (servers from before the GPU "
        "spawner, pods created by hand or by another hub with the same labels): list them "
        f"with kubectl get pods -A -l gpu.jupyterhub.org/group={group} and delete those no "
        "hub server owns.",
        "alert-group-over-limit",
    )


def idle_gpus(pod: str, percent: str, namespace: str = "jhub") -> dict:
    return fired(
        "info",
        {"namespace": namespace, "pod": pod},
        f"Server {namespace}/{pod} has held idle GPUs for 4 hours",
        f"The GPUs of server pod {pod} (namespace {namespace}) have been below 5% "
        f"utilisation (at most {percent}%) for 4 hours. Ask its user to stop it, or give "
        "its group an idle rule (idle: {after: 2h}) so such servers are warned and stopped.",
        "alert-idle-gpus",
    )


def missing_series(count: int) -> dict:
    return fired(
        "warning",
        {"job": "jupyterhub-gpu"},
        f"{count} GPU servers past their idle time have no DCGM series",
        f"The idle rule judges {count} servers by GPU utilisation that Prometheus has no "
        "DCGM series for, so they are neither warned nor stopped however idle they are. "
        "Check that dcgm-exporter runs on their nodes, that Prometheus scrapes it with "
        "honor_labels (otherwise its pod label is renamed exported_pod), and that it maps "
        "devices to pods; the idle servers task on the GPU dashboard names the pods.",
        "alert-idle-rule-missing-series",
    )


def claim_missing(group: str, dataset: str, claim: str, namespace: str) -> dict:
    return fired(
        "warning",
        {
            "job": "jupyterhub-gpu",
            "group": group,
            "dataset": dataset,
            "claim": claim,
            "namespace": namespace,
        },
        f"Servers of group {group} cannot start without claim {claim}",
        f"The dataset {dataset} of group {group} mounts the PersistentVolumeClaim {claim}, "
        f"and there is none in namespace {namespace}, where the group's servers run: the hub "
        f"refuses every spawn of the group, naming the claim. Create the claim there (kubectl "
        f"-n {namespace} get pvc shows what is), or remove the dataset from the group's "
        "datasets in the policy.",
        "alert-dataset-claim-missing",
    )


def service_down() -> dict:
    return fired(
        "critical",
        {},
        "No metrics from the jupyterhub-gpu service for 10 minutes",
        "Prometheus has had no jupyterhub_gpu_* series for 10 minutes: the GPU service in "
        "the hub pod is down, or Prometheus cannot scrape /services/gpu/metrics. Until it "
        "is back there is no GPU dashboard, and no max_runtime, idle or budget stop is "
        "made. Look at the scrape target's state in Prometheus first: a 403 is a token "
        "without read:metrics, a timeout the hub's network policy. If the target is down, "
        "read the service's lines in the hub pod's log (kubectl logs deploy/hub in the "
        "hub's namespace): a service that exits at start says why there (a policy it "
        "cannot load, a permission it lacks); fix that and restart the hub pod (kubectl "
        "rollout restart deploy/hub).",
        "alert-service-down",
    )


def reconcile_failing(failures: int) -> dict:
    return fired(
        "warning",
        {"job": "jupyterhub-gpu", "task": "reconcile"},
        "The jupyterhub-gpu reconcile has been failing for 15 minutes",
        f"The GPU service's reconcile has failed {failures} times in a row and has not "
        "succeeded for 15 minutes, so namespaces, quotas, priority classes and queues may "
        "not match the policy. Its last error is under Service health on the GPU dashboard "
        "and in the hub pod's log; a permission error means the service's RBAC lacks what "
        "the docs list.",
        "alert-reconcile-failing",
    )


TASK_ACTIONS = {
    "hub servers": "the service cannot reach the hub's API (is the hub up, does the "
    "service's token still work?)",
    "GPU time": "the usage database (GPUPolicy.accounting_url: is it up, reachable, with room?)",
    "idle servers": "Prometheus, which the idle rule asks (GPUService.prometheus_url)",
    "orphaned pods": "the Kubernetes API server, or a permission the service lacks (a 403: "
    "apply the RBAC jupyterhub-gpu manifests renders)",
}


def task_failing(task: str, failures: int) -> dict:
    return fired(
        "warning",
        {"job": "jupyterhub-gpu", "task": task},
        f"The jupyterhub-gpu task {task} has been failing for 15 minutes",
        f"The GPU service's task {task} has failed {failures} times in a row and has not "
        "succeeded for 15 minutes: what it keeps (usage, GPU time, budget, max_runtime and "
        "idle stops) may be stale or not made. Read its last error under Service health on "
        "the GPU dashboard (or in the hub pod's log) and fix what it names: "
        f"{TASK_ACTIONS[task]}. Restarting the service does not fix a cause outside it.",
        "alert-service-task-failing",
    )


SPAWN_ACTIONS = {
    "group_full": "The group or a parent is at its limit: raise its limit or quota in the "
    "policy, ask its members to stop servers they do not use, give it an idle rule, or let "
    "spawns wait (when_full: wait).",
    "options": "Users ask for more than the policy gives them: tell them what it allows, "
    "or change the group's per_user caps, limit or profiles.",
    "usage_database": "The usage database cannot be read, so no budget can be checked: "
    "bring it back (GPUPolicy.accounting_url).",
    "server_exited": "Servers exited before they served: the single-user image or its "
    "start command is broken (the spawn page showed its log).",
}


def spawns_refused(group: str | None, reason: str, count: int) -> dict:
    labels = {"reason": reason} | ({"group": group} if group else {})
    return fired(
        "warning",
        labels,
        f"{count} spawns refused in 30 minutes{f' in group {group}' if group else ''}: {reason}",
        f"The hub refused {count} spawns"
        f"{f' of group {group}' if group else ' before a group was chosen'} in the last 30 "
        f"minutes, as {reason}; each user was told why, and the hub's log has the words. "
        f"{SPAWN_ACTIONS[reason]}",
        "alert-spawns-refused",
    )


def database_down(seen_by: str, job: str) -> dict:
    if seen_by == "hub":
        effect = (
            "Every new GPU server of a group with a budget is refused until it is back "
            "(unless GPUPolicy.accounting_fail_open admits them unchecked); starts and stops "
            "are kept in the hub's memory meanwhile."
        )
    else:
        effect = (
            "GPU time is not recorded and no budget stop is made until it is back; what it "
            "saw meanwhile is kept in memory and written then."
        )
    return fired(
        "critical",
        {"job": job, "seen_by": seen_by},
        f"The {seen_by} has failed to use the GPU usage database for 5 minutes",
        f"The {seen_by} has not written and read the usage database for 5 minutes. {effect} "
        "Read the database's error under Service health on the GPU dashboard or in the hub "
        "pod's log, and bring the database back (GPUPolicy.accounting_url: is it up, "
        "reachable from the hub pod, with room on its disk?).",
        "alert-usage-database-down",
    )


# ---- the series over time, and what must (not) fire when -----------------------------


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    """A series in promtool's notation (`a+bxN`: N more samples, one a minute)."""
    inner = ",".join([f'{k}="{v}"' for k, v in labels.items()])
    return {"series": f"{name}{{{inner}}}", "values": values}


def service(name: str, values: str, **labels: str) -> dict[str, str]:
    """A series of the GPU service, as Prometheus scrapes it."""
    return series(f"jupyterhub_gpu_{name}", values, job="jupyterhub-gpu", **labels)


def at(minutes: int, alertname: str, *alerts: dict) -> dict[str, Any]:
    return {"eval_time": f"{minutes}m", "alertname": alertname, "exp_alerts": list(alerts)}


BUDGETS = {
    "interval": "1m",
    "input_series": [
        # 90% used from the start, rising
        service("group_gpu_hours_used", "900+1x40", group="students"),
        service("group_gpu_hours_budget", "1000x40", group="students"),
        # 85% used: low, as JupyterLab tells the group's members from 80%
        service("group_gpu_hours_used", "850x40", group="vision"),
        service("group_gpu_hours_budget", "1000x40", group="vision"),
        # 70% used: not low yet
        service("group_gpu_hours_used", "700x40", group="history"),
        service("group_gpu_hours_budget", "1000x40", group="history"),
        # half used
        service("group_gpu_hours_used", "500x40", group="research"),
        service("group_gpu_hours_budget", "1000x40", group="research"),
        # used up from the start
        service("group_gpu_hours_used", "1000+1x40", group="physics"),
        service("group_gpu_hours_budget", "1000x40", group="physics"),
        # low for ten minutes (not long enough to say so), then used up
        service("group_gpu_hours_used", "950+5x40", group="chemistry"),
        service("group_gpu_hours_budget", "1000x40", group="chemistry"),
        # no budget: GPU-hours shown, never alerted on
        service("group_gpu_hours_used", "5000x40", group="test"),
        # budgets in billed units: 90% used, and used up
        service("group_billed_units_used", "450x40", group="metered"),
        service("group_billed_units_budget", "500x40", group="metered"),
        service("group_billed_units_used", "600x40", group="priced"),
        service("group_billed_units_budget", "500x40", group="priced"),
    ],
    "alert_rule_test": [
        at(10, "JupyterHubGPUBudgetLow"),
        at(
            20,
            "JupyterHubGPUBudgetLow",
            budget_low("metered", "90%"),
            budget_low("students", "92%"),
            budget_low("vision", "85%"),
        ),
        at(3, "JupyterHubGPUBudgetExhausted"),
        at(
            20,
            "JupyterHubGPUBudgetExhausted",
            budget_exhausted("chemistry", "1050.0"),
            budget_exhausted("physics", "1020.0"),
            budget_exhausted("priced", "600.0"),
        ),
    ],
}

GROUPS = {
    "interval": "1m",
    "input_series": [
        # two spawns waiting from minute 6
        service("group_waiting", "0x5 2x40", group="research"),
        # spawns time out and are tried again: the line is empty for 2-3 minutes at a time
        service("group_waiting", "1x9 0x2 1x9 0x2 1x25", group="students"),
        # a short wait
        service("group_waiting", "0x5 3x4 0x35", group="physics"),
        # pods over the group's limit, at it, and over one flavor's limit
        service("group_gpus_allocated", "14x40", group="research"),
        service("group_gpus_limit", "12x40", group="research"),
        service("group_gpus_allocated", "4x40", group="students"),
        service("group_gpus_limit", "4x40", group="students"),
        service("group_flavor_allocated", "5x40", group="students", flavor="mig-1g.5gb"),
        service("group_flavor_limit", "4x40", group="students", flavor="mig-1g.5gb"),
        service("group_flavor_allocated", "1x40", group="students", flavor="a100"),
        service("group_flavor_limit", "2x40", group="students", flavor="a100"),
        # servers past their idle time, three of them without DCGM series from minute 6
        service("idle_servers_judged_by_dcgm", "4x40"),
        service("idle_servers_without_dcgm_series", "0x5 3x35"),
    ],
    "alert_rule_test": [
        at(10, "JupyterHubGPUGroupFull"),
        at(15, "JupyterHubGPUGroupFull", group_full("students", 1)),
        at(25, "JupyterHubGPUGroupFull", group_full("research", 2), group_full("students", 1)),
        at(10, "JupyterHubGPUGroupOverLimit"),
        at(
            20,
            "JupyterHubGPUGroupOverLimit",
            over_limit("research", "14"),
            over_limit("students", "5", flavor="mig-1g.5gb"),
        ),
        at(30, "JupyterHubGPUIdleRuleMissingSeries"),
        at(40, "JupyterHubGPUIdleRuleMissingSeries", missing_series(3)),
    ],
}


def dcgm(metric: str, values: str, pod: str, namespace: str = "jhub", **labels: str):
    """dcgm-exporter's series for a pod (scraped with honor_labels)."""
    return series(
        metric,
        values,
        Hostname="gpu-1",
        namespace=namespace,
        pod=pod,
        container="notebook",
        **labels,
    )


IDLE = {
    "interval": "1m",
    "input_series": [
        # idle from its start
        dcgm("DCGM_FI_DEV_GPU_UTIL", "2x400", "jupyter-ann", gpu="0"),
        # busy
        dcgm("DCGM_FI_DEV_GPU_UTIL", "80x400", "jupyter-bob", gpu="1"),
        # busy for an hour, then idle
        dcgm("DCGM_FI_DEV_GPU_UTIL", "90x60 1x340", "jupyter-cat", gpu="2"),
        # two GPUs, one of them busy: in use
        dcgm("DCGM_FI_DEV_GPU_UTIL", "1x400", "jupyter-dan", gpu="3"),
        dcgm("DCGM_FI_DEV_GPU_UTIL", "70x400", "jupyter-dan", gpu="4"),
        # a MIG slice: the graphics engine's active ratio, 1%
        dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.01x400", "jupyter-eve", gpu="5", GPU_I_ID="3"),
        # a whole GPU that reports both: its utilisation counts
        dcgm("DCGM_FI_DEV_GPU_UTIL", "60x400", "jupyter-fay", gpu="6"),
        dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.01x400", "jupyter-fay", gpu="6"),
        # a pod that is not a notebook server
        dcgm("DCGM_FI_DEV_GPU_UTIL", "0x400", "train-job-1", gpu="7"),
        # idle, with 20 minutes without a scrape: still idle all along
        dcgm("DCGM_FI_DEV_GPU_UTIL", "1x100 _x20 1x279", "jupyter-gus", gpu="8"),
        # idle, with 40 minutes without a scrape: unknown then, so counted again after
        dcgm("DCGM_FI_DEV_GPU_UTIL", "1x100 _x40 1x259", "jupyter-hal", gpu="9"),
    ],
    "alert_rule_test": [
        at(230, "JupyterHubGPUIdleGPUs"),
        at(
            250,
            "JupyterHubGPUIdleGPUs",
            idle_gpus("jupyter-ann", "2"),
            idle_gpus("jupyter-eve", "1"),
            idle_gpus("jupyter-gus", "1"),
        ),
        at(
            340,
            "JupyterHubGPUIdleGPUs",
            idle_gpus("jupyter-ann", "2"),
            idle_gpus("jupyter-cat", "1"),
            idle_gpus("jupyter-eve", "1"),
            idle_gpus("jupyter-gus", "1"),
        ),
        at(
            390,
            "JupyterHubGPUIdleGPUs",
            idle_gpus("jupyter-ann", "2"),
            idle_gpus("jupyter-cat", "1"),
            idle_gpus("jupyter-eve", "1"),
            idle_gpus("jupyter-gus", "1"),
            idle_gpus("jupyter-hal", "1"),
        ),
    ],
}

TASKS = {
    "interval": "1m",
    "input_series": [
        # failing from minute 11, retried with backoff
        service("task_consecutive_failures", "0x10 1x4 2x4 3x30", task="reconcile"),
        service("task_consecutive_failures", "0x5 1x43", task="GPU time"),
        # one failure, then a success: no alert
        service("task_consecutive_failures", "0x10 1x3 0x35", task="hub servers"),
        service("task_consecutive_failures", "0x48", task="runtime rules"),
        # the other tasks each say what to look at
        service("task_consecutive_failures", "0x5 1x43", task="hub servers"),
        service("task_consecutive_failures", "0x5 2x43", task="idle servers"),
        service("task_consecutive_failures", "0x5 1x43", task="orphaned pods"),
    ],
    "alert_rule_test": [
        at(20, "JupyterHubGPUReconcileFailing"),
        at(30, "JupyterHubGPUReconcileFailing", reconcile_failing(3)),
        at(15, "JupyterHubGPUServiceTaskFailing"),
        at(
            30,
            "JupyterHubGPUServiceTaskFailing",
            task_failing("GPU time", 1),
            task_failing("hub servers", 1),
            task_failing("idle servers", 2),
            task_failing("orphaned pods", 1),
        ),
        # the service answers all along
        at(45, "JupyterHubGPUServiceDown"),
    ],
}

SERVICE_GONE = {
    "interval": "1m",
    "input_series": [
        # scraped for half an hour, then no more
        service("task_consecutive_failures", "0x30", task="reconcile"),
        service("task_consecutive_failures", "0x30", task="hub servers"),
    ],
    "alert_rule_test": [
        at(20, "JupyterHubGPUServiceDown"),
        at(40, "JupyterHubGPUServiceDown"),
        at(50, "JupyterHubGPUServiceDown", service_down()),
        # no series, no other alert
        at(50, "JupyterHubGPUReconcileFailing"),
    ],
}

NEVER_SCRAPED = {
    "interval": "1m",
    "input_series": [series("up", "1x30", job="other")],
    "alert_rule_test": [
        at(5, "JupyterHubGPUServiceDown"),
        at(15, "JupyterHubGPUServiceDown", service_down()),
    ],
}

DATASETS = {
    "interval": "1m",
    "input_series": [
        # missing from the start
        service(
            "dataset_claim_missing",
            "1x20",
            group="research",
            dataset="scratch",
            claim="research-scratch",
            namespace="gpu-research",
        ),
        # found all along
        service(
            "dataset_claim_missing",
            "0x20",
            group="vision",
            dataset="shared",
            claim="dept-shared",
            namespace="gpu-vision",
        ),
        # missing for three minutes, then created: never long enough to say so
        service(
            "dataset_claim_missing",
            "1x2 0x18",
            group="students",
            dataset="course",
            claim="course-data",
            namespace="gpu-students",
        ),
        # missing, then created at minute 10
        service(
            "dataset_claim_missing",
            "1x9 0x11",
            group="physics",
            dataset="scratch",
            claim="physics-scratch",
            namespace="gpu-physics",
        ),
    ],
    "alert_rule_test": [
        at(3, "JupyterHubGPUDatasetClaimMissing"),
        at(
            7,
            "JupyterHubGPUDatasetClaimMissing",
            claim_missing("physics", "scratch", "physics-scratch", "gpu-physics"),
            claim_missing("research", "scratch", "research-scratch", "gpu-research"),
        ),
        at(
            15,
            "JupyterHubGPUDatasetClaimMissing",
            claim_missing("research", "scratch", "research-scratch", "gpu-research"),
        ),
    ],
}


def hub(name: str, values: str, **labels: str) -> dict[str, str]:
    """A series of the hub's own /hub/metrics, as Prometheus scrapes it."""
    return series(f"jupyterhub_gpu_{name}", values, job="jupyterhub", **labels)


SPAWNS_REFUSED = {
    "interval": "1m",
    "input_series": [
        # the group is full: a refusal a minute from minute 4 (the hub makes the series
        # at its first refusal, which counts too)
        hub("spawns_refused_total", "_x4 1+1x30", group="students", reason="group_full"),
        # three budget refusals: too few to say so
        hub("spawns_refused_total", "1x5 2x5 3x20", group="research", reason="budget"),
        # options no group allows, refused before a group is chosen, from minute 10
        hub("spawns_refused_total", "_x10 1+1x20", reason="options"),
        # four servers exited: too few
        hub("spawns_refused_total", "_x2 1+1x3 4x25", group="vision", reason="server_exited"),
    ],
    "alert_rule_test": [
        at(10, "JupyterHubGPUSpawnsRefused"),
        at(
            25,
            "JupyterHubGPUSpawnsRefused",
            spawns_refused(None, "options", 16),
            spawns_refused("students", "group_full", 22),
        ),
    ],
}

SPAWNS_REFUSED_SINCE_LONG = {
    "interval": "1m",
    "input_series": [
        # refused ten times long ago, then the usage database goes away at minute 42
        hub("spawns_refused_total", "10x40 10+1x40", group="physics", reason="usage_database"),
        # the hub restarts at minute 41 (its counter starts again) and refuses a spawn a
        # minute after it
        hub("spawns_refused_total", "3x40 1+1x40", group="research", reason="group_full"),
        # long-standing counters that do not move
        hub("spawns_refused_total", "20x80", group="chemistry", reason="budget"),
        hub("spawns_refused_total", "9x80", group="vision", reason="server_exited"),
    ],
    "alert_rule_test": [
        # what was refused more than 30 minutes ago no longer counts
        at(40, "JupyterHubGPUSpawnsRefused"),
        at(
            60,
            "JupyterHubGPUSpawnsRefused",
            spawns_refused("physics", "usage_database", 19),
            spawns_refused("research", "group_full", 20),
        ),
    ],
}

USAGE_DATABASE = {
    "interval": "1m",
    "input_series": [
        # the hub's side fails from minute 11
        hub("hub_accounting_up", "1x10 0x30"),
        # the service's: a blip of two minutes, then failing from minute 20
        service("accounting_up", "1x10 0x1 1x7 0x20"),
    ],
    "alert_rule_test": [
        at(14, "JupyterHubGPUUsageDatabaseDown"),
        at(20, "JupyterHubGPUUsageDatabaseDown", database_down("hub", "jupyterhub")),
        at(
            30,
            "JupyterHubGPUUsageDatabaseDown",
            database_down("GPU service", "jupyterhub-gpu"),
            database_down("hub", "jupyterhub"),
        ),
    ],
}

CASES = [
    BUDGETS,
    GROUPS,
    IDLE,
    DATASETS,
    TASKS,
    SERVICE_GONE,
    NEVER_SCRAPED,
    SPAWNS_REFUSED,
    SPAWNS_REFUSED_SINCE_LONG,
    USAGE_DATABASE,
]


def write_tests(tmp_path: Path, cases: list[dict], rules: Path = RULES_FILE) -> Path:
    path = tmp_path / "jupyterhub-gpu.rules.test.yaml"
    path.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": cases},
            sort_keys=False,
            width=1000,
        )
    )
    return path


# ---- the tests ---------------------------------------------------------------------


def test_the_rules_file_is_valid_for_promtool():
    result = promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_as_promtool_evaluates_it(tmp_path):
    result = promtool("test", "rules", str(write_tests(tmp_path, CASES)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_both_firing_and_quiet():
    firing, quiet = set(), set()
    for case in CASES:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == set(alert_names()), set(alert_names()) - firing
    assert quiet == set(alert_names()), set(alert_names()) - quiet


def test_a_wrong_expectation_fails(tmp_path):
    """The promtool test can fail: an alert expected before its `for:` has passed."""
    wrong = yaml.safe_load(yaml.safe_dump(BUDGETS))
    wrong["alert_rule_test"][0] = at(10, "JupyterHubGPUBudgetLow", budget_low("students", "91%"))
    result = promtool("test", "rules", str(write_tests(tmp_path, [wrong])))
    assert result.returncode != 0, result.stdout
    assert "alertname: JupyterHubGPUBudgetLow, time: 10m" in result.stdout + result.stderr

    # and words that differ from what the rule says
    words = yaml.safe_load(yaml.safe_dump(TASKS))
    words["alert_rule_test"][1] = at(30, "JupyterHubGPUReconcileFailing", reconcile_failing(2))
    result = promtool("test", "rules", str(write_tests(tmp_path, [words])))
    assert result.returncode != 0, result.stdout
    assert "JupyterHubGPUReconcileFailing" in result.stdout + result.stderr


def test_each_alert_has_a_severity_a_duration_and_words():
    for group in rule_groups():
        for rule in group["rules"]:
            name = rule["alert"]
            assert rule["labels"]["severity"] in SEVERITIES, name
            assert rule.get("for"), name
            assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name


@pytest.mark.parametrize(
    ("path", "render"),
    [(PROMETHEUS_RULE, prometheus_rule_yaml), (KPS_VALUES, kube_prometheus_stack_values_yaml)],
    ids=["prometheusrule", "kube-prometheus-stack"],
)
def test_the_kube_prometheus_stack_forms_are_rendered_from_the_rules_file(path, render):
    regenerate = (
        f"python3 -c 'import jupyterhub_gpu.alerts as a; print(a.{render.__name__}(), end=\"\")'"
        f" > {path.relative_to(ROOT)}"
    )
    assert path.read_text() == render(), f"out of date: {regenerate}"


def test_the_prometheus_rule_holds_the_same_rules(tmp_path):
    obj = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert "namespace" not in obj["metadata"]  # kubectl apply -n <Prometheus's namespace>
    assert obj["spec"] == {"groups": rule_groups()}
    values = yaml.safe_load(KPS_VALUES.read_text())
    assert values == {"additionalPrometheusRulesMap": {"jupyterhub-gpu": {"groups": rule_groups()}}}
    # the object's rules, as the operator hands them to Prometheus, pass promtool too
    spec = tmp_path / "from-prometheusrule.yaml"
    spec.write_text(yaml.safe_dump(obj["spec"]))
    result = promtool("check", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_docs_explain_every_alert():
    # Operations > Alerts explains every one, in one place an operator looks
    docs = (ROOT / "docs" / "operations.md").read_text()
    missing = [name for name in alert_names() if f"`{name}`" not in docs]
    assert not missing, f"docs/operations.md does not explain {missing}"


def test_every_runbook_url_points_at_the_alert_s_own_entry_in_the_operations_guide():
    docs = OPERATIONS.read_text()
    for group in rule_groups():
        for rule in group["rules"]:
            name, url = rule["alert"], rule["annotations"]["runbook_url"]
            page, _, anchor = url.partition("#")
            assert page == DOCS_URL + RUNBOOK_PAGE, (name, url)
            # a MyST target right before the alert's own heading
            target = f"({anchor})=\n#### `{name}` ("
            assert target in docs, f"docs/operations.md has no {target!r}"
            entry = docs.split(target, 1)[1].split("\n#### ", 1)[0]
            assert "What to do" in entry or "what to do" in entry, name


def test_the_budget_low_alert_fires_where_jupyterlab_tells_users():
    # JupyterLab's status extension tells a user once a budget is this much used; the
    # admins' alert uses the same fraction, so the group hears of it when they do
    tree = ast.parse(LAB_SETTINGS.read_text())
    (setting,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", None) == "budget_low_fraction"
    ]
    # GPUStatus.budget_low_fraction = Float(<default>, help=...).tag(config=True)
    (trait,) = [
        call
        for call in ast.walk(setting)
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Float"
    ]
    lab = ast.literal_eval(trait.args[0])
    (rule,) = [
        r for g in rule_groups() for r in g["rules"] if r["alert"] == "JupyterHubGPUBudgetLow"
    ]
    threshold = re.search(r">= ([0-9.]+) < 1", rule["expr"])
    assert threshold, rule["expr"]
    assert float(threshold.group(1)) == lab == 0.8
    # the notes at the top of the file and the docs say the same
    assert "budget low                 0.8 (80% of the budget used" in RULES_FILE.read_text()
    assert "80% for a low budget" in OPERATIONS.read_text()


@pytest.mark.parametrize("form", ["rules", "prometheusrule", "kube-prometheus-stack"])
def test_a_site_renders_the_rules_with_its_own_docs_address(form, tmp_path, capsys):
    site = "https://docs.uni.example/gpu-hub"
    assert render_main(["--docs-url", site, "--release", "monitoring-stack", form]) == 0
    text = capsys.readouterr().out
    assert DOCS_URL not in text
    loaded = yaml.safe_load(text)
    groups = {
        "rules": lambda: loaded["groups"],
        "prometheusrule": lambda: loaded["spec"]["groups"],
        "kube-prometheus-stack": lambda: loaded["additionalPrometheusRulesMap"]["jupyterhub-gpu"][
            "groups"
        ],
    }[form]()
    assert groups == rule_groups(site)
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"]]
    assert len(urls) == len(alert_names())
    assert all(u.startswith(f"{site}/{RUNBOOK_PAGE}#alert-") for u in urls), urls
    if form == "prometheusrule":
        assert loaded["metadata"]["labels"]["release"] == "monitoring-stack"
    # still rules promtool loads
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    # the default form is the file the package ships
    assert rules_text() == RULES_FILE.read_text()


def test_a_docs_address_that_is_not_a_url_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        render_main(["--docs-url", "docs/_build/html", "rules"])
    assert exit_.value.code == 2
    assert "--docs-url must be an http(s) address" in capsys.readouterr().err
