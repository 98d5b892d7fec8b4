"""Which replica acts, and the stops that fall due while the hub does not answer.

In its own Deployment (``GPUService.form: deployment``) the service runs as
replicas that elect a leader on a Lease (``kube.leader``). Only the acting replica
writes usage, applies the rules, reconciles and deletes orphaned pods: those tasks
run on it alone, are cancelled the moment it stops acting, and every write to the
usage database checks, inside its transaction, that it still acts. Every replica
watches the pods, polls the hub and answers the dashboard and the API; one that
does not act reads the usage and the servers' stops the acting one writes.
In the hub's pod (``form: hub-pod``) there is one process, which always acts.

While the hub's API does not answer (an upgrade, a restart), sightings and usage
go on; a stop that falls due is either waited with (``stop_without_hub: wait``:
said in the log, the rule's task and a metric, and made through the hub's API at
the rule's first run once the hub answers) or made by deleting the pod the rule
judged (``delete-pod``), the hub being asked to stop the server once it answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..kube.leader import LeaseElector
from .hubapi import HubAPI, HubAPIError
from .state import ServerPod
from .tasks import BackgroundTask

log = logging.getLogger("jupyterhub_gpu.service")

#: the tasks only the acting replica runs
ACTING_TASKS = frozenset({"runtime rules", "orphaned pods", "idle servers", "reconcile"})
#: the tasks every replica runs, writing and enforcing while it acts and otherwise reading
#: what the acting one wrote (for its dashboard and API); begun again when it stops acting
SWITCHING_TASKS = frozenset({"GPU time", "GPU budgets", "server events"})


class Acting:
    """Whether this replica acts, and starting or stopping what only the acting one does."""

    def __init__(self, elector: LeaseElector | None, tasks: dict[str, BackgroundTask]) -> None:
        self.elector = elector
        self.tasks = tasks
        #: called when this replica starts acting, and when it stops (with why)
        self.on_started: list[Callable[[], None]] = []
        self.on_stopped: list[Callable[[str], None]] = []

    def __call__(self) -> bool:
        return self.elector is None or self.elector.acting()

    def why_not(self) -> str | None:
        """Why this replica may not write now (None: it may): the usage database's fence."""
        return None if self.elector is None else self.elector.why_not_acting()

    def acting_tasks(self) -> list[BackgroundTask]:
        return [t for name, t in self.tasks.items() if name in ACTING_TASKS]

    def standing_by(self) -> None:
        """What the acting tasks say on a replica that has not acted yet."""
        for task in self.acting_tasks():
            task.status.last_result = "runs on the acting replica only"

    def started(self) -> None:
        for callback in self.on_started:
            callback()
        for task in self.acting_tasks():
            if not task.running:
                task.start()
        for name in SWITCHING_TASKS & set(self.tasks):
            self.tasks[name].wake()

    def stopped(self, why: str) -> None:
        for task in self.acting_tasks():
            task.cancel()
            task.status.last_result = f"not acting: {why}"
        # a pass begun while acting ends here; the next one reads
        for name in SWITCHING_TASKS & set(self.tasks):
            task = self.tasks[name]
            if task.running:
                task.cancel()
                task.start()
        for callback in self.on_stopped:
            callback(why)

    def following(self) -> str:
        """What a replica that does not act says of its read-only pass."""
        holder = self.elector.state.holder if self.elector else None
        return f"read only: {holder or 'no replica'} acts"

    def to_json(self) -> dict[str, Any] | None:
        return None if self.elector is None else self.elector.to_json()


class StopsWithoutHub:
    """Stops that fall due while the hub's API does not answer."""

    def __init__(
        self,
        mode: str,
        delete_pod: Callable[[str, str, str], Awaitable[str | None]],
        ended: Callable[[str, float], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode = mode
        self.delete_pod = delete_pod
        #: a server's usage ends when its pod was asked to go (uid, when)
        self.ended = ended
        self.clock = clock
        #: (user, server) -> (reason, since): stops said, waiting for the hub
        self.waiting: dict[tuple[str, str], tuple[str, float]] = {}
        #: (user, server) -> reason: pods deleted directly, the hub not told yet
        self.to_tell: dict[tuple[str, str], str] = {}

    async def stop(
        self, user: str, name: str, reason: str, pod: ServerPod | None, error: HubAPIError
    ) -> tuple[bool, str | None]:
        """The stop of ``user/name`` the hub could not be asked for: (whether its pod was
        deleted, the error in words or None)."""
        label = f"{user}/{name}" if name else user
        if self.mode == "delete-pod" and pod is not None and pod.uid:
            namespace, pod_name = pod.key.split("/", 1)
            asked = self.clock()
            failed = await self.delete_pod(namespace, pod_name, pod.uid)
            if failed:
                return False, failed
            # as for a stop the hub asks for: its GPU time ends when the pod was asked to go
            self.ended(pod.uid, asked)
            self.waiting.pop((user, name), None)
            self.to_tell[(user, name)] = reason
            log.warning(
                "The hub does not answer: %s's server (%s) stopped by deleting its pod %s; "
                "the hub is asked to stop the server once it answers",
                label,
                reason,
                pod.key,
            )
            return True, None
        key = (user, name)
        if key not in self.waiting:
            log.warning(
                "The hub does not answer: %s's server is due to stop (%s) and is not stopped "
                "until the hub answers: %s",
                label,
                reason,
                error,
            )
        self.waiting.setdefault(key, (reason, self.clock()))
        return False, (
            f"{label}'s server ({reason}) not stopped: the hub does not answer ({error}); "
            "it is stopped through the hub's API once the hub answers"
        )

    def done(self, user: str, name: str) -> None:
        """The hub stopped the server (or has none): nothing waits for it any more."""
        self.waiting.pop((user, name), None)

    async def tell_hub(self, hub: HubAPI) -> str | None:
        """Ask the hub to stop the servers whose pods were deleted while it did not
        answer (its record then matches the cluster); what was told, in words."""
        told = []
        for (user, name), reason in list(self.to_tell.items()):
            try:
                await hub.stop_server(user, name)
            except HubAPIError as e:
                if e.status not in (400, 404):  # 400/404: the hub found it stopped itself
                    raise
            del self.to_tell[(user, name)]
            told.append(f"{user}/{name} ({reason})" if name else f"{user} ({reason})")
        if not told:
            return None
        log.info("Told the hub of the servers stopped while it did not answer: %s", told)
        return f"told the hub of {len(told)} server(s) stopped while it did not answer"


class ReplicaCollector(Collector):
    """The Lease, its timings and who leads, and the stops waiting for the hub."""

    def __init__(self, acting: Acting, stops: StopsWithoutHub) -> None:
        self.acting = acting
        self.stops = stops

    def collect(self) -> Iterator[Metric]:
        prefix = "jupyterhub_gpu"
        waiting = GaugeMetricFamily(
            f"{prefix}_stops_waiting_for_hub",
            "servers due to stop that are not stopped while the hub does not answer",
        )
        waiting.add_metric([], len(self.stops.waiting))
        untold = GaugeMetricFamily(
            f"{prefix}_stops_hub_not_told",
            "server pods deleted while the hub did not answer, the hub not told yet",
        )
        untold.add_metric([], len(self.stops.to_tell))
        acting = GaugeMetricFamily(
            f"{prefix}_service_acting",
            "1 while this replica acts (writes usage, applies rules, reconciles)",
            labels=["identity"],
        )
        lease = self.acting.to_json()
        acting.add_metric([lease["identity"] if lease else ""], 1.0 if self.acting() else 0.0)
        yield from (waiting, untold, acting)
        if lease is None:
            return
        info = GaugeMetricFamily(
            f"{prefix}_lease_info", "the service's Lease and its holder", labels=["lease", "holder"]
        )
        info.add_metric([lease["lease"], lease["holder"] or ""], 1.0)
        yield info
        for key, help_text in (
            ("duration_seconds", "how long a Lease not renewed holds"),
            ("renew_deadline_seconds", "how long the leader acts without renewing"),
            ("retry_period_seconds", "time between attempts to renew or take the Lease"),
            ("transitions", "times the Lease changed holder"),
        ):
            gauge = GaugeMetricFamily(f"{prefix}_lease_{key}", help_text)
            gauge.add_metric([], float(lease[key]))
            yield gauge
        if lease["renewed"] is not None:
            gauge = GaugeMetricFamily(
                f"{prefix}_lease_renew_timestamp_seconds", "when the Lease was last renewed"
            )
            gauge.add_metric([], lease["renewed"])
            yield gauge
