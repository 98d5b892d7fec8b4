"""What the service's pages and APIs ask of it: the snapshot of everything it knows,
each viewer's view of it, and the dashboard's GPU-use charts and showback."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from ..accounting.store import AccountingUnavailable
from ..core.model import Group, Policy
from .acting import Acting, StopsWithoutHub
from .datasets import DatasetClaims
from .fair_share import fair_lines
from .gpu_time import GPUTime
from .idle import IdleServers
from .orphans import OrphanPods
from .page import RANGES
from .readers import HistoryReads, TooManyReads
from .state import ServiceState
from .tasks import BackgroundTask
from .views import CachedUsage, Snapshot, Viewer, is_policy_admin, visible_groups

#: the most GPU-use charts the dashboard draws (the groups with the most use)
MAX_CHARTS = 12


class ServiceViews:
    """Mixed into ``GPUService``: its views, read from what its tasks keep."""

    # what GPUService sets up (in initialize) and the views read
    policy: Policy
    state: ServiceState
    tasks: dict[str, BackgroundTask]
    gpu_time: GPUTime
    history_reads: HistoryReads
    usage: CachedUsage
    idle_servers: IdleServers
    orphan_pods: OrphanPods
    dataset_claims: DatasetClaims
    acting: Acting
    stops_without_hub: StopsWithoutHub

    def task_statuses(self) -> list[dict[str, Any]]:
        return [t.status.to_json() for t in self.tasks.values()]

    def snapshot(self) -> Snapshot:
        snapshot = self.state.snapshot(self.task_statuses())
        snapshot.gpu_time = self.gpu_time.snapshot
        snapshot.idle = self.idle_servers.coverage
        snapshot.orphans = [orphan.to_json() for orphan in self.orphan_pods.orphans]
        snapshot.datasets = self.dataset_claims.report
        snapshot.lease = self.acting.to_json()
        snapshot.stops_waiting_for_hub = len(self.stops_without_hub.waiting)
        # with fair share, each group's line in the order the hub lets it go
        snapshot.waiting = fair_lines(
            self.policy,
            getattr(snapshot.gpu_time, "fair_share", None),
            snapshot.lines(),
            time.time(),
        )
        return snapshot

    def view(self, viewer: Viewer, **paging: int) -> dict[str, Any]:
        return self.usage.view(self.snapshot(), viewer, datetime.now(UTC), **paging)

    def view_json(self, viewer: Viewer, **paging: int) -> str:
        return self.usage.json(self.snapshot(), viewer, datetime.now(UTC), **paging)

    async def page_view(self, viewer: Viewer, range_name: str) -> dict[str, Any]:
        """The dashboard's view: ``view`` plus the GPU-use charts of the chosen range
        (the groups with the most use first) and this month's showback."""
        view = self.view(viewer)
        span = RANGES.get(range_name, RANGES["day"])
        view["range"] = range_name if range_name in RANGES else "day"
        now = self.gpu_time.clock()
        hours = self.gpu_time.snapshot.groups
        shown = [
            g
            for g in visible_groups(self.policy, viewer)
            if (hours.get(g.name) and hours[g.name].used > 0) or g.limit.gpus
        ]
        shown.sort(key=lambda g: -(hours[g.name].used if g.name in hours else 0))
        view["charts"] = []
        try:
            await self._add_gpu_time(view, viewer, shown, span, now)
        except AccountingUnavailable as e:
            # the page still shows everything else, and says why this part is missing
            self.log.warning("dashboard without GPU-time charts: %s", e)
            view["charts"], view["showback"] = [], None
        return view

    async def _add_gpu_time(
        self, view: dict[str, Any], viewer: Viewer, shown: list[Group], span: float, now: float
    ) -> None:
        for group in shown[:MAX_CHARTS]:
            try:
                series = await self.history_reads.history(
                    viewer.name, group.name, now - span, now, span / 144
                )
            except TooManyReads:
                # the page waits for no slot: the other charts come at its next refresh
                view["charts_busy"] = True
                break
            budget = group.budget
            view["charts"].append(
                {
                    "group": group.name,
                    "title": group.display_name,
                    "times": series.times,
                    "step": series.step,
                    "flavors": {
                        self.policy.flavors[f].display_name if f in self.policy.flavors else f: v
                        for f, v in sorted(series.values.items())
                    },
                    "quota": float(group.quota.gpus) if group.quota.gpus is not None else None,
                    "limit": float(group.limit.gpus) if group.limit.gpus is not None else None,
                    # the GPUs it allows if used evenly across its window (a budget in
                    # billed units allows different GPUs by flavor: no line)
                    "budget": budget.amount * 3600 / budget.period
                    if budget and not budget.in_units
                    else None,
                }
            )
        view["charts_hidden"] = max(len(shown) - MAX_CHARTS, 0)
        month = self.gpu_time.month_of(now)
        admin, groups = self.showback_scope(viewer)
        view["showback"] = await self.gpu_time.showback_view(month, viewer, admin, groups)

    def visible_group(self, viewer: Viewer, name: str) -> Group | None:
        """The group named ``name`` if this viewer may see it."""
        for group in visible_groups(self.policy, viewer):
            if group.name == name:
                return group
        return None

    def showback_scope(self, viewer: Viewer) -> tuple[bool, set[str] | None]:
        """(admin, the groups whose GPU-hours this viewer may see; None: every group)."""
        if is_policy_admin(self.policy, viewer):
            return True, None
        return False, {g.name for g in visible_groups(self.policy, viewer)}
