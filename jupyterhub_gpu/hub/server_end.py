"""When a server's GPU time ends: at the moment the hub asked its pod to go, or, for a
server found stopped (its pod deleted, evicted, gone while the hub was down, its
process exited), at the pod's own end or its last sighting, never when the hub
noticed."""

from __future__ import annotations

from datetime import UTC, datetime

from ..core.ends import has_ended, pod_ended_at
from .ports import EndingServer, WatchedPod

#: how a pod found ended ended: (when, its uid, whether inferred)
FoundEnd = tuple[float, str | None, bool]


def reflected_pod(spawner: WatchedPod) -> tuple[bool, dict | None]:
    """(whether the hub's pod watch has listed the pods, the server's pod there)."""
    reflector = spawner.pod_reflector
    if reflector is None or not reflector.first_load_future.done():
        return False, None
    return True, reflector.pods.get(spawner._server_key)


class ServerEnd:
    """One server's pod as the hub last saw it, and the end of its GPU time, written
    once per start."""

    def __init__(self, spawner: EndingServer) -> None:
        self.spawner = spawner
        #: the server's pod as this hub last saw it (at its start and every poll), and
        #: when it was last seen alive (epoch seconds): what a server found stopped
        #: ends at
        self.pod_seen: dict | None = None
        self.alive_at: float | None = None
        #: the end of the current pod's GPU time is written down (by a stop, or a poll)
        self.ended = False

    def new_start(self) -> None:
        """A new start of the server: nothing seen of its pod yet."""
        self.pod_seen = self.alive_at = None
        self.ended = False

    def note_pod(self) -> None:
        """Remember the server's pod as the watch shows it now, and whether it is alive."""
        _, pod = reflected_pod(self.spawner)
        if pod is None:
            return
        self.pod_seen = pod
        if not has_ended(pod):
            self.alive_at = self.spawner.admission.clock()

    def found_ended(self, now: float) -> FoundEnd | None:
        """How the server's pod ended when this stop found it ended already; None when
        the hub asks a running pod to go.

        A stop asked for (a user's, an admin's, the service's through the hub's API)
        finds the pod alive. A server found stopped does not: KubeSpawner's poll
        stops a pod whose server's process exited, and a poll (at a hub start too)
        finds a deleted or evicted pod gone. A pod found ended ends at its own end
        where it says it (its container's ``finishedAt``, its ``deletionTimestamp``),
        else at the last time it was seen alive, never when the hub noticed.
        """
        listed, pod = reflected_pod(self.spawner)
        if not listed or (pod is not None and not has_ended(pod)):
            return None
        seen = pod if pod is not None else self.pod_seen
        uid = ((seen or {}).get("metadata") or {}).get("uid")
        at = pod_ended_at(seen, now)
        if at is not None:
            return at, uid, False
        # the row's last sighting, if later (the service's), wins over the hub's
        return self.alive_at or 0.0, uid, True

    async def record(self, asked_at: float, found: FoundEnd | None) -> None:
        """Write down the end of the server's GPU time (see ``found_ended``), once."""
        if self.ended:
            return
        self.ended = True
        spawner, key = self.spawner, self.spawner._server_key
        if found is None:
            spawner.admission.record_stop(key, at=asked_at)
            return
        at, uid, inferred = found
        try:
            # a hub that just started may not have read the usage yet: the record of a
            # server that went while it was down is in what it reads
            await spawner.ready_ledger()
        except Exception as e:
            spawner.log.warning(
                "GPU time of %s not ended by the hub (%s): the GPU service ends it at "
                "the pod's last sighting",
                spawner._log_name,
                e,
            )
            return
        book = spawner.admission.usage
        if (book.records.get(uid) if uid else book.open_by_key.get(key)) is None:
            return  # no GPU time recorded: a server without GPUs, or no pod ever ran
        spawner.log.info(
            "GPU time of %s: its pod had ended before the hub stopped it; %s",
            spawner._log_name,
            "counted until it was last seen alive"
            if inferred
            else "ended when the pod ended, at "
            + datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds"),
        )
        spawner.admission.record_stop(key, at=at, uid=uid, inferred=inferred)
