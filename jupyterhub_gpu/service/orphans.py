"""Server pods no hub server owns: found, shown, still charged, deleted after a grace.

A stop that failed while the API server was away, followed by a hub restart before
it came back, leaves a pod that no hub server owns: JupyterHub forgot the server,
the pod runs on and holds its GPUs. The service finds such pods of this hub (its
hub label, its group label) whose user has no server of that name in the hub's
last answer, says so on the dashboard, keeps them charged while they exist, and
deletes each once it has been an orphan for ``GPUService.orphan_grace`` seconds;
with ``reconcile_dry_run`` (or no grace) it only reports.

It deletes only on evidence: a policy was loaded (the service stops without one),
the hub's server list is fresh and complete (every user in it came with their
servers, which the service's role must be able to read), and the pod is the one
first found (its uid is a precondition of the delete). A foreign pod (``core.claims``:
labelled for a group whose servers run elsewhere, or naming a server whose pod is
another) is never taken for an orphan: it is charged to nobody and only reported, and
a copy of a running server's pod never makes that server's pod one.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..core import words
from .state import ServerPod, ServiceState
from .views import Notice

#: seconds a pod must predate the hub's answer by to be weighed (clocks differ a little)
CLOCK_MARGIN = 5.0
#: deletes a pod by namespace, name and uid; the error in words, or None when gone
DeletePod = Callable[[str, str, str], Awaitable[str | None]]


@dataclass(frozen=True)
class Orphan:
    """A server pod no hub server owns, and since when."""

    key: str
    user: str
    server: str
    group: str
    since: float  # epoch seconds: first found orphaned
    deletes_at: float | None  # None: only reported

    def to_json(self) -> dict:
        return {
            "pod": self.key,
            "user": self.user,
            "server": self.server,
            "group": self.group,
            "since": _iso(self.since),
            "deletes_at": _iso(self.deletes_at) if self.deletes_at is not None else None,
        }


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


class OrphanPods:
    def __init__(
        self,
        state: ServiceState,
        delete: DeletePod,
        grace: float | None,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.delete = delete
        #: None (or dry run): orphans are only reported
        self.grace = None if dry_run else grace
        self.clock = clock
        #: pod key -> (uid, when first found orphaned)
        self.first_seen: dict[str, tuple[str, float]] = {}
        self.orphans: list[Orphan] = []

    def _orphaned(self) -> list[ServerPod]:
        state = self.state
        if state.server_pods is None:
            raise RuntimeError("server pods not listed yet (see the watch server pods task)")
        if state.servers is None or not state.servers_complete:
            raise RuntimeError(
                "no complete server list from the hub yet (see the hub servers task): "
                "nothing is taken for an orphan without one"
            )
        owned = {(s.user, s.name) for s in state.servers}
        # a pod younger than the hub's answer may be a server the answer predates: the
        # hub has a server before its pod exists, so only older pods are weighed
        # (with a margin for the API server's clock against this one)
        asked = state.servers_asked_at - CLOCK_MARGIN
        return [
            pod
            for pod in state.server_pods.values()
            # live pods the policy started (a server from before it is the hub's own
            # business), whose user has no server of that name
            if pod.charge is not None
            and pod.before_policy is None
            # one being deleted is on its way already (a finalizer, a node that stopped
            # answering): it stays charged until it is gone, and deleting it again
            # would change nothing
            and not pod.terminating
            and pod.uid
            and pod.user
            and pod.created is not None
            and pod.created.timestamp() < asked
            and (pod.user, pod.servername) not in owned
        ]

    async def run(self) -> str:
        now = self.clock()
        found = self._orphaned()
        keys = {pod.key for pod in found}
        # a pod owned again (or gone) starts afresh if it is ever orphaned later
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in keys}
        orphans, due, errors = [], [], []
        for pod in found:
            charge, user = pod.charge, pod.user or ""
            if charge is None:  # only live, charged pods are found
                continue
            uid, since = self.first_seen.get(pod.key, (pod.uid, now))
            if uid != pod.uid:  # a new pod of the same name: its own grace
                uid, since = pod.uid, now
            if pod.key not in self.first_seen:
                self._announce(pod, now)
            self.first_seen[pod.key] = (uid or "", since)
            deletes_at = since + self.grace if self.grace is not None else None
            orphans.append(Orphan(pod.key, user, pod.servername, charge.group, since, deletes_at))
            if deletes_at is not None and now >= deletes_at:
                due.append(pod)
        self.orphans = orphans
        for pod in due:
            namespace, name = pod.key.split("/", 1)
            error = await self.delete(namespace, name, pod.uid or "")
            if error:
                errors.append(error)
                continue
            self._notice(
                pod, now, orphan_deleted_text(pod.key, pod.user, pod.servername, self.grace or 0)
            )
        if errors:
            raise RuntimeError(f"{len(errors)} orphaned pod(s) not deleted; first: {errors[0]}")
        return f"{len(orphans)} orphaned server pod(s), {len(due)} deleted"

    def _announce(self, pod: ServerPod, now: float) -> None:
        group = pod.charge.group if pod.charge else "?"
        deletes_at = None if self.grace is None else now + self.grace
        text = orphan_found_text(pod.key, pod.user or "", pod.servername, group, deletes_at)
        self._notice(pod, now, text)

    def _notice(self, pod: ServerPod, now: float, text: str) -> None:
        self.state.notice(
            Notice(
                at=datetime.fromtimestamp(now, UTC),
                text=text,
                group=pod.charge.group if pod.charge else None,
                user=pod.user,
            )
        )


# ---- what users are told ------------------------------------------------------------


def orphan_found_text(
    pod: str, user: str, server: str, group: str, deletes_at: float | None
) -> str:
    """A server pod the hub does not have: charged while it runs, deleted at
    ``deletes_at`` (None: only reported)."""
    if deletes_at is None:
        then = "it is only reported (no orphan_grace, or a dry run)"
    else:
        then = f"it is deleted at {words.moment(deletes_at)} unless the hub owns it again"
    return (
        f"Pod {pod} is labelled as {user}'s server {server or '(default)'}, which the hub "
        f"does not have: it stays charged to {group} while it runs, and {then}"
    )


def orphan_deleted_text(pod: str, user: str | None, server: str, grace: float) -> str:
    """A server pod the hub did not have for ``grace``, deleted."""
    return (
        f"Deleted pod {pod}: {user} has had no server {server or '(default)'} in the hub "
        f"for {words.duration(grace)}"
    )
