"""Each server's notices and last stop: in memory for its JupyterLab, kept in the database.

Every notice the service gives a user (``ServiceState.notice``) and every end of
a server pod it sees are kept here per (user, server name), and written to the
usage database (``accounting.events``) by the ``server events`` task, so they
outlive a restart of the service or the hub: at its first run the task reads the
last stops and the last day's notices back.

A server pod that ends is a stop with its reason: the service's own (the rule
that asked the hub to stop it), the scheduler's preemption (the pod's
``DisruptionTarget`` condition), Kueue's eviction (its ``TerminationTarget``),
the node going away or being drained, a profile the policy no longer has, or
else a stop through the hub (by the user or an admin).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from ..accounting.events import EventStore, NoticeRow, StopRow
from ..core.model import Policy
from .server_status import WHAT_TO_DO, LastStop, stop_text
from .state import ServerPod
from .views import Notice

log = logging.getLogger("jupyterhub_gpu.service")

#: how many notices of each server are kept in memory
PER_SERVER = 20
#: how far back notices are read at a start (seconds)
NOTICES_READ_BACK = 86400
#: at most this many rows wait for the database (the oldest are dropped beyond)
MAX_PENDING = 10_000
#: how long a stop the service asked the hub for explains the end of that server's pod
INTENT_FOR = 600.0
#: a replica that does not act reads back what was written since its last read, and
#: this much before it (a stop is written a run after it happened, dated when it did)
FOLLOW_OVERLAP = 600.0

#: the pod's condition that says who ended it -> (reason, words for the user)
DISRUPTIONS = {
    ("DisruptionTarget", "PreemptionByScheduler"): (
        "preempted",
        "the cluster's scheduler preempted it to make room for a server or job of higher priority",
    ),
    ("DisruptionTarget", "PreemptionByKubeScheduler"): (
        "preempted",
        "the cluster's scheduler preempted it to make room for a server or job of higher priority",
    ),
    ("DisruptionTarget", "EvictionByEvictionAPI"): (
        "evicted",
        "its node was drained (for maintenance) and it was evicted",
    ),
    ("DisruptionTarget", "DeletionByTaintManager"): (
        "node",
        "its node was taken out of service",
    ),
    ("DisruptionTarget", "TerminationByKubelet"): (
        "node",
        "its node ran short of resources or shut down",
    ),
    ("DisruptionTarget", "DeletionByPodGC"): ("node", "its node went away"),
    ("TerminationTarget", None): (
        "evicted",
        "the cluster's queue (Kueue) evicted it, to give its GPUs back to other work",
    ),
}

WHAT_TO_DO_ALSO = {
    "preempted": "Start it again from the hub; it may wait until GPUs are free.",
    "evicted": "Start it again from the hub; it may wait until GPUs are free.",
    "node": "Start it again from the hub.",
    "policy": "Its profile is no longer offered: choose another when you start a server.",
    "hub": "Start it again from the hub.",
}

UNSCHEDULED_TEXT = {
    "policy": "This server stopped: its profile is no longer in the GPU policy",
    "hub": "This server was stopped through the hub (by you, an admin or a service)",
}


def why_it_ended(pod: ServerPod, policy: Policy) -> tuple[str, str]:
    """(reason, words) for a server pod that ended without a stop by the service."""
    if pod.disruption is not None:
        kind, reason, message = pod.disruption
        found = DISRUPTIONS.get((kind, reason)) or DISRUPTIONS.get((kind, None))
        if found is not None:
            return found[0], f"This server stopped: {found[1]}" + (
                f" ({message})" if message else ""
            )
        return "node", f"This server stopped: {kind} ({reason}: {message})"
    profile = pod.profile
    group = pod.charge.group if pod.charge is not None else None
    if (group is not None and policy.find_group(group) is None) or (
        profile and profile not in policy.profiles
    ):
        return "policy", UNSCHEDULED_TEXT["policy"]
    return "hub", UNSCHEDULED_TEXT["hub"]


class ServerEvents:
    """Notices and stops per server, and what still waits to be written."""

    def __init__(
        self, policy: Policy, store: EventStore | None, clock: Callable[[], float] = time.time
    ) -> None:
        self.policy = policy
        self.store = store
        self.clock = clock
        self.notices: dict[tuple[str, str], deque[NoticeRow]] = {}
        self.last_stops: dict[tuple[str, str], LastStop] = {}
        #: (user, name) -> (reason, when asked, the pod's uid): a stop the service asked for
        self._intents: dict[tuple[str, str], tuple[str, float, str | None]] = {}
        #: pod uids whose end is recorded (each end once)
        self._ended: deque[str] = deque(maxlen=10_000)
        self._pending_notices: list[NoticeRow] = []
        self._pending_stops: list[StopRow] = []
        self.loaded = store is None
        #: when the database was last read back (a replica that does not act reads on)
        self._read_at: float | None = None

    # ---- what happens --------------------------------------------------------------

    def notice(self, notice: Notice) -> None:
        """A notice the service gave (``ServiceState.on_notice``)."""
        row = NoticeRow(
            user=notice.user,
            server=notice.server,
            uid=notice.uid,
            kind=notice.kind,
            message=notice.text,
            at=notice.at.timestamp(),
            stop_at=notice.stop_at.timestamp() if notice.stop_at else None,
        )
        if notice.user is not None:
            self._remember_notice(row)
        self._pending_notices.append(row)
        del self._pending_notices[:-MAX_PENDING]

    def _remember_notice(self, row: NoticeRow) -> None:
        assert row.user is not None
        key = (row.user, row.server or "")
        self.notices.setdefault(key, deque(maxlen=PER_SERVER)).append(row)

    def of_server(self, user: str, name: str) -> list[NoticeRow]:
        return list(self.notices.get((user, name), ()))

    def stopping(self, user: str, name: str, reason: str, uid: str | None) -> None:
        """The service asks the hub to stop this server now (for ``reason``)."""
        self._intents[(user, name)] = (reason, self.clock(), uid)

    def not_stopped(self, user: str, name: str) -> None:
        """The stop asked for was not made (failed, or not sent)."""
        self._intents.pop((user, name), None)

    def stopped(self, user: str, name: str) -> None:
        """The hub stopped the server the service asked it to stop: recorded now, unless
        the end of its pod was seen (and recorded with this reason) first."""
        intent = self._intents.pop((user, name), None)
        if intent is None:
            return
        reason, at, uid = intent
        if uid is not None and uid in self._ended:
            return
        self._record(user, name, uid, reason, stop_text(reason), at)

    def pod_ended(self, pod: ServerPod) -> None:
        """A server pod is gone (``ServiceState.on_pod_gone``): its stop and why."""
        if pod.user is None or (pod.charge is None and pod.before_policy is None):
            return  # not a server's, or one that had finished (its end was seen then)
        if pod.uid is not None and pod.uid in self._ended:
            return
        key = (pod.user, pod.servername)
        intent = self._intents.get(key)
        now = self.clock()
        if intent is not None and now - intent[1] <= INTENT_FOR and intent[2] in (None, pod.uid):
            del self._intents[key]
            reason, text = intent[0], stop_text(intent[0])
        else:
            reason, text = why_it_ended(pod, self.policy)
        self._record(pod.user, pod.servername, pod.uid, reason, text, now)

    def _record(
        self, user: str, name: str, uid: str | None, reason: str, text: str, at: float
    ) -> None:
        if uid is not None:
            self._ended.append(uid)
        self.last_stops[(user, name)] = last_stop(reason, text, at)
        self._pending_stops.append(StopRow(user, name, uid, reason, text, at))
        del self._pending_stops[:-MAX_PENDING]
        log.info("%s's server %r stopped (%s): %s", user, name, reason, text)

    # ---- the database --------------------------------------------------------------

    async def run(self) -> str:
        """The ``server events`` task: read back at the first run, then write what came."""
        said = ""
        if not self.loaded:
            said = await self.load() + "; "
        if self.store is None:
            return said + "not kept (no database)"
        notices, stops = self._pending_notices, self._pending_stops
        if not notices and not stops:
            return said + "nothing new"
        self._pending_notices, self._pending_stops = [], []
        try:
            pruned = await asyncio.to_thread(self.store.write, notices, stops, self.clock())
        except Exception:
            # kept for the next run, ahead of what came meanwhile
            self._pending_notices[:0] = notices
            self._pending_stops[:0] = stops
            raise
        return (
            said
            + f"{len(notices)} notice(s), {len(stops)} stop(s) written"
            + (f", {pruned} older than the retention pruned" if pruned else "")
        )

    async def follow(self) -> str:
        """A replica that does not act writes nothing: what it saw is the acting one's to
        write, and it reads back what that one wrote since its last read."""
        self.forget_unwritten()
        if self.store is None:
            return "not kept (no database)"
        if not self.loaded or self._read_at is None:
            return await self.load()
        now, since = self.clock(), self._read_at - FOLLOW_OVERLAP
        stops = await asyncio.to_thread(self.store.last_stops, since)
        notices = await asyncio.to_thread(self.store.recent_notices, since)
        self._take_stops(stops)
        for row in notices:
            if row.user is not None and row not in self.notices.get(
                (row.user, row.server or ""), ()
            ):
                self._remember_notice(row)
        self._read_at = now
        return f"read {len(stops)} last stop(s) and {len(notices)} notice(s) since the last read"

    def forget_unwritten(self) -> None:
        self._pending_notices, self._pending_stops = [], []

    def reload(self) -> None:
        """Read the database back at the next run (this replica starts acting)."""
        self.loaded = self.store is None

    async def load(self) -> str:
        """The last stops and the last day's notices from the database (what this
        service has seen since it started stays newer)."""
        assert self.store is not None
        now = self.clock()
        stops = await asyncio.to_thread(self.store.last_stops, now - self.store.retention)
        notices = await asyncio.to_thread(self.store.recent_notices, now - NOTICES_READ_BACK)
        self._take_stops(stops)
        seen = {key: list(rows) for key, rows in self.notices.items()}
        self.notices = {}
        for row in notices:
            self._remember_notice(row)
        for rows in seen.values():
            for row in rows:
                self._remember_notice(row)
        self.loaded = True
        self._read_at = now
        return f"read {len(stops)} last stop(s) and {len(notices)} notice(s)"

    def _take_stops(self, stops: dict[tuple[str, str], StopRow]) -> None:
        for key, row in stops.items():
            known = self.last_stops.get(key)
            if known is None or known.at < row.at:
                self.last_stops[key] = last_stop(row.reason, row.message, row.at)


def last_stop(reason: str, text: str, at: float) -> LastStop:
    what = WHAT_TO_DO.get(reason) or WHAT_TO_DO_ALSO.get(reason, "Start it again from the hub.")
    return LastStop(at=at, reason=reason, text=text, what_to_do=what)
