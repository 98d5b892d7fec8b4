"""Idle servers: GPUs reclaimed from servers nobody uses, warned first, then stopped.

A group's ``idle: {after, gpu_utilization_below}`` rule applies to its servers
that hold GPUs. Each run of the ``idle servers`` task judges every such server
that has run for at least ``after``:

- **GPU utilisation (DCGM)**, where it can be told apart per pod: whole GPUs
  (``gpu`` flavors, and DRA devices) and MIG slices (``mig``, and MIG partitions
  allocated through DRA). The service asks
  Prometheus (``GPUService.prometheus_url``) for the highest utilisation the
  NVIDIA DCGM exporter reported for the server's pod over the last ``after``:
  ``DCGM_FI_DEV_GPU_UTIL`` (percent) for a whole GPU,
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a ratio, times 100) for a MIG slice. Below
  ``gpu_utilization_below`` all that time: idle. A pod whose samples do not
  reach back to the start of that window is not idle (not enough data). A pod
  Prometheus has no series for is unknown: never warned, never stopped, and
  never judged by notebook activity instead (a training run in a terminal or a
  long cell makes none).
- **Notebook activity**, where a GPU's use cannot be attributed to one pod
  (``timeslice``, ``mps``, ``fraction`` and ``hami`` flavors, and ``dra`` flavors
  with ``sharing``, share a device:
  each pod sees the device's whole utilisation), or where no Prometheus is
  configured: the hub's ``last_activity`` of the server. No activity for
  ``after``: idle.

An idle server gets a notice (the dashboard and the log) that says which
signal was used and when it will be stopped; ``GPUService.idle_notice`` later,
if it is still idle, the hub is asked to stop it. Use or activity coming back
in between cancels the stop, with a notice. When Prometheus cannot be reached,
the servers judged by DCGM are left as they are (neither warned nor stopped nor
cleared) and the task fails, naming the URL, until it answers again. When it
answers but has no series for most (more than half) of the servers judged by
DCGM, the task fails too (``NoDCGMSeries``), naming the likely causes; those
servers are left as they are and the others are still judged. Each run's
numbers (``Coverage``) are in the service's metrics.

What is remembered (who was warned, when) lives in memory: after a restart of
the service a server is warned again, which only ever delays a stop.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..core import words
from ..core.dra import DraInventory, attribute
from ..core.model import Flavor, Idle, Policy
from .state import ServerPod, ServiceState
from .views import Notice, Server

#: asks the hub to stop (user, server name) for a reason; the error in words, or None
StopServer = Callable[[str, str, str], Awaitable[str | None]]

#: flavor kinds whose devices several pods share: a device's utilisation is not one pod's
SHARED_KINDS = frozenset({"timeslice", "mps", "fraction", "hami"})
#: dcgm-exporter's metrics: GPU utilisation in percent (whole GPUs, not MIG slices) ...
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
#: ... and the graphics engine's active ratio, 0 to 1 (MIG slices report this one)
ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def shares_its_device(flavor: Flavor) -> bool:
    """Whether a flavor's servers share their devices with others (a shared kind, or a
    DRA claim configured for time-slicing or MPS): a device's utilisation is then all
    its sharers', and tells nothing of one server's."""
    return flavor.kind in SHARED_KINDS or flavor.sharing is not None


#: an answer this long (bytes) or longer is decoded off the event loop
LARGE_ANSWER = 64 * 1024


class PrometheusError(Exception):
    """Prometheus did not answer a query; the message names the URL and what to check."""


class Prometheus:
    """Prometheus' HTTP API: instant queries (``/api/v1/query``)."""

    def __init__(self, url: str, timeout: float = 20) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.http = AsyncHTTPClient()

    def _failed(self, what: str) -> PrometheusError:
        return PrometheusError(
            f"Prometheus at {self.url} (GPUService.prometheus_url): {what}; "
            "servers judged by GPU utilisation are neither warned nor stopped until it answers"
        )

    async def query(self, promql: str) -> list[dict]:
        """The instant vector ``promql`` evaluates to now, as Prometheus gives it:
        ``[{"metric": {label: value}, "value": [time, "number"]}]``."""
        request = HTTPRequest(
            f"{self.url}/api/v1/query",
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            body=urlencode({"query": promql}),
            request_timeout=self.timeout,
        )
        try:
            response = await self.http.fetch(request, raise_error=False)
        except OSError as e:
            raise self._failed(f"cannot connect ({e})") from None
        except HTTPClientError as e:  # a timeout: no response at all
            raise self._failed(f"no answer within {self.timeout:g}s ({e})") from None
        if response.code == 599:
            raise self._failed(f"no answer ({response.error})")
        raw = response.body or b""
        try:
            # a day of a large cluster's pods is some megabytes (showback's utilisation):
            # decoded on a thread, the event loop answering meanwhile
            body = (
                json.loads(raw)
                if len(raw) < LARGE_ANSWER
                else await asyncio.to_thread(json.loads, raw)
            )
        except ValueError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            raise self._failed(
                f"HTTP {response.code} from /api/v1/query, not Prometheus' HTTP API "
                "(give the URL Prometheus' own web page is at)"
            )
        if body["status"] != "success":
            raise self._failed(f"the query failed: {body.get('errorType')}: {body.get('error')}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise self._failed(f"expected an instant vector, got {data.get('resultType')!r}")
        return list(data.get("result") or [])


# ---- what is judged, and how (pure) -------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A running server holding GPUs in a group with an idle rule."""

    server: Server
    pod: ServerPod
    rule: Idle
    #: the DCGM metric its pod's utilisation is read from; None: its GPU is shared
    metric: str | None

    @property
    def namespace(self) -> str:
        return self.pod.key.partition("/")[0]

    @property
    def pod_name(self) -> str:
        return self.pod.key.partition("/")[2]


def candidates(
    policy: Policy,
    servers: Iterable[Server],
    pods: Mapping[str, ServerPod],
    inventory: DraInventory | None = None,
) -> list[Candidate]:
    """The servers an idle rule applies to now, with the metric each is judged by.

    ``inventory``: the DRA objects, for what the claims of DRA servers were allocated.
    A server still starting or already stopping is left alone, and so is one
    without a pod or without GPUs (CPU-only servers hold nothing to reclaim), and
    one started before the policy (never stopped because of the switch).
    """
    by_server = {(p.user, p.servername): p for p in pods.values() if p.charge is not None}
    result = []
    for server in servers:
        if server.pending or not server.ready or server.started is None or server.before_policy:
            continue
        group = policy.find_group(server.group)
        pod = by_server.get((server.user, server.name))
        if group is None or group.idle is None or pod is None or pod.charge is None:
            continue
        flavors = [policy.flavors.get(name) for name, _ in pod.charge.request.devices]
        if not flavors:
            continue
        kinds = dra_kinds(inventory, pod)
        if any(f is None or shares_its_device(f) for f in flavors):
            metric = None  # unknown or shared: fall back to activity
        elif kinds:  # DRA devices: as the devices allocated are
            metric = ENGINE_ACTIVE if kinds == {"mig"} else GPU_UTIL
        elif all(f.kind == "mig" for f in flavors if f):
            metric = ENGINE_ACTIVE
        else:
            metric = GPU_UTIL
        result.append(Candidate(server=server, pod=pod, rule=group.idle, metric=metric))
    return result


def dra_kinds(inventory: DraInventory | None, pod: ServerPod) -> set[str]:
    """The kinds (``gpu``, ``mig``) of the DRA devices the pod's claims were allocated:
    a MIG partition reports its graphics engine's activity, a whole GPU its utilisation
    (dcgm-exporter maps DRA devices to pods through the kubelet, as device plugins')."""
    if inventory is None or inventory.problem is not None or not pod.uid:
        return set()
    kinds = set()
    for key in inventory.by_pod.get(pod.uid, ()):
        device = inventory.device(key)
        kind = attribute(device, key[0], "type") if device is not None else None
        kinds.add(kind if isinstance(kind, str) else "gpu")
    return kinds


def coverage_window(after: int) -> int:
    """Seconds at each end of the ``after`` window that must hold samples: a tenth of
    it, at least a minute (several scrapes), at most half of it."""
    return max(min(max(after // 10, 60), after // 2), 1)


def utilization_queries(metric: str, namespaces: Iterable[str], after: int) -> tuple[str, str]:
    """PromQL for the pods of ``namespaces``: (their highest utilisation in percent over
    the last ``after`` seconds; those whose samples cover the whole window).

    Covered: samples in the window's first and last ``coverage_window`` seconds,
    so a pod whose series starts (or stops) inside the window is not judged idle
    on part of it.
    """
    names = sorted(set(namespaces))
    bad = [n for n in names if not _DNS_LABEL.match(n)]
    if bad:
        raise ValueError(f"not a namespace name: {bad[0]!r}")
    selector = f'namespace="{names[0]}"' if len(names) == 1 else f'namespace=~"{"|".join(names)}"'
    series = f"{metric}{{{selector},pod!=''}}"
    scale = " * 100" if metric == ENGINE_ACTIVE else ""
    edge = coverage_window(after)
    values = f"max by (namespace, pod) (max_over_time({series}[{after}s])){scale}"
    covered = (
        f"count by (namespace, pod) (count_over_time({series}[{edge}s] offset {after - edge}s))"
        f" and on (namespace, pod) count by (namespace, pod) (count_over_time({series}[{edge}s]))"
    )
    return values, covered


@dataclass(frozen=True)
class Utilization:
    """One pod's highest GPU utilisation (percent) over the window, and whether its
    samples cover all of it."""

    highest: float
    covered: bool


@dataclass(frozen=True)
class Reading:
    """What one run found about one server."""

    #: True: idle; False: in use (or not enough data to say it is idle);
    #: None: unknown this run (Prometheus did not answer, or has no series for the
    #: pod): nothing changes
    idle: bool | None
    #: the signal, in words, for the notice
    signal: str
    #: judged by DCGM: from what Prometheus answered about the pod's GPU use
    dcgm: bool = False
    #: judged by DCGM, and Prometheus answered without a series for the pod
    no_series: bool = False


def _since(server: Server) -> datetime | None:
    """The server's last sign of use: the hub's last_activity, at the earliest its start."""
    times = [t for t in (server.started, server.last_activity) if t is not None]
    return max(times) if times else None


def judge(
    candidate: Candidate,
    now: datetime,
    utilization: Mapping[tuple[str, str], Utilization] | None,
    *,
    prometheus: bool,
) -> Reading:
    """Whether one server is idle now, and by which signal (pure).

    ``utilization``: what Prometheus said for the candidate's metric (None: it
    did not answer); ``prometheus``: whether one is configured at all.

    A server whose GPU use is attributable to its pod is judged by that use
    alone: no series for the pod is unknown, not a reason to look at notebook
    activity (a silent training run makes none).
    """
    rule, server = candidate.rule, candidate.server
    after = words.duration(rule.after)
    assert server.started is not None
    if (now - server.started).total_seconds() < rule.after:
        return Reading(False, "running for less than the idle time")
    if candidate.metric is None:
        why = "a shared GPU's use cannot be measured per server"
    elif not prometheus:
        why = "no GPU metrics are configured"
    elif utilization is None:
        return Reading(None, "Prometheus did not answer")
    else:
        seen = utilization.get((candidate.namespace, candidate.pod_name))
        if seen is None:
            return Reading(None, "no DCGM series for its pod", dcgm=True, no_series=True)
        if not seen.covered:
            return Reading(False, f"DCGM samples do not cover the last {after}", dcgm=True)
        idle = seen.highest < rule.gpu_utilization_below
        below = f"{rule.gpu_utilization_below:g}%"
        if idle:
            return Reading(True, f"GPU utilisation below {below} for {after}", dcgm=True)
        return Reading(False, f"GPU utilisation reached {seen.highest:g}%", dcgm=True)
    since = _since(server)
    idle = since is not None and (now - since).total_seconds() >= rule.after
    return Reading(idle, f"no notebook activity for {after}, and {why}")


class NoDCGMSeries(Exception):
    """Prometheus answered, but has no series for most servers judged by GPU use."""


@dataclass(frozen=True)
class Coverage:
    """One run's servers judged by GPU utilisation (past their idle time, Prometheus
    answering), and which of them Prometheus had no series for."""

    judged: int = 0
    #: ``namespace/pod`` of each server without a series
    without_series: tuple[str, ...] = ()
    #: the nodes those pods run on, where known
    nodes: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        return (
            f"{len(self.without_series)} of {self.judged} servers judged by GPU utilisation "
            "have no DCGM series in Prometheus"
        )

    @property
    def degraded(self) -> bool:
        """Most (more than half) of them without a series: the metrics are not there."""
        return 2 * len(self.without_series) > self.judged

    def problem(self) -> str | None:
        """The degraded state in words, likely causes first (the page shows the first
        300 characters), then some of the nodes and pods; None when not degraded."""
        if not self.degraded:
            return None

        def some(names: tuple[str, ...]) -> str:
            return ", ".join(names[:2]) + ", …" * (len(names) > 2)

        nodes = f"nodes {some(self.nodes)}; " if self.nodes else ""
        return (
            f"{self.summary}, so are neither warned nor stopped: is "
            "dcgm-exporter down on their nodes, scraped without honorLabels (labels renamed "
            f"exported_pod) or not mapping DRA devices to pods? {nodes}"
            f"pods {some(self.without_series)}"
        )


# ---- the rule at work ---------------------------------------------------------------


@dataclass
class IdleWarning:
    """A server told it will be stopped for idling."""

    at: datetime
    stop_at: datetime
    signal: str
    stop_announced: bool = False


class IdleServers:
    """One run of the idle rule: read utilisation, warn, stop, cancel."""

    def __init__(
        self,
        policy: Policy,
        state: ServiceState,
        stop: StopServer,
        prometheus: Prometheus | None,
        notice_period: float,
    ) -> None:
        self.policy = policy
        self.state = state
        self.stop = stop
        self.prometheus = prometheus
        self.notice_period = notice_period
        #: (user, server name, started) -> the warning it was given
        self.warned: dict[tuple[str, str, datetime | None], IdleWarning] = {}
        #: the last run's servers judged by DCGM and those without a series (None: no
        #: run yet, no Prometheus configured, or it did not answer)
        self.coverage: Coverage | None = None

    @property
    def active(self) -> bool:
        """Whether any group has an idle rule."""
        return any(g.idle is not None for g in self.policy.all_groups)

    async def utilization(
        self, chosen: list[Candidate]
    ) -> dict[tuple[str, int], dict[tuple[str, str], Utilization]]:
        """Per (metric, after): each pod's utilisation, from one pair of queries."""
        assert self.prometheus is not None
        wanted: dict[tuple[str, int], set[str]] = {}
        for c in chosen:
            if c.metric is not None:
                wanted.setdefault((c.metric, c.rule.after), set()).add(c.namespace)
        result: dict[tuple[str, int], dict[tuple[str, str], Utilization]] = {}
        for (metric, after), namespaces in sorted(wanted.items()):
            values, covered = utilization_queries(metric, namespaces, after)
            highest = await self.prometheus.query(values)
            whole = {
                (s["metric"].get("namespace", ""), s["metric"].get("pod", ""))
                for s in await self.prometheus.query(covered)
            }
            result[(metric, after)] = {
                key: Utilization(highest=float(s["value"][1]), covered=key in whole)
                for s in highest
                if (key := (s["metric"].get("namespace", ""), s["metric"].get("pod", "")))
            }
        return result

    async def run(self, now: datetime) -> str:
        """One run; raises when Prometheus did not answer, when it has no series for
        most servers judged by DCGM, or when a stop failed, so the task shows it and
        retries (what could be judged was acted on first)."""
        state = self.state
        if state.servers is None:
            raise RuntimeError("no server list from the hub yet (see the hub-servers task)")
        if state.server_pods is None:
            raise RuntimeError("server pods not listed yet (see the watch server pods task)")
        chosen = candidates(self.policy, state.servers, state.server_pods, state.dra)
        readings: dict[tuple[str, int], dict[tuple[str, str], Utilization]] | None = {}
        failure: PrometheusError | None = None
        if self.prometheus is not None and any(c.metric for c in chosen):
            try:
                readings = await self.utilization(chosen)
            except PrometheusError as e:
                readings, failure = None, e
        errors: list[str] = []
        warned = stopped = judged = 0
        without_series: list[Candidate] = []
        seen = set()
        for candidate in chosen:
            server = candidate.server
            key = (server.user, server.name, server.started)
            seen.add(key)
            utilization = (
                None
                if readings is None
                else readings.get((candidate.metric or "", candidate.rule.after), {})
            )
            reading = judge(candidate, now, utilization, prometheus=self.prometheus is not None)
            warning = self.warned.get(key)
            judged += reading.dcgm
            if reading.no_series:
                without_series.append(candidate)
            if reading.idle is None:
                continue
            if not reading.idle:
                if warning is not None:
                    del self.warned[key]
                    self._notice(
                        now,
                        server,
                        idle_cancelled_text(server.label, self._group_name(server)),
                        "idle_cancelled",
                    )
                continue
            if warning is None:
                stop_at = now + timedelta(seconds=self.notice_period)
                self.warned[key] = IdleWarning(at=now, stop_at=stop_at, signal=reading.signal)
                warned += 1
                self._notice(
                    now,
                    server,
                    idle_notice_text(
                        server.label,
                        self._group_name(server),
                        reading.signal,
                        stop_at.timestamp(),
                        self.notice_period,
                    ),
                    "idle",
                    stop_at,
                )
                continue
            if now < warning.stop_at:
                continue
            if not warning.stop_announced:
                warning.stop_announced = True
                self._notice(
                    now,
                    server,
                    idle_stop_text(
                        server.label, self._group_name(server), reading.signal, self.notice_period
                    ),
                    "idle_stop",
                )
            error = await self.stop(server.user, server.name, "idle", candidate.pod)
            if error:
                errors.append(error)
            else:
                stopped += 1
        # warnings of servers gone (stopped, or restarted since) are done with
        for key in set(self.warned) - seen:
            del self.warned[key]
        coverage = None
        if self.prometheus is not None and readings is not None:
            coverage = self._coverage(judged, without_series)
        self.coverage = coverage
        if failure is not None:
            raise failure
        problem = coverage.problem() if coverage is not None else None
        if errors:
            also = f" (and {coverage.summary})" if problem and coverage else ""
            raise RuntimeError(f"{len(errors)} idle stop(s) failed; first: {errors[0]}{also}")
        if problem:
            raise NoDCGMSeries(problem)
        unknown = ""
        if without_series:
            unknown = f", {len(without_series)} without DCGM series (left alone)"
        return (
            f"{len(chosen)} server(s) checked{unknown}, {warned} warned, {stopped} stopped, "
            f"{len(self.warned)} awaiting their stop"
        )

    def _coverage(self, judged: int, without_series: list[Candidate]) -> Coverage:
        bound = self.state.cluster_pods or {}
        nodes = {
            node
            for c in without_series
            if (node := ((bound.get(c.pod.key) or {}).get("spec") or {}).get("nodeName"))
        }
        return Coverage(
            judged=judged,
            without_series=tuple(sorted(c.pod.key for c in without_series)),
            nodes=tuple(sorted(nodes)),
        )

    def _group_name(self, server: Server) -> str:
        group = self.policy.find_group(server.group)
        return group.display_name if group is not None else server.group or ""

    def _notice(
        self, now: datetime, server: Server, text: str, kind: str, stop_at: datetime | None = None
    ) -> None:
        self.state.notice(
            Notice(
                at=now,
                text=text,
                group=server.group,
                user=server.user,
                server=server.name,
                kind=kind,
                stop_at=stop_at,
            )
        )


# ---- what users are told ------------------------------------------------------------


def idle_notice_text(server: str, group: str, signal: str, stop_at: float, notice: float) -> str:
    """The notice of a server found idle: why, and when it stops unless used."""
    return (
        f"{server}'s server in {group} is idle: {signal}; it stops at "
        f"{words.moment(stop_at)}, in {words.duration(notice)}, unless it is used"
    )


def idle_cancelled_text(server: str, group: str) -> str:
    """A server told it is idle that is in use again."""
    return f"{server}'s server in {group} is in use again: it will not be stopped"


def idle_stop_text(server: str, group: str, signal: str, notice: float) -> str:
    """The notice of a server stopped for idling, its notice over."""
    return (
        f"Stopping {server}'s server in {group}: still idle {words.duration(notice)} after "
        f"the notice; {signal}"
    )
