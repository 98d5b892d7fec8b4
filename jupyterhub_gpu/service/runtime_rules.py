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
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, Protocol

from ..core import words
from ..core.model import Policy
from . import rules
from .state import ServerPod, ServiceState
from .views import Notice, server_label


class StopServer(Protocol):
    """Asks the hub to stop (user, server name) for a reason, if it is still the server
    whose ``pod`` the rule judged; the error in words, or None (stopped, or not sent)."""

    def __call__(
        self, user: str, name: str, reason: str, pod: ServerPod | None = None
    ) -> Awaitable[str | None]: ...


#: for a pod that does not say which start made it (made before the spawner wrote it
#: down): how much later than the pod's creation the hub may say its server started
#: and still be the start that made it. JupyterHub notes the start before the spawner
#: makes the pod, but creationTimestamp is in whole seconds (rounded down) and the
#: hub's clock and the API server's may differ a little (a server's stop not sent for
#: a skew beyond this would be worse than a restart within it missed: such pods are
#: only those made before an upgrade)
SAME_SERVER_SLACK = 5.0


def not_the_judged_server(
    hub_server: Mapping[str, Any] | None,
    pod: ServerPod,
    pods_now: Mapping[str, ServerPod] | None,
) -> str | None:
    """Why the server the hub has now is not the one whose ``pod`` a rule judged, or
    None when it is (pure). ``hub_server``: the hub's model of the user's server, asked
    for right before the stop (None: none running); ``pods_now``: the server pods the
    service sees now (None: its view may be behind).

    JupyterHub stops a server by user and name, not by pod: after a failed stop and a
    quick restart, or while the service's view of the pods is behind, that name may be
    a new server. The signal that holds is the hub's own ``started``: the hub notes it
    at every start of a server, the spawner writes it on the pod it makes
    (``SPAWN_ANNOTATION``), and the hub answering right before the stop is the one
    that will stop it. Equal, it is the start that made the judged pod, whatever the
    watch has seen; anything else is another start. For a pod without it, the start
    must not be later than the pod's creation (a restart is later), and the service's
    own view, while current, must not show another pod of the server.
    """
    if hub_server is None:
        return "the hub has no such server running now"
    started = _parse_time(hub_server.get("started"))
    made_by = _parse_time(pod.spawn_started)
    if started is not None and made_by is not None:
        if started == made_by:
            return None
        return (
            f"the hub's server started at {started:%H:%M:%S} UTC, the judged pod {pod.key} "
            f"was made by its start at {made_by:%H:%M:%S} UTC: it was started again since"
        )
    created = pod.created
    if (
        started is not None
        and created is not None
        and (started - created).total_seconds() > SAME_SERVER_SLACK
    ):
        return (
            f"the hub's server started at {started:%H:%M:%S} UTC, after the judged pod "
            f"{pod.key} was created ({created:%H:%M:%S} UTC): it was started again since"
        )
    if pods_now is not None and pod.uid:
        now = [p for p in pods_now.values() if (p.user, p.servername) == (pod.user, pod.servername)]
        if now and all(p.uid != pod.uid for p in now):
            return (
                f"its pod is now {now[0].key} (uid {now[0].uid}), not the judged one "
                f"(uid {pod.uid}): it was started again since"
            )
    return None


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def over_limit_text(reason: str) -> str:
    """The notice of a group found over its limit (``rules.over_limit``'s reason)."""
    return f"Over limit: {reason}"


def max_runtime_stop_text(server: str, group: str, limit: float) -> str:
    """The notice of a server stopped at its group's ``max_runtime``."""
    return (
        f"Stopping {server}'s server in {group}: it has run for {words.duration(limit)}, the "
        f"longest {group} allows; start a new server to go on"
    )


def over_limit_stop_text(server: str, group: str, gpus: Fraction, after: float) -> str:
    """The notice of a server stopped because its group stayed over its limit."""
    return (
        f"Stopping {server}'s server in {group}, which holds "
        f"{words.gpus(gpus)}: {group} stayed over its limit for "
        f"{words.duration(after)}; start it again once {group} has room"
    )


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
                    Notice(at=now, text=over_limit_text(reason), group=group, kind="over_limit")
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
            group = self.policy.find_group(server.group)
            state.notice(
                Notice(
                    at=now,
                    text=max_runtime_stop_text(
                        server.label, group.display_name if group else server.group or "", limit
                    ),
                    group=server.group,
                    user=server.user,
                    server=server.name,
                    kind="max_runtime_stop",
                )
            )
        # the pod each server was judged by (its runtime counts from the pod's start)
        pods = {
            (p.user, p.servername): p
            for p in (state.server_pods or {}).values()
            if p.charge is not None
        }
        results = await asyncio.gather(
            *(
                self.stop(s.user, s.name, "max_runtime", pods.get((s.user, s.name)))
                for s, _ in overdue
            )
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
                    state.notice(
                        Notice(
                            at=now,
                            text=over_limit_stop_text(
                                server_label(pod.user, pod.servername),
                                self.policy.group(group).display_name,
                                charge.request.gpus,
                                self.stop_over_limit_after or 0,
                            ),
                            group=group,
                            user=pod.user,
                            server=pod.servername,
                            uid=pod.uid,
                            kind="over_limit_stop",
                        )
                    )
                error = await self.stop(pod.user, pod.servername, "over_limit", pod)
                if error:
                    errors.append(error)
                else:
                    stopped += 1
        return stopped
