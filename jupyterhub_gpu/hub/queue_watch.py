"""Waiting in a scheduler's queue: the spawner's side of a scheduler that holds server
pods before scheduling them (Kueue behind its admission gate, Volcano with the pod's
PodGroup ``Pending``).

While the scheduler holds the pod, the start's ``start_timeout`` does not run: the
queue has ``queue_timeout``, and ``start_timeout`` bounds the start before the pod is
queued and again from the scheduler's admission. Meanwhile ``QueueWatch.line`` is
what the spawn page says: the server's place in the queue and the scheduler's
reason. What to read and what it means is the scheduler's (``core.schedulers``);
the reading is here: the scheduler's objects listed through the API, one read per
poll interval shared by every spawner however many servers wait.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiException, CustomObjectsApi

from ..core import words
from ..core.model import PolicyError
from ..core.schedulers import Resource, Scheduler, scheduler_for
from ..kube.client import exception_message
from .checks import SpawnRefused
from .ports import QueuedSpawn

#: "wait indefinitely" as a number of seconds (JupyterHub's start_timeout is an Integer)
NO_QUEUE_TIMEOUT = 10 * 365 * 24 * 3600


class QueueWatch:
    """One spawner's starts, watched while its scheduler holds the server's pod."""

    #: the scheduler's objects listed per namespace, and its queues read: (when, the
    #: answer), shared by every spawner
    _reads: dict[tuple, tuple[float, asyncio.Future]] = {}
    #: the queue objects the hub was refused reading (each logged once)
    _read_refused: set[Resource] = set()

    def __init__(self, spawner: QueuedSpawn) -> None:
        self.spawner = spawner
        #: what the spawn page shows while the scheduler holds the server's pod
        self.line: str | None = None
        #: start_timeout as configured (``lengthen_start_timeout`` lengthens it while
        #: the start may be queued)
        self.start_timeout_configured: int | None = None

    def scheduler(self) -> Scheduler | None:
        """The policy's scheduler when it holds servers' pods in a queue."""
        try:
            scheduler = scheduler_for(self.spawner.gpu_policy)
        except PolicyError:
            return None  # every spawn is refused with the policy's errors
        return scheduler if scheduler.queues_pods else None

    def lengthen_start_timeout(self) -> None:
        """Give JupyterHub a start_timeout that a server queued by its scheduler outlasts.

        JupyterHub gives start() start_timeout seconds, read once as it returns; the
        hub's bound becomes a backstop past every deadline ``_watch`` enforces itself:
        the start before the pod is queued, the time in the queue, the start after
        admission.
        """
        spawner = self.spawner
        if self.scheduler() is None:
            return
        if self.start_timeout_configured is None:
            self.start_timeout_configured = spawner.start_timeout
        configured = self.start_timeout_configured
        queue_timeout = spawner.queue_timeout
        queued = int(queue_timeout) if queue_timeout > 0 else NO_QUEUE_TIMEOUT
        spawner.start_timeout = 2 * configured + queued + 10

    async def bounded(self, starting: Awaitable[Any]) -> Any:
        """``starting`` (the start), bounded by start_timeout except while queued.

        KubeSpawner waits for the pod to run under the lengthened start_timeout (see
        ``lengthen_start_timeout``); the watch beside it gives up on the start when
        one of its own deadlines passes, and the start is cancelled (JupyterHub then
        stops the server, which deletes its pod and frees its charge).
        """
        scheduler = self.scheduler()
        if self.start_timeout_configured is None or scheduler is None:
            return await starting
        started = asyncio.get_running_loop().time()
        start = asyncio.ensure_future(starting)
        watch = asyncio.ensure_future(self._watch(scheduler, started))
        try:
            await asyncio.wait({start, watch}, return_when=asyncio.FIRST_COMPLETED)
            if start.done():
                return start.result()
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await start
            return watch.result()  # it only ends by raising: a deadline passed
        finally:
            for task in (start, watch):
                task.cancel()
            self.line = None
            self.spawner.start_timeout = self.start_timeout_configured

    async def _watch(self, scheduler: Scheduler, started: float) -> None:
        """Raise when the start runs out of time, not counting the time queued.

        Until the pod is queued, and again from the scheduler's admission, the start
        has ``start_timeout``; while the scheduler holds the pod in its queue (Kueue:
        behind its admission gate; Volcano: its PodGroup ``Pending``),
        ``queue_timeout``. Meanwhile ``line`` says where the server is in the queue.
        """
        spawner = self.spawner
        loop = asyncio.get_running_loop()
        label = scheduler.display_name
        start_timeout = self.start_timeout_configured or 0
        queued_since: float | None = None
        admitted_at: float | None = None
        while True:
            now = loop.time()
            pod = self._starting_pod()
            line = await self._queue_line(scheduler, pod) if pod is not None else None
            if pod is not None and line is not None:
                queued_since = queued_since if queued_since is not None else now
                self.line = line
                if spawner.queue_timeout > 0 and now - queued_since >= spawner.queue_timeout:
                    # 429, a handled rejection (a busy cluster, not a broken hub): it
                    # never counts towards the hub's consecutive_failure_limit
                    raise SpawnRefused(
                        queue_timeout_refusal(
                            now - queued_since,
                            label,
                            scheduler.queue_of(pod),
                            spawner.queue_timeout,
                        ),
                        429,
                    )
            else:
                if queued_since is not None and admitted_at is None:
                    admitted_at = now
                    self.line = None
                    spawner.log.info(
                        "%s admitted %s after %s in its queue",
                        label,
                        spawner._log_name,
                        duration(now - queued_since),
                    )
                since = admitted_at if admitted_at is not None else started
                if now - since >= start_timeout:
                    after = f" after {label} admitted it" if admitted_at is not None else ""
                    raise TimeoutError(
                        f"pod {spawner._server_key} did not start in {start_timeout} seconds{after}"
                    )
            await asyncio.sleep(spawner.wait_poll_interval)

    def _starting_pod(self) -> dict | None:
        """The server's pod as the pod watch last saw it (none while being deleted)."""
        reflector = self.spawner.pod_reflector
        pod = reflector.pods.get(self.spawner._server_key) if reflector is not None else None
        if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
            return None
        return pod

    async def _queue_line(self, scheduler: Scheduler, pod: dict) -> str | None:
        """Where ``pod`` waits in its scheduler's queue, and why, in one line; None when
        the scheduler does not hold it (not yet queued, or admitted)."""
        if not scheduler.holds(pod):
            return None
        log, name = self.spawner.log, self.spawner._log_name
        queue = scheduler.queue_of(pod)
        resource = scheduler.queue_objects
        assert resource is not None  # a scheduler that holds pods keeps objects for them
        try:
            listed = await self._queue_objects(resource, pod["metadata"]["namespace"])
        except ApiException as e:
            if e.status != 403:
                # the line keeps what it said; waiting goes on, watched by the pod watch
                log.warning("Reading %s for %s: %s", resource[2], name, exception_message(e))
                return self.line or scheduler.unread_line(queue)
            if resource not in QueueWatch._read_refused:
                QueueWatch._read_refused.add(resource)
                log.warning(
                    "Cannot read %s.%s (%s): the spawn page cannot show a server's place in "
                    "its %s queue. Grant the hub get/list/watch on them (`jupyterhub-gpu "
                    "manifests` renders it).",
                    resource[2],
                    resource[0],
                    exception_message(e),
                    scheduler.display_name,
                )
            return scheduler.unread_line(queue)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            # the pod watch rides out an outage; the line waits for the API server too
            log.warning("Reading %s for %s: %s", resource[2], name, e)
            return self.line or scheduler.unread_line(queue)
        place = scheduler.place(pod, listed)
        if place is None:
            return None
        state = await self._queue_state(scheduler, queue) if scheduler.queue_states else None
        return scheduler.queue_line(place, state)

    async def _queue_objects(self, resource: Resource, namespace: str) -> list[dict]:
        """The ``resource`` objects (Workloads, PodGroups) in ``namespace``; one listing
        per poll interval for all spawners, however many servers wait there."""
        timeout = self.spawner.k8s_api_request_timeout
        listed = await self._shared_read(
            (resource, namespace),
            lambda custom: custom.list_namespaced_custom_object(
                *resource[:2], namespace, resource[2], _request_timeout=timeout
            ),
        )
        return listed.get("items", [])

    async def _queue_state(self, scheduler: Scheduler, queue: str) -> str | None:
        """The state of the scheduler's queue ``queue`` (Volcano's: ``Open``,
        ``Closed``, ...); None when it cannot be read (the line then says what it knows
        without it)."""
        resource = scheduler.queue_states
        assert resource is not None
        timeout = self.spawner.k8s_api_request_timeout
        try:
            found = await self._shared_read(
                (resource, queue),
                lambda custom: custom.get_cluster_custom_object(
                    *resource, queue, _request_timeout=timeout
                ),
            )
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError) as e:
            self.spawner.log.debug("Reading %s queue %s: %s", scheduler.display_name, queue, e)
            return None
        return (found.get("status") or {}).get("state")

    async def _shared_read(self, key: tuple, request: Callable[[CustomObjectsApi], Awaitable]):
        """``request``'s answer, made at most once per poll interval for every spawner."""
        now = asyncio.get_running_loop().time()
        cached = QueueWatch._reads.get(key)
        if cached is None or now - cached[0] >= self.spawner.wait_poll_interval:
            answer = asyncio.ensure_future(request(CustomObjectsApi(self.spawner.api.api_client)))
            # an answer whose every reader was cancelled still has its error read
            answer.add_done_callback(lambda f: f.cancelled() or f.exception())
            cached = QueueWatch._reads[key] = (now, answer)
        return await asyncio.shield(cached[1])


def duration(seconds: float) -> str:
    """``45 seconds``, ``12 minutes``, ``3 hours 20 minutes``: as every message says it."""
    return words.duration(seconds)


def queue_timeout_refusal(waited: float, scheduler: str, queue: str, timeout: float) -> str:
    """A start given up after waiting ``timeout`` in its scheduler's queue."""
    return (
        f"the server waited {duration(waited)} in {scheduler} queue {queue} without being "
        f"admitted, and this hub lets a server wait at most {duration(timeout)}: it was not "
        "started; try again later, or ask an admin about the queue"
    )
