"""The runtime rules at work: the service's notices and stops, and what it remembers.

``rules`` says which servers are past ``max_runtime`` and which groups are over
their limit (pure); ``RuntimeRules`` acts on it once per run: it asks the hub to
stop servers, says so once per server (not at every run until the hub is done),
and stops the youngest servers of a group that stays over its limit when
``GPUService.stop_over_limit_after`` asks for it. What it remembers (what was
announced, since when a group is over) is pruned to what still exists, and is
only ever a delay after a restart, never a hastened stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

from ..core.model import Policy
from ..core.quantities import format_duration, format_gpus
from . import rules
from .state import ServiceState
from .views import Notice

#: asks the hub to stop (user, server name) for a reason; the error in words, or None
StopServer = Callable[[str, str, str], Awaitable[str | None]]


class RuntimeRules:
    def __init__(
        self,
        policy: Policy,
        state: ServiceState,
        stop: StopServer,
        stop_over_limit_after: float | None = None,
    ) -> None:
        self.policy = policy
        self.state = state
        self.stop = stop
        self.stop_over_limit_after = stop_over_limit_after
        #: servers whose max_runtime stop was announced: (user, name, started)
        self.announced: set[tuple[str, str, datetime | None]] = set()
        #: server pods whose over-limit stop was announced
        self.announced_pods: set[str] = set()
        #: group -> when it was first seen over its limit
        self.over_limit_since: dict[str, datetime] = {}

    async def run(self, now: datetime) -> str:
        """One run; raises when a stop failed, so the task shows it and retries."""
        state = self.state
        if state.servers is None:
            raise RuntimeError("no server list from the hub yet (see the hub-servers task)")
        if state.server_pods is None:
            raise RuntimeError("server pods not listed yet (see the watch server pods task)")
        errors: list[str] = []
        stopped = await self._stop_overdue(now, errors)
        over = rules.over_limit(self.policy, state.ledger)
        for group, reason in over.items():
            if group not in self.over_limit_since:
                self.over_limit_since[group] = now
                state.notice(
                    Notice(at=now, text=f"Over limit: {reason}", group=group, kind="over_limit")
                )
        for group in list(self.over_limit_since):
            if group not in over:
                del self.over_limit_since[group]
        state.set_over_limit(over)
        # announcements of pods that are gone are done with
        self.announced_pods &= set(state.server_pods or {})
        if self.stop_over_limit_after is not None:
            stopped += await self._stop_over_limit(now, errors)
        if errors:
            raise RuntimeError(f"{len(errors)} stop(s) failed; first: {errors[0]}")
        return f"{stopped} stopped, {len(over)} group(s) over limit"

    async def _stop_overdue(self, now: datetime, errors: list[str]) -> int:
        state = self.state
        overdue = rules.overdue(self.policy, state.servers or (), now)
        # say it once per server, when asking the hub to stop it: the hub may
        # finish the stop after this call returns, or after a retry
        self.announced &= {(s.user, s.name, s.started) for s, _ in overdue}
        for server, limit in overdue:
            if (server.user, server.name, server.started) in self.announced:
                continue
            self.announced.add((server.user, server.name, server.started))
            runtime = int((now - server.started).total_seconds()) if server.started else 0
            state.notice(
                Notice(
                    at=now,
                    text=f"Stopping {server.label}'s server in {server.group}: it ran "
                    f"{format_duration(runtime)}, past the group's max_runtime of "
                    f"{format_duration(limit)}",
                    group=server.group,
                    user=server.user,
                    server=server.name,
                    kind="max_runtime_stop",
                )
            )
        results = await asyncio.gather(
            *(self.stop(s.user, s.name, "max_runtime") for s, _ in overdue)
        )
        errors += [r for r in results if r]
        return sum(1 for r in results if r is None)

    async def _stop_over_limit(self, now: datetime, errors: list[str]) -> int:
        state = self.state
        stopped = 0
        pods = state.server_pods or {}
        created = {k: p.created for k, p in pods.items() if p.created}
        for group, since in self.over_limit_since.items():
            if (now - since).total_seconds() < (self.stop_over_limit_after or 0):
                continue
            for charge in rules.to_stop_for_limit(self.policy, state.ledger, group, created):
                pod = pods.get(charge.key)
                if pod is None or pod.user is None or pod.before_policy is not None:
                    continue  # gone, or started before the policy: never stopped for it
                if charge.key not in self.announced_pods:
                    self.announced_pods.add(charge.key)
                    grace = format_duration(int(self.stop_over_limit_after or 0))
                    state.notice(
                        Notice(
                            at=now,
                            text=f"Stopping {pod.user}'s server in {group} "
                            f"({format_gpus(charge.request.gpus)} GPUs): the group stayed over "
                            f"its limit for {grace}",
                            group=group,
                            user=pod.user,
                            server=pod.servername,
                            uid=pod.uid,
                            kind="over_limit_stop",
                        )
                    )
                error = await self.stop(pod.user, pod.servername, "over_limit")
                if error:
                    errors.append(error)
                else:
                    stopped += 1
        return stopped
