"""Used-up budgets and the servers still running on them.

When a budget a running GPU server counts against is used up (its group's, a
parent's, or its user's own in the group), the server's user is told once, on
the dashboard and in the log. With ``when_exhausted: warn`` that is all: the
server runs on, and new GPU servers are refused at the hub. With
``when_exhausted: stop`` the notice says when the server stops, and it is
stopped ``grace`` later if the budget is still used up then. Read from the
GPU-time snapshot (computed once per pass), not per server.

Only numbers just read count: while the usage database cannot be written or
read, nobody is told and nothing is stopped on the last numbers read (the task
fails, saying so, at its interval); a stop that fell due meanwhile happens at
the first run after the database is back, if the budget is still used up then.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from ..core.budgets import used_line
from ..core.model import Budget, Policy
from ..core.quantities import format_duration
from .gpu_time import GPUTime, HoursView
from .runtime_rules import StopServer
from .state import ServerPod, ServiceState
from .tasks import RetryAtInterval
from .views import Notice, server_label


class BudgetsNotApplied(RetryAtInterval):
    """The GPU-hours could not be refreshed: no one is told or stopped on stale ones."""


class BudgetRule:
    def __init__(self, policy: Policy, state: ServiceState, gpu_time: GPUTime, stop: StopServer):
        self.policy = policy
        self.state = state
        self.gpu_time = gpu_time
        self.stop = stop
        #: pod key -> when its user was told its budget is used up (epoch seconds)
        self.told: dict[str, float] = {}
        #: pod key -> the uid of the pod ``told`` is about: a new pod of the same name (the
        #: server started again) is told anew and gets its own grace
        self._told_uid: dict[str, str | None] = {}
        #: pod keys whose stop was announced
        self.stopping: set[str] = set()

    def exhausted(self, pod: ServerPod) -> list[tuple[str, Budget, HoursView]]:
        """(owner, budget, hours) of each used-up budget this server counts against."""
        snapshot = self.gpu_time.snapshot
        charge = pod.charge
        group = self.policy.find_group(charge.group) if charge else None
        if charge is None or group is None or not charge.request.gpus:
            return []
        if pod.before_policy is not None:
            return []  # started before the policy: its GPU time counts, it is never stopped
        found = []
        for level in self.policy.ancestors(group.name):
            hours = snapshot.groups.get(level.name)
            if level.budget and hours is not None and hours.exhausted:
                found.append((level.display_name, level.budget, hours))
        hours = snapshot.users.get((charge.user, group.name))
        if group.user_budget and hours is not None and hours.exhausted:
            found.append((f"{charge.user} in {group.display_name}", group.user_budget, hours))
        return found

    async def run(self) -> str:
        pods = self.state.server_pods
        if pods is None:
            raise RuntimeError("server pods not listed yet (see the watch server pods task)")
        now = self.gpu_time.clock()
        snapshot = self.gpu_time.snapshot
        if snapshot.error is not None:
            read = (
                "never read"
                if snapshot.read_at is None
                else "last read at "
                + datetime.fromtimestamp(snapshot.read_at, UTC).strftime("%H:%M:%S UTC")
            )
            raise BudgetsNotApplied(
                f"no server told or stopped: the GPU-hours could not be refreshed ({read}; "
                f"{snapshot.error})"
            )
        if snapshot.read_at is None:
            return "GPU-hours not read yet"
        due: list[ServerPod] = []
        for key, pod in pods.items():
            if key in self.told and self._told_uid.get(key) != pod.uid:
                del self.told[key]
                self.stopping.discard(key)
            exhausted = self.exhausted(pod)
            if not exhausted or pod.user is None:
                self.told.pop(key, None)  # room again, or gone: a later exhaustion tells anew
                continue
            stopping = [b for _, b, _ in exhausted if b.when_exhausted == "stop"]
            grace = min((b.grace for b in stopping), default=None)
            owner, budget, hours = exhausted[0]
            used = used_line(owner, hours.used, budget)
            whose = f"{server_label(pod.user, pod.servername)}'s server"
            if key not in self.told:
                self.told[key] = now
                self._told_uid[key] = pod.uid
                if grace is None:
                    then = f"new GPU servers are refused until room returns; {whose} keeps running"
                else:
                    at = datetime.fromtimestamp(now + grace, UTC).strftime("%H:%M:%S UTC")
                    then = f"{whose} stops at {at} (in {format_duration(grace)})"
                self.state.notice(
                    Notice(
                        at=datetime.fromtimestamp(now, UTC),
                        text=f"GPU budget used up: {used}; {then}",
                        group=pod.charge.group if pod.charge else None,
                        user=pod.user,
                        server=pod.servername,
                        uid=pod.uid,
                        kind="budget",
                        stop_at=None if grace is None else datetime.fromtimestamp(now + grace, UTC),
                    )
                )
            elif grace is not None and now - self.told[key] >= grace:
                due.append(pod)
                if key not in self.stopping:
                    self.stopping.add(key)
                    self.state.notice(
                        Notice(
                            at=datetime.fromtimestamp(now, UTC),
                            text=f"Stopping {whose}: {used}, and the "
                            f"{format_duration(grace)} grace after the notice is over",
                            group=pod.charge.group if pod.charge else None,
                            user=pod.user,
                            server=pod.servername,
                            uid=pod.uid,
                            kind="budget_stop",
                        )
                    )
        results = await asyncio.gather(
            *(self.stop(p.user or "", p.servername, "budget", p) for p in due)
        )
        errors = [r for r in results if r]
        self.told = {k: v for k, v in self.told.items() if k in pods}
        self._told_uid = {k: v for k, v in self._told_uid.items() if k in self.told}
        self.stopping &= set(pods)
        if errors:
            raise RuntimeError(f"{len(errors)} stop(s) failed; first: {errors[0]}")
        return f"{len(self.told)} server(s) over a budget, {len(due)} stopped"
