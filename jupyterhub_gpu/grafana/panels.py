"""The Grafana dashboard's content: its rows, their panels and each panel's PromQL.

A row is a topic an operator looks up; a panel is one question about it, answered by
one or more queries. The layout (panel ids, grid positions) is computed from the
order here, so a panel is added by adding one ``Panel`` to its row, and a topic by
adding a ``Row``. Amounts the service keeps per group over a window (GPU-hours, and
what it bills or measures per group beside them: units, cost, energy) belong in
*Budgets and GPU time*, each a series per ``group`` read with ``per_group`` (so
filtered by the ``$group`` variable) like the GPU-hours there.

The GPU service's series are taken with ``max by (...)``: in its own Deployment every
replica serves the same per-group numbers (each watches the pods and reads the usage
database), and a ServiceMonitor scrapes every replica, so a sum would count them
once per replica. The hub's refusal counters are summed: each hub process counts its
own.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the template variable's filter on the GPU service's and the hub's per-group series
GROUP = 'group=~"$group"'
#: utilisation below this (percent) is idle, as the idle-GPU alert and the idle rule say
IDLE_BELOW = 5
#: KubeSpawner's default pod names: the server pods the DCGM panels show
SERVER_PODS = 'pod=~"jupyter-.+"'


@dataclass(frozen=True)
class Query:
    expr: str
    #: the series' name in a legend (Grafana's legendFormat), or a table's column
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    #: timeseries (over the time range), or stat, bargauge, table (now)
    kind: str
    queries: tuple[Query, ...]
    description: str
    unit: str = "short"
    width: int = 12
    height: int = 8
    #: (from this value on, colour): the first step's value is None
    thresholds: tuple[tuple[float | None, str], ...] = ()
    #: a value's text and colour, e.g. {1: ("up", "green")}
    mappings: tuple[tuple[float, str, str], ...] = ()
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def per_group(metric: str, by: str = "group") -> str:
    """A GPU service gauge per group (and flavor), one series whatever the replicas."""
    return f"max by ({by}) (jupyterhub_gpu_{metric}{{{GROUP}}})"


def counted_in_range(counter: str, by: str, selector: str = "") -> str:
    """How much ``counter`` grew in the dashboard's time range, by ``by``; a counter
    born inside the range (at its first count) is counted from zero, which
    ``increase`` alone would miss."""
    series = f"{counter}{{{selector}}}" if selector else counter
    return (
        f"round(sum by ({by}) (\n"
        f"  ({series} unless {series} offset $__range)\n"
        f"  or\n"
        f"  increase({series}[$__range])\n"
        f")) > 0"
    )


GPU_UTILISATION = (
    f"max by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{{SERVER_PODS}}})\n"
    f"or\n"
    f"max by (namespace, pod) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{SERVER_PODS}}}) * 100"
)

IDLE_FOR_30_MINUTES = (
    "(\n"
    f"  max by (namespace, pod) (max_over_time(DCGM_FI_DEV_GPU_UTIL{{{SERVER_PODS}}}[30m]))\n"
    "  or\n"
    "  max by (namespace, pod) "
    f"(max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{SERVER_PODS}}}[30m])) * 100\n"
    f") < {IDLE_BELOW}"
)

BUDGET_STEPS = ((None, "green"), (0.8, "orange"), (1.0, "red"))
UP_DOWN = ((0, "down", "red"), (1, "up", "green"))

QUOTA_AND_USE = Row(
    "Quota and use",
    (
        Panel(
            "Groups now",
            "table",
            (
                Query(per_group("group_gpus_allocated"), "GPUs in use"),
                Query(per_group("group_gpus_quota"), "Quota"),
                Query(per_group("group_gpus_limit"), "Limit"),
                Query(per_group("group_servers"), "Servers"),
                Query(per_group("group_waiting"), "Waiting"),
                Query(per_group("group_orphaned_server_pods"), "Orphaned pods"),
            ),
            "Each group's GPU-equivalents in use against its quota (guaranteed) and "
            "limit (at most), its servers, the spawns waiting for room and server pods "
            "charged to it that no hub server owns.",
            width=14,
        ),
        Panel(
            "In use against quota",
            "bargauge",
            (
                Query(
                    f"{per_group('group_gpus_allocated')}\n/\n"
                    f"({per_group('group_gpus_quota')} > 0)",
                    "{{group}}",
                ),
            ),
            "GPU-equivalents in use as a share of each group's quota: above 100% a "
            "group runs on what it may burst to, up to its limit.",
            unit="percentunit",
            width=10,
            thresholds=((None, "green"), (1.0, "orange")),
            minimum=0,
        ),
        Panel(
            "GPU-equivalents in use per group",
            "timeseries",
            (Query(per_group("group_gpus_allocated"), "{{group}}"),),
            "GPU-equivalents charged to each group's server pods over time.",
            minimum=0,
        ),
        Panel(
            "Free devices per flavor",
            "timeseries",
            (
                Query("max by (flavor) (jupyterhub_gpu_flavor_capacity_free)", "{{flavor}} free"),
                Query(
                    "max by (flavor) (jupyterhub_gpu_flavor_capacity_allocatable)",
                    "{{flavor}} on the nodes",
                ),
            ),
            "Devices (or slices) of each flavor the nodes offer, and those no pod requests.",
            minimum=0,
        ),
        Panel(
            "Devices per group and flavor",
            "table",
            (
                Query(per_group("group_flavor_allocated", "group, flavor"), "In use"),
                Query(per_group("group_flavor_quota", "group, flavor"), "Quota"),
                Query(per_group("group_flavor_limit", "group, flavor"), "Limit"),
            ),
            "Devices of each flavor in use by a group, against the flavor's quota and "
            "limit where the policy sets them.",
            width=24,
            height=7,
        ),
    ),
)

WAITING_AND_REFUSED = Row(
    "Waiting lines and refused spawns",
    (
        Panel(
            "Spawns waiting per group",
            "timeseries",
            (Query(per_group("group_waiting"), "{{group}}"),),
            "Spawns waiting for room in each group's line (when_full: wait). A line "
            "not empty for 15 minutes fires JupyterHubGPUGroupFull.",
            minimum=0,
        ),
        Panel(
            "Fair-share standing per group",
            "timeseries",
            (Query(per_group("group_fair_share_standing"), "{{group}}"),),
            "Recent GPU time against each group's share among its siblings: 1 is "
            "exactly its share; whoever stands lower goes first in a waiting line. "
            "Shown with GPUPolicy.fair_share.",
            minimum=0,
        ),
        Panel(
            "Refused spawns per hour, by group and reason",
            "timeseries",
            (
                Query(
                    "sum by (group, reason) "
                    f"(rate(jupyterhub_gpu_spawns_refused_total{{{GROUP}}}[$__rate_interval]))"
                    " * 3600",
                    "{{group}} {{reason}}",
                ),
            ),
            "Spawns the hub refused, by the group they were to be charged to (empty: "
            "before a group was chosen) and why. From the hub's /hub/metrics.",
            minimum=0,
        ),
        Panel(
            "Refused spawns in the time range",
            "table",
            (
                Query(
                    counted_in_range("jupyterhub_gpu_spawns_refused_total", "group, reason", GROUP),
                    "Refused",
                ),
            ),
            "Spawns refused in the dashboard's time range, by group and reason "
            "(group_full, user_cap, too_large, budget, usage_database, options, "
            "dataset_claim, kubernetes, queue_timeout, server_exited, configuration).",
        ),
    ),
)

BUDGETS = Row(
    "Budgets and GPU time",
    (
        Panel(
            "Budget used",
            "bargauge",
            (
                Query(
                    f"{per_group('group_gpu_hours_used')}\n/\n"
                    f"{per_group('group_gpu_hours_budget')}",
                    "{{group}}",
                ),
            ),
            "GPU-hours used in each group's budget window as a share of its budget. "
            "From 80% JupyterLab tells the group's members and JupyterHubGPUBudgetLow "
            "fires; at 100% new servers are refused (and with when_exhausted: stop, "
            "running ones stopped after their grace).",
            unit="percentunit",
            width=10,
            thresholds=BUDGET_STEPS,
            minimum=0,
            maximum=1,
        ),
        Panel(
            "GPU-hours in each group's budget window",
            "table",
            (
                Query(per_group("group_gpu_hours_used"), "Used"),
                Query(per_group("group_gpu_hours_budget"), "Budget"),
                Query(f"{per_group('group_gpu_hours_window_seconds')} / 86400", "Window (days)"),
            ),
            "GPU-equivalent-hours each group used in its budget's rolling window (30 "
            "days for a group without a budget), and its budget.",
            width=14,
        ),
        Panel(
            "GPU-hours used per group",
            "timeseries",
            (Query(per_group("group_gpu_hours_used"), "{{group}}"),),
            "GPU-equivalent-hours in each group's budget window, over time.",
            width=24,
            minimum=0,
        ),
        Panel(
            "This billing month per group",
            "table",
            (
                Query(per_group("group_month_gpu_hours"), "GPU-hours"),
                Query(per_group("group_month_billed_units"), "Billed units"),
                Query(per_group("group_month_cost", by="group, currency"), "Cost"),
                Query(per_group("group_month_energy_kwh"), "kWh"),
            ),
            "Each group's showback of this billing month (its children's included): "
            "GPU-hours, billed units (each hour at its flavor's weight then), cost in "
            "the site's currency (with prices), and the energy its GPUs drew where DCGM "
            "measured their power (whole GPUs only). The invoice per account is on the "
            "GPU service's dashboard.",
            width=24,
        ),
    ),
)

IDLE_GPUS = Row(
    "Idle GPUs and stops",
    (
        Panel(
            "GPU utilisation of server pods",
            "timeseries",
            (Query(GPU_UTILISATION, "{{namespace}}/{{pod}}"),),
            "From the NVIDIA DCGM exporter (scraped with honor_labels, so its "
            "namespace and pod labels are the server pod's): whole GPUs' utilisation, "
            "MIG slices' graphics engine activity. Pods named jupyter-* (KubeSpawner's "
            "default); not filtered by group.",
            unit="percent",
            minimum=0,
            maximum=100,
        ),
        Panel(
            f"Server pods under {IDLE_BELOW}% for 30 minutes",
            "table",
            (Query(IDLE_FOR_30_MINUTES, "Most in 30 minutes (%)"),),
            "Server pods whose GPUs stayed idle for the last 30 minutes; after 4 hours "
            "JupyterHubGPUIdleGPUs fires. An idle rule (idle: {after: 2h}) warns and "
            "stops such servers.",
        ),
        Panel(
            "Idle rule: servers judged by DCGM",
            "stat",
            (
                Query("max(jupyterhub_gpu_idle_servers_judged_by_dcgm)", "Judged by DCGM"),
                Query(
                    "max(jupyterhub_gpu_idle_servers_without_dcgm_series)",
                    "Without DCGM series",
                ),
            ),
            "In the idle rule's last run: servers past their idle time judged by GPU "
            "utilisation, and those Prometheus had no series for (neither warned nor "
            "stopped). Shown while the idle rule asks Prometheus (GPUService.prometheus_url).",
            width=8,
        ),
        Panel(
            "Servers stopped by the rules in the time range",
            "table",
            (
                Query(
                    counted_in_range("jupyterhub_gpu_servers_stopped_total", "reason"),
                    "Stopped",
                ),
            ),
            "Servers the GPU service stopped, by rule: max_runtime, idle, budget, over_limit.",
            width=8,
        ),
        Panel(
            "Stops waiting for the hub",
            "timeseries",
            (
                Query("max(jupyterhub_gpu_stops_waiting_for_hub)", "due, not stopped"),
                Query("max(jupyterhub_gpu_stops_hub_not_told)", "pods deleted, hub not told"),
            ),
            "Servers due to stop while the hub's API does not answer "
            "(GPUService.stop_without_hub): waiting to be stopped through the hub, or "
            "deleted with the hub still to be told.",
            width=8,
            minimum=0,
        ),
    ),
)

SERVICE = Row(
    "The GPU service",
    (
        Panel(
            "Acting replicas",
            "stat",
            (Query("sum(jupyterhub_gpu_service_acting)", "acting"),),
            "Replicas of the GPU service that act (write usage, apply the rules, "
            "reconcile): exactly one, or nothing is enforced.",
            width=4,
            thresholds=((None, "red"), (1, "green"), (2, "red")),
        ),
        Panel(
            "Replicas",
            "stat",
            (Query("count(jupyterhub_gpu_service_acting)", "replicas"),),
            "Replicas of the GPU service Prometheus scrapes.",
            width=4,
        ),
        Panel(
            "The Lease",
            "table",
            (Query("max by (lease, holder) (jupyterhub_gpu_lease_info)", "Held"),),
            "The Lease the replicas elect their leader on, and the replica holding it "
            "(GPUService.form: deployment).",
            width=8,
        ),
        Panel(
            "Lease renewals",
            "stat",
            (
                Query(
                    "time() - max(jupyterhub_gpu_lease_renew_timestamp_seconds)",
                    "since renewed",
                ),
                Query("max(jupyterhub_gpu_lease_transitions)", "changes of holder"),
            ),
            "Time since the Lease was last renewed (the leader stops acting past its "
            "renew deadline), and how often its holder changed.",
            width=8,
        ),
        Panel(
            "Task failures in a row",
            "timeseries",
            (Query("max by (task) (jupyterhub_gpu_task_consecutive_failures)", "{{task}}"),),
            "Failures in a row of each of the service's tasks (reconcile, GPU time, "
            "idle servers, ...). Failing for 15 minutes fires "
            "JupyterHubGPUReconcileFailing or JupyterHubGPUServiceTaskFailing; the "
            "error is under Service health on the GPU dashboard.",
            minimum=0,
        ),
        Panel(
            "Since each task's last success",
            "table",
            (
                Query(
                    "time() - max by (task) (jupyterhub_gpu_task_last_success_timestamp_seconds)",
                    "Since its last success",
                ),
            ),
            "How long ago each task last succeeded.",
            unit="s",
        ),
        Panel(
            "Usage database",
            "stat",
            (
                Query("min(jupyterhub_gpu_accounting_up)", "GPU service"),
                Query("min(jupyterhub_gpu_hub_accounting_up)", "hub"),
            ),
            "Whether the GPU service and the hub write and read the usage database "
            "(GPUPolicy.accounting_url). While the hub cannot, spawns of groups with a "
            "budget are refused.",
            width=8,
            mappings=UP_DOWN,
        ),
        Panel(
            "Usage not yet written",
            "timeseries",
            (
                Query(
                    "max(jupyterhub_gpu_accounting_oldest_unwritten_age_seconds)",
                    "GPU service: oldest kept",
                ),
                Query(
                    "max(jupyterhub_gpu_hub_accounting_oldest_unwritten_age_seconds)",
                    "hub: oldest kept",
                ),
            ),
            "How long the oldest usage kept in memory has waited to be written to the "
            "usage database (0: nothing waits).",
            unit="s",
            width=16,
            minimum=0,
        ),
    ),
)

#: the dashboard, top to bottom
ROWS: tuple[Row, ...] = (QUOTA_AND_USE, WAITING_AND_REFUSED, BUDGETS, IDLE_GPUS, SERVICE)
