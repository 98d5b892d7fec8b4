"""Leader election on a ``coordination.k8s.io`` Lease, fenced by the renew deadline.

The same protocol as client-go's leader election (and the Lease that
``kube-controller-manager`` or Kueue hold): a replica holds the Lease while it renews
it every ``retry_period``; another may take it once it has seen the Lease's record
unchanged for ``lease_duration`` on its own clock. Each write is a replace with the
Lease's ``resourceVersion``, so two replicas can never both succeed at the same record.

What it adds to kubernetes_asyncio's ``leaderelection`` (which it does not use): that
one measures its renew deadline afresh after every successful renewal plus a retry
period, waits for API calls without a timeout, and tells its leader to stop only
after a whole renew deadline of failed retries, so a leader suspended past the
Lease's duration (a stopped process, a frozen VM, a hung API call) resumes still
acting while another replica already acts. Here the replica *acts* only until
``renew_deadline`` after the start of its last successful renewal, on the monotonic
clock: from that moment ``acting()`` is false, a timer cancels the acting work, and
every API call is bounded by the time left. The deadline is counted from before the
renewal was sent, and another replica's ``lease_duration`` from after it saw the
renewal, so ``renew_deadline < lease_duration`` keeps the two apart by at least the
difference, whatever the network or a suspended process does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..core.lease import LeaseTimings

log = logging.getLogger("jupyterhub_gpu.leader")


def default_identity() -> str:
    """This replica's name in the Lease: its pod's name (``POD_NAME``) or host name, and a
    suffix of its own, so a restarted process never takes its predecessor's record."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _micro_time(epoch: float) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


@dataclass
class ActingPeriod:
    """A time this replica acted, on the wall clock; ``until`` None: it still does."""

    since: float
    until: float | None = None
    why_ended: str | None = None


@dataclass
class LeaseState:
    """The Lease as this replica last read or wrote it, and its own part in it."""

    holder: str | None = None
    acquired: float | None = None  # the holder's acquireTime (epoch)
    renewed: float | None = None  # its renewTime (epoch)
    transitions: int = 0
    #: the times this replica acted (the last 20)
    periods: list[ActingPeriod] = field(default_factory=list)
    error: str | None = None


class LeaseElector:
    """One replica's candidacy: ``run()`` until cancelled; ``acting()`` says whether it may
    act now. ``on_started`` is called when it starts acting, ``on_stopped(why)`` when it
    stops (both on the event loop, never concurrently)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        timings: LeaseTimings,
        *,
        identity: str | None = None,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[str], None] = lambda why: None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if errors := timings.errors():
            raise ValueError("; ".join(errors))
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.timings = timings
        self.identity = identity or default_identity()
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.monotonic = monotonic
        self.wall = wall
        self.state = LeaseState()
        #: the monotonic moment this replica's acting ends unless it renews before
        self._fence: float | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        #: the record last read and when it was first seen so (monotonic)
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._resource_version: str | None = None

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def acting(self) -> bool:
        """True while this replica holds the Lease and its renew deadline has not passed."""
        return self._fence is not None and self.monotonic() < self._fence

    def why_not_acting(self) -> str | None:
        """None while acting; else why not, in words (for a write refused by the fence)."""
        if self.acting():
            return None
        holder = self.state.holder
        return f"this replica ({self.identity}) does not hold {self.where}" + (
            f" (held by {holder})" if holder and holder != self.identity else ""
        )

    # ---- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        """Try to take or renew the Lease every ``retry_period`` until cancelled."""
        while True:
            await self.try_once()
            await asyncio.sleep(self.timings.retry_period)

    async def try_once(self) -> bool:
        """One attempt to take or renew; True when this replica holds the Lease after it."""
        began = self.monotonic()
        # a call never outlives the acting it could extend
        budget = self.timings.renew_deadline
        if self._fence is not None:
            budget = max(min(budget, self._fence - began), 0.5)
        try:
            held = await asyncio.wait_for(self._take_or_renew(began), budget)
            self.state.error = None
        except Exception as e:  # any failure to renew is one: the deadline decides
            held = False
            self.state.error = _describe(e)
            log.warning("%s: %s could not renew or take it: %s", self.where, self.identity, e)
        if held:
            fence, now = began + self.timings.renew_deadline, self.monotonic()
            if self._fence is not None and self._fence <= now:
                # its deadline passed before this renewal came back: that acting is over
                self._stop_acting(f"{self.where} was not renewed within its renew deadline")
            if fence > now:  # a renewal that took longer than the deadline counts for nothing
                if self._fence is None:
                    self._start_acting()
                self._set_fence(fence)
        elif self._fence is not None and (
            self.state.holder != self.identity or self.monotonic() >= self._fence
        ):
            self._stop_acting(
                f"{self.where} is held by {self.state.holder}"
                if self.state.holder not in (None, self.identity)
                else f"{self.where} was not renewed within its renew deadline"
            )
        return held

    async def _take_or_renew(self, began: float) -> bool:
        try:
            lease = await self.leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            return await self._create()
        spec = lease.spec
        record = _record(lease)
        self._note(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, self.monotonic()
        self._resource_version = lease.metadata.resource_version
        holder = spec.holder_identity
        if (
            holder
            and holder != self.identity
            and self._observed_at + self.timings.duration > self.monotonic()
        ):
            return False  # held, and not yet expired on this replica's clock
        now = self.wall()
        mine = holder == self.identity
        body = self._body(
            {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": _whole_seconds(self.timings.duration),
                "acquireTime": (
                    _micro_time(_epoch(spec.acquire_time) or now) if mine else _micro_time(now)
                ),
                "renewTime": _micro_time(now),
                "leaseTransitions": (spec.lease_transitions or 0)
                + (0 if mine or not holder else 1),
            },
            lease.metadata.resource_version,
        )
        return await self._written(
            self.leases.replace_namespaced_lease(self.name, self.namespace, body)
        )

    async def _create(self) -> bool:
        now = self.wall()
        body = self._body(
            {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": _whole_seconds(self.timings.duration),
                "acquireTime": _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": 0,
            }
        )
        return await self._written(self.leases.create_namespaced_lease(self.namespace, body))

    async def _written(self, write: Awaitable[Any]) -> bool:
        """Whether a write of the Lease went through (409: another replica wrote first)."""
        try:
            lease = await write
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        self._wrote(lease)
        return True

    def _body(self, spec: dict[str, Any], resource_version: str | None = None) -> dict:
        """A Lease to write; with ``resource_version``, only over that version of it."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    def _wrote(self, lease: Any) -> None:
        self._note(lease.spec)
        self._resource_version = lease.metadata.resource_version
        self._observed, self._observed_at = _record(lease), self.monotonic()

    def _note(self, spec: Any) -> None:
        self.state.holder = spec.holder_identity or None
        self.state.acquired = _epoch(spec.acquire_time)
        self.state.renewed = _epoch(spec.renew_time)
        self.state.transitions = spec.lease_transitions or 0

    async def release(self) -> None:
        """Stop acting, then give the Lease up (a rolling update's old replica), so the
        other replica takes it at its next retry instead of after ``lease_duration``."""
        was_holding = self._fence is not None
        self._stop_acting("the service is stopping")
        if not was_holding or self._resource_version is None:
            return
        body = self._body(
            {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(self.wall()),
                "leaseTransitions": self.state.transitions,
            },
            self._resource_version,
        )
        try:
            await asyncio.wait_for(
                self.leases.replace_namespaced_lease(self.name, self.namespace, body),
                self.timings.retry_period,
            )
            log.info("%s: %s gave it up", self.where, self.identity)
        except (ApiException, TimeoutError, OSError) as e:
            # the other replica takes it after lease_duration instead
            log.warning("%s: %s could not give it up: %s", self.where, self.identity, e)

    # ---- acting ----------------------------------------------------------------------

    def _start_acting(self) -> None:
        self.state.periods.append(ActingPeriod(since=self.wall()))
        del self.state.periods[:-20]
        log.info(
            "%s: %s acts as the leader from %s (lease %.0f s, renew deadline %.0f s)",
            self.where,
            self.identity,
            _micro_time(self.wall()),
            self.timings.duration,
            self.timings.renew_deadline,
        )
        self.on_started()

    def _set_fence(self, fence: float) -> None:
        self._fence = fence
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(fence - self.monotonic(), 0.0)
        self._fence_timer = loop.call_later(delay, self._fence_passed)

    def _fence_passed(self) -> None:
        if self._fence is not None and self.monotonic() >= self._fence:
            self._stop_acting(f"{self.where} was not renewed within its renew deadline")

    def _stop_acting(self, why: str) -> None:
        if self._fence is None:
            return
        # acting ended at the deadline at the latest, whenever this replica noticed
        ended = self.wall() - max(self.monotonic() - self._fence, 0.0)
        self._fence = None
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        if self.state.periods and self.state.periods[-1].until is None:
            period = self.state.periods[-1]
            period.until, period.why_ended = ended, why
        log.warning(
            "%s: %s stopped acting as the leader at %s: %s",
            self.where,
            self.identity,
            _micro_time(ended),
            why,
        )
        self.on_stopped(why)

    def to_json(self) -> dict[str, Any]:
        """The Lease, its timings and who leads, for the dashboard and ``api/usage``."""
        return {
            "lease": self.where,
            "identity": self.identity,
            "acting": self.acting(),
            "holder": self.state.holder,
            "acquired": self.state.acquired,
            "renewed": self.state.renewed,
            "transitions": self.state.transitions,
            "duration_seconds": self.timings.duration,
            "renew_deadline_seconds": self.timings.renew_deadline,
            "retry_period_seconds": self.timings.retry_period,
            "error": self.state.error,
            "acting_periods": [
                {"since": p.since, "until": p.until, "why_ended": p.why_ended}
                for p in self.state.periods
            ],
        }


def _record(lease: Any) -> tuple[Any, ...]:
    """What another replica's renewal changes (any change restarts the wait for expiry)."""
    spec = lease.spec
    return (
        spec.holder_identity,
        _epoch(spec.renew_time),
        _epoch(spec.acquire_time),
        spec.lease_transitions,
        lease.metadata.resource_version,
    )


def _whole_seconds(seconds: float) -> int:
    """``leaseDurationSeconds`` is whole seconds: rounded up, never shorter than the
    duration this replica waits for."""
    return max(int(-(-seconds // 1)), 1)


def _describe(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason}"
    if isinstance(error, TimeoutError):
        return "the API server did not answer in time"
    return f"{type(error).__name__}: {error}"
