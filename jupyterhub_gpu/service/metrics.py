"""Prometheus metrics, computed from the service's state at scrape time.

A collector, not gauges set in a loop: a group removed from the policy
disappears from the next scrape, and a scrape never shows numbers older than
what the watches hold. Names (all prefixed ``jupyterhub_gpu_``):

- ``group_gpus_allocated`` / ``_quota`` / ``_limit`` {group}: GPU-equivalents
- ``group_flavor_allocated`` / ``_quota`` / ``_limit`` {group, flavor}: devices
- ``group_servers`` {group}, ``group_waiting`` {group}
- ``group_orphaned_server_pods`` {group}: server pods charged to the group that no
  hub server owns (listed on the dashboard; deleted after ``orphan_grace``)
- ``flavor_capacity_allocatable`` / ``_allocated`` / ``_free`` {flavor}: units
- ``group_gpu_hours_used`` {group}: GPU-equivalent-hours in the group's budget
  window (30 days without a budget); ``group_gpu_hours_budget`` {group}; for a
  budget in billed units, ``group_billed_units_used`` and ``_budget`` {group} instead;
  ``group_gpu_hours_window_seconds`` {group}
- ``group_month_gpu_hours``, ``_billed_units``, ``_energy_kwh`` {group} and
  ``group_month_cost`` {group, currency}: this billing month's showback per group
  (its children's included), as of the last usage pass; kWh only where measured
- with ``fair_share``: ``group_fair_share_standing``, ``_decayed_gpu_hours`` and
  ``_share`` {group}; ``user_fair_share_standing`` and ``_decayed_gpu_hours``
  {user, group} (members with GPU time in the last ten half-lives); with
  ``fair_share.count: billed_units``, ``group_fair_share_decayed_billed_units``
  {group} and ``user_fair_share_decayed_billed_units`` {user, group} instead (the
  unit in the name, as for every other gauge)
- ``idle_servers_judged_by_dcgm``: in the idle rule's last run, servers past their
  idle time whose GPU use is read from DCGM (whole GPUs, MIG slices);
  ``idle_servers_without_dcgm_series``: those of them Prometheus had no series
  for (neither warned nor stopped). Absent while Prometheus does not answer
  or none is configured.
- ``dataset_claim_missing`` {group, dataset, claim, namespace}: for each dataset of
  a group that starts servers whose PersistentVolumeClaim the service has read, 1
  when the claim is missing in the namespace the group's servers run in (every
  spawn of the group is refused), 0 when it exists. Absent for datasets without a
  claim (NFS, CSI) and for claims not read yet or whose last read failed (the
  ``dataset claims`` task's failures say so)
- ``servers_stopped_total`` {reason}: servers the rules stopped (each server's stop
  once, however often the rule asked the hub while it was stopping)
- ``accounting_up``, ``accounting_unwritten_servers``,
  ``accounting_oldest_unwritten_age_seconds``, ``accounting_last_write_timestamp_seconds``,
  ``accounting_dropped_events``: whether the usage database is written and read, and
  how far behind its accounting is
- ``task_consecutive_failures`` {task}, ``task_last_success_timestamp_seconds`` {task}
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.datasets import MISSING, OK
from ..core.model import Policy
from .views import Snapshot, shown_flavors

PREFIX = "jupyterhub_gpu"
#: where a showback group total (``time_views.FIGURES``) has its GPU-hours, billed
#: units, cost, GPU-hours whose power was measured, and kWh
MONTH_FIGURES = (0, 3, 4, 5, 6)


class ServiceCollector(Collector):
    def __init__(self, policy: Policy, snapshot: Callable[[], Snapshot]) -> None:
        """``snapshot`` returns what the watches and pollers hold at scrape time."""
        self.policy = policy
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot()
        gauges = {
            key: GaugeMetricFamily(f"{PREFIX}_{key}", help_text, labels=labels)
            for key, help_text, labels in (
                ("group_gpus_allocated", "GPU-equivalents charged to the group", ["group"]),
                ("group_gpus_quota", "GPU-equivalents guaranteed to the group", ["group"]),
                ("group_gpus_limit", "GPU-equivalents the group may burst to", ["group"]),
                ("group_flavor_allocated", "devices of a flavor in use", ["group", "flavor"]),
                ("group_flavor_quota", "devices of a flavor guaranteed", ["group", "flavor"]),
                ("group_flavor_limit", "devices of a flavor at most", ["group", "flavor"]),
                ("group_servers", "servers charged to the group", ["group"]),
                ("group_waiting", "spawns waiting for room in the group", ["group"]),
                ("group_gpu_hours_used", "GPU-hours used in the budget window", ["group"]),
                ("group_gpu_hours_budget", "GPU-hours the group may use per window", ["group"]),
                ("group_gpu_hours_window_seconds", "the budget window", ["group"]),
                (
                    "group_billed_units_used",
                    "billed units used in the window of a budget in units",
                    ["group"],
                ),
                (
                    "group_month_gpu_hours",
                    "GPU-hours of this billing month (its children's included)",
                    ["group"],
                ),
                (
                    "group_month_billed_units",
                    "billed units of this billing month (its children's included)",
                    ["group"],
                ),
                (
                    "group_month_cost",
                    "cost of this billing month, in GPUPolicy.currency (children included)",
                    ["group", "currency"],
                ),
                (
                    "group_month_energy_kwh",
                    "kWh its GPUs drew this billing month, where measured (children included)",
                    ["group"],
                ),
                (
                    "group_billed_units_budget",
                    "billed units a budget in units allows per window",
                    ["group"],
                ),
                (
                    "group_fair_share_standing",
                    "recent GPU time against the group's share among its siblings "
                    "(1: exactly its share; lower goes first)",
                    ["group"],
                ),
                (
                    "group_fair_share_decayed_gpu_hours",
                    "GPU-hours decayed with the fair-share half-life",
                    ["group"],
                ),
                (
                    "group_fair_share_share",
                    "the group's fraction of its siblings' shares",
                    ["group"],
                ),
                (
                    "user_fair_share_standing",
                    "a member's recent GPU time against their share of the group",
                    ["user", "group"],
                ),
                (
                    "user_fair_share_decayed_gpu_hours",
                    "a member's GPU-hours in the group, decayed with the half-life",
                    ["user", "group"],
                ),
                (
                    "group_fair_share_decayed_billed_units",
                    "billed units decayed with the fair-share half-life "
                    "(fair_share.count: billed_units)",
                    ["group"],
                ),
                (
                    "user_fair_share_decayed_billed_units",
                    "a member's billed units in the group, decayed with the half-life "
                    "(fair_share.count: billed_units)",
                    ["user", "group"],
                ),
                ("flavor_capacity_allocatable", "flavor units the nodes offer", ["flavor"]),
                ("flavor_capacity_allocated", "flavor units pods request", ["flavor"]),
                ("flavor_capacity_free", "flavor units free", ["flavor"]),
                (
                    "idle_servers_judged_by_dcgm",
                    "servers the idle rule judged by DCGM GPU utilisation in its last run",
                    [],
                ),
                (
                    "idle_servers_without_dcgm_series",
                    "servers judged by DCGM without a series in Prometheus (left alone)",
                    [],
                ),
                (
                    "group_orphaned_server_pods",
                    "server pods charged to the group that no hub server owns",
                    ["group"],
                ),
                (
                    "dataset_claim_missing",
                    "1 when the PersistentVolumeClaim a group's dataset needs is missing in "
                    "the namespace its servers run in (its spawns are refused), 0 when found",
                    ["group", "dataset", "claim", "namespace"],
                ),
                ("accounting_up", "1 while the usage database is written and read", []),
                (
                    "accounting_unwritten_servers",
                    "servers whose usage is kept to be written to the database",
                    [],
                ),
                (
                    "accounting_oldest_unwritten_age_seconds",
                    "how long the oldest usage kept to be written has waited",
                    [],
                ),
                (
                    "accounting_last_write_timestamp_seconds",
                    "when the usage database was last written",
                    [],
                ),
                (
                    "accounting_dropped_events",
                    "usage events dropped because too many were kept",
                    [],
                ),
                ("task_consecutive_failures", "failures in a row of a service task", ["task"]),
                (
                    "task_last_success_timestamp_seconds",
                    "when a service task last succeeded",
                    ["task"],
                ),
            )
        }
        lines = snapshot.lines()
        orphans = Tally(orphan["group"] for orphan in snapshot.orphans)
        for group in self.policy.all_groups:
            name, usage = group.name, snapshot.ledger.usage(group.name)
            for key, amounts in (("quota", group.quota), ("limit", group.limit)):
                if amounts.gpus is not None:
                    gauges[f"group_gpus_{key}"].add_metric([name], float(amounts.gpus))
                for flavor, units in amounts.flavors.items():
                    gauges[f"group_flavor_{key}"].add_metric([name, flavor], units)
            gauges["group_gpus_allocated"].add_metric([name], float(usage.gpus))
            for flavor in shown_flavors(group, usage):
                gauges["group_flavor_allocated"].add_metric(
                    [name, flavor], usage.flavors.get(flavor, 0)
                )
            gauges["group_servers"].add_metric([name], usage.servers)
            gauges["group_waiting"].add_metric([name], len(lines.get(name, ())))
            gauges["group_orphaned_server_pods"].add_metric([name], orphans.get(name, 0))
        for states in snapshot.datasets.values():
            for state in states:
                if state.status in (MISSING, OK) and state.dataset.claim is not None:
                    gauges["dataset_claim_missing"].add_metric(
                        [state.group, state.dataset.name, state.dataset.claim, state.namespace],
                        1.0 if state.missing else 0.0,
                    )
        hours = snapshot.gpu_time.groups if snapshot.gpu_time is not None else {}
        for name, view in hours.items():
            gauges["group_gpu_hours_window_seconds"].add_metric([name], view.period)
            if view.in_units:  # a budget in billed units: its own measure, its own names
                gauges["group_billed_units_used"].add_metric([name], view.used)
                if view.budget is not None:
                    gauges["group_billed_units_budget"].add_metric([name], view.budget)
                continue
            gauges["group_gpu_hours_used"].add_metric([name], view.used)
            if view.budget is not None:
                gauges["group_gpu_hours_budget"].add_metric([name], view.budget)
        month = snapshot.gpu_time.month_totals if snapshot.gpu_time is not None else {}
        currency = self.policy.currency
        for name, figures in month.items():
            hours, units, cost, metered, kwh = (figures[i] for i in MONTH_FIGURES)
            gauges["group_month_gpu_hours"].add_metric([name], hours)
            gauges["group_month_billed_units"].add_metric([name], units)
            if currency is not None:
                gauges["group_month_cost"].add_metric([name, currency], cost)
            if metered:  # only where some of its GPU-hours had their power measured
                gauges["group_month_energy_kwh"].add_metric([name], kwh)
        fair = snapshot.gpu_time.fair_share if snapshot.gpu_time is not None else None
        # the decayed usage under the name of what fair share counts
        decayed = f"fair_share_decayed_{fair.count if fair else 'gpu_hours'}"
        for name, owner in fair.groups.items() if fair else ():
            gauges["group_fair_share_standing"].add_metric([name], owner.standing)
            gauges[f"group_{decayed}"].add_metric([name], owner.usage)
            gauges["group_fair_share_share"].add_metric([name], owner.share)
        for (user, name), owner in fair.users.items() if fair else ():
            gauges["user_fair_share_standing"].add_metric([user, name], owner.standing)
            gauges[f"user_{decayed}"].add_metric([user, name], owner.usage)
        for flavor, capacity in (snapshot.capacity or {}).items():
            for key in ("allocatable", "allocated", "free"):
                value = getattr(capacity, key)
                if value is not None:
                    gauges[f"flavor_capacity_{key}"].add_metric([flavor], value)
        if snapshot.gpu_time is not None:
            lag = snapshot.gpu_time.lag.to_json(time.time())
            gauges["accounting_up"].add_metric([], 1.0 if snapshot.gpu_time.lag.ok else 0.0)
            gauges["accounting_unwritten_servers"].add_metric([], lag["unwritten"])
            gauges["accounting_oldest_unwritten_age_seconds"].add_metric(
                [], lag["oldest_unwritten_age_seconds"] or 0.0
            )
            if lag["last_write"] is not None:
                gauges["accounting_last_write_timestamp_seconds"].add_metric([], lag["last_write"])
            gauges["accounting_dropped_events"].add_metric([], lag["dropped"])
        if snapshot.idle is not None:
            gauges["idle_servers_judged_by_dcgm"].add_metric([], snapshot.idle.judged)
            gauges["idle_servers_without_dcgm_series"].add_metric(
                [], len(snapshot.idle.without_series)
            )
        for task in snapshot.tasks:
            gauges["task_consecutive_failures"].add_metric(
                [task["name"]], task["consecutive_failures"]
            )
            if task.get("last_success_epoch") is not None:
                gauges["task_last_success_timestamp_seconds"].add_metric(
                    [task["name"]], task["last_success_epoch"]
                )
        yield from gauges.values()


def registry(policy: Policy, snapshot: Callable[[], Snapshot]) -> tuple[CollectorRegistry, Counter]:
    """A private registry (nothing process-global) and the stop counter."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ServiceCollector(policy, snapshot))
    stopped = Counter(
        f"{PREFIX}_servers_stopped",
        "servers the runtime rules stopped",
        ["reason"],
        registry=reg,
    )
    return reg, stopped
