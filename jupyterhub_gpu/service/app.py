"""``jupyterhub-gpu-service``: the hub-managed service at ``/services/gpu/``.

It reads the hub's policy where the hub reads it (in a z2jh hub pod the chart
values through the chart's ``z2jh`` helper, elsewhere the hub's config file), so
``hub.config.GPUPolicy`` is one policy for hub and service. It watches
Kubernetes (server pods for usage; nodes and bound pods for capacity), polls the
hub's REST API for servers, applies the runtime rules, checks that the claims
the groups' datasets name exist, and serves the views.
See docs/service.md for the z2jh configuration, the scopes and the RBAC.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth
from jupyterhub.utils import url_path_join
from kubernetes_asyncio import client
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import default
from traitlets.config import Application

from ..accounting.events import BudgetToldStore, EventStore
from ..accounting.store import UsageStore
from ..config import service_settings
from ..config.policy import GPUPolicy
from ..config.values import service_setting_errors, spawner_setting
from ..core.adoption import DEFAULT_COMPONENT
from ..core.datasets import needed_claims
from ..core.model import PolicyError, hub_namespace_errors
from ..kube.client import api_client, in_cluster_namespace
from ..kube.leader import LeaseElector, LeaseTimings
from ..kube.reconciler import ReconcilePasses, Reconciler
from ..kube.reflector import Reflector
from . import handlers, metrics
from .acting import ACTING_TASKS, Acting, ReplicaCollector, StopsWithoutHub
from .app_views import ServiceViews
from .budget_rules import BudgetRule
from .datasets import DatasetClaims, claim_reader
from .gpu_time import GPUTime
from .hubapi import HubAPI, HubAPIError, HubUnreachable
from .idle import IdleServers, Prometheus
from .orphans import OrphanPods
from .readers import HistoryReads, enforcement_first
from .runtime_rules import RuntimeRules, not_the_judged_server
from .server_events import ServerEvents
from .server_status import server_status
from .startup import default_config_file, listen_address, read_hub_config
from .state import ServerPod, ServiceState
from .tasks import BackgroundTask
from .views import CachedUsage


class GPUService(ServiceViews, Application, service_settings.GPUService):
    """The service: its settings (``hub.config.GPUService``) are declared in
    ``jupyterhub_gpu.config.service_settings``, so the hub's configuration checks know
    them without importing the service."""

    name = "jupyterhub-gpu-service"
    description = "The jupyterhub-gpu hub service: usage views, runtime rules, capacity."

    aliases = {"config": "GPUService.config_file", "log-level": "Application.log_level"}

    @default("config_file")
    def _default_config_file(self) -> str:
        return default_config_file()

    @default("log_level")
    def _default_log_level(self) -> int:
        # what it did at start-up and each reconcile write belong in the hub's log
        return logging.INFO

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        path = Path(self.config_file)
        if not path.exists():
            raise SystemExit(
                f"jupyterhub-gpu-service: the hub's config file {path} does not exist; "
                "pass --config PATH (the hub's jupyterhub_config.py)"
            )
        self.policy_source = self.load_hub_config(path)
        unknown = service_setting_errors(self.config)
        if unknown:
            raise SystemExit("jupyterhub-gpu-service: " + "\n".join(unknown))
        try:
            self.policy = GPUPolicy(config=self.config).model
        except PolicyError as e:
            raise SystemExit(f"jupyterhub-gpu-service: the GPU policy is invalid:\n{e}") from None
        if not self.namespace:
            self.namespace = (
                spawner_setting(self.config, "namespace")
                or os.environ.get("POD_NAMESPACE")
                or in_cluster_namespace()
                or "default"
            )
        if errors := hub_namespace_errors(self.policy, self.namespace):
            raise SystemExit(
                "jupyterhub-gpu-service: the GPU policy is invalid:\n" + "\n".join(errors)
            )
        self.state = ServiceState(
            self.policy,
            hub_namespace=self.namespace,
            component=spawner_setting(self.config, "component_label") or DEFAULT_COMPONENT,
        )
        self.tasks: dict[str, BackgroundTask] = {}
        if self.form == "deployment" and (errors := self.lease_timings().errors()):
            raise SystemExit("jupyterhub-gpu-service: hub.config.GPUService: " + "; ".join(errors))
        #: whether this replica acts (always, in the hub's pod; the Lease's leader, in a
        #: Deployment: set up with Kubernetes)
        self.acting = Acting(None, self.tasks)
        self.stops_without_hub = StopsWithoutHub(
            self.stop_without_hub,
            self._delete_pod,
            lambda uid, at: self.gpu_time.backlog.add(uid, end=at),
        )
        self.registry, self.stopped_counter = metrics.registry(self.policy, self.snapshot)
        self.registry.register(ReplicaCollector(self.acting, self.stops_without_hub))
        self.runtime_rules = RuntimeRules(
            self.policy, self.state, self._stop, self.stop_over_limit_after
        )
        self.idle_servers = IdleServers(
            self.policy,
            self.state,
            self._stop,
            Prometheus(self.prometheus_url) if self.prometheus_url else None,
            self.idle_notice,
        )
        self._reconcile_passes: ReconcilePasses | None = None
        # at most this many stop requests to the hub at once
        self._stops = asyncio.Semaphore(10)
        #: (pod uid, reason) of the stops not sent because the server changed, told once
        self._skips_told: set[tuple[str, str]] = set()
        #: the stops counted (the server's pod, and the reason): a rule asks again at each
        #: run while the hub is still stopping the server, and that is one stop
        self._stops_counted: set[tuple[str, str]] = set()
        self.service_prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu/")
        # the hub's pages are beside the service's: <base_url>hub/ and <base_url>services/gpu/
        self.hub_prefix = self.service_prefix.rpartition("services/")[0] + "hub/"
        self.usage = CachedUsage(self.policy)
        settings = GPUPolicy(config=self.config)
        self.gpu_time = GPUTime(
            self.policy,
            self.state,
            UsageStore(settings.accounting_url),
            fail_open=settings.accounting_fail_open,
            prometheus=self.idle_servers.prometheus,
            billing_timezone=self.billing_timezone,
            utilisation_refresh=self.utilisation_refresh,
        )
        # a replica that does not act writes nothing, even a write begun while it did
        self.gpu_time.store.fence = self.acting.why_not
        # users' reads (history, charts, showback of older months) on threads and
        # database connections of their own: enforcement never waits behind them
        self.readers = ThreadPoolExecutor(
            max_workers=self.history_total, thread_name_prefix="jupyterhub-gpu-readers"
        )
        self.gpu_time.readers = self.readers
        self.gpu_time.months.emissions_factor = self.emissions_factor
        self.gpu_time.reader_store = UsageStore(settings.accounting_url)
        self.history_reads = HistoryReads(
            self.gpu_time,
            self.readers,
            self.gpu_time.reader_store,
            per_user=self.history_per_user,
            total=self.history_total,
            timeout=self.history_timeout,
        )
        #: each server's notices and last stop, kept in the usage database
        events = EventStore(self.gpu_time.store)
        self.server_events = ServerEvents(self.policy, events)
        self.last_stops = self.server_events.last_stops
        self.state.on_notice = self.server_events.notice
        self.state.on_pod_gone = self.server_events.pod_ended
        # what servers were told of used-up budgets is kept beside their notices
        self.budget_rule = BudgetRule(
            self.policy, self.state, self.gpu_time, self._stop, BudgetToldStore(events)
        )
        self.orphan_pods = OrphanPods(
            self.state, self._delete_pod, self.orphan_grace, dry_run=self.reconcile_dry_run
        )
        #: the claims the groups' datasets need, read once Kubernetes is set up
        self.dataset_claims = DatasetClaims(self.policy, self.namespace, read=None)
        self.acting.on_started.append(self.server_events.reload)
        self.acting.on_stopped.append(lambda why: self.gpu_time.forget_unwritten())
        self.acting.on_stopped.append(lambda why: self.server_events.forget_unwritten())

    def lease_timings(self) -> LeaseTimings:
        return LeaseTimings(self.lease_duration, self.lease_renew_deadline, self.lease_retry_period)

    def load_hub_config(self, path: Path) -> str:
        """Read the hub's config into ``self.config``; where the policy came from, in words.

        The command line wins over what the file or the chart values say.
        """
        loaded, source = read_hub_config(path)
        loaded.merge(self.cli_config)
        self.update_config(loaded)
        return source

    # ---- background tasks ----------------------------------------------------------

    def add_periodic(
        self, name: str, job: Callable[[], Any], interval: float, *, forever: bool = False
    ) -> BackgroundTask:
        """Run ``job`` every ``interval`` s with backoff; its status shows on the page."""
        task = BackgroundTask(name, job, interval, self.max_backoff, forever=forever)
        self.tasks[name] = task
        if getattr(self, "_running", False) and (name not in ACTING_TASKS or self.acting()):
            task.start()
        return task

    def make_reflectors(self, core: client.CoreV1Api | None) -> list[Reflector]:
        """The three watches, wired to the state (``core`` None: fed by hand, as in tests)."""
        state = self.state
        list_servers: Callable[..., Any] | None
        if core is None:
            list_servers = None
        elif self.policy.namespace_per_group:
            # servers live in a namespace per group: one cluster-wide watch
            list_servers = core.list_pod_for_all_namespaces
        else:
            list_servers = functools.partial(core.list_namespaced_pod, self.namespace)
        return state.watches(list_servers, core, watch_timeout=self.watch_timeout)

    async def _setup_kubernetes(self) -> None:
        self.kube = await api_client()
        for reflector in self.make_reflectors(client.CoreV1Api(self.kube)):
            name = f"watch {reflector.what}"
            self.add_periodic(name, self._watcher(reflector, name), 2.0, forever=True)

    def _watcher(self, reflector: Reflector, task_name: str) -> Callable[[], Any]:
        async def job() -> str:
            return await reflector.run(self.tasks[task_name])

        return job

    async def poll_hub(self) -> str:
        asked = time.time()
        answer = await self.hub.servers()
        self.state.set_user_groups(answer.groups)
        self.state.set_servers(answer.servers, answer.complete)
        self.state.servers_asked_at = asked
        if not answer.complete:
            raise RuntimeError(
                "the hub answered without users' servers: the service's role needs "
                "read:servers (orphaned pods are not looked for until it has it)"
            )
        # the hub answers: a stop due now goes through it at its rule's next run
        self.stops_without_hub.waiting.clear()
        told = await self.stops_without_hub.tell_hub(self.hub) if self.acting() else None
        return f"{len(answer.servers)} servers" + (f"; {told}" if told else "")

    async def gpu_time_pass(self) -> str:
        """The acting replica writes what the pods show and reads it back; the others
        read what it wrote (their dashboards and APIs show the same hours)."""
        if self.acting():
            return await self.gpu_time.record()
        await self.gpu_time.read()
        return self.acting.following()

    async def server_events_pass(self) -> str:
        if self.acting():
            return await self.server_events.run()
        return f"{self.acting.following()}; {await self.server_events.follow()}"

    async def budgets_pass(self) -> str:
        """The acting replica tells and stops; the others read what servers were told
        (each server's scheduled stop, as its JupyterLab asks any replica)."""
        if self.acting():
            return await self.budget_rule.run()
        return f"{self.acting.following()}; {await self.budget_rule.follow()}"

    async def find_orphans(self) -> str:
        """Report server pods no hub server owns; delete them after ``orphan_grace``."""
        return await self.orphan_pods.run()

    async def _delete_pod(self, namespace: str, name: str, uid: str) -> str | None:
        """Delete a pod if it is still the one found (its uid); the error in words."""
        if why := self.acting.why_not():
            return f"pod {namespace}/{name} not deleted: {why}"
        try:
            await client.CoreV1Api(self.kube).delete_namespaced_pod(
                name,
                namespace,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
            )
        except client.ApiException as e:
            if e.status in (404, 409):  # gone, or a newer pod has the name now
                return None
            return f"deleting pod {namespace}/{name}: {e.status} {e.reason}"
        return None

    async def apply_rules(self) -> str:
        """Stop servers past ``max_runtime``; report (optionally stop) groups over limit."""
        return await self.runtime_rules.run(datetime.now(UTC))

    async def reclaim_idle(self) -> str:
        """Warn idle GPU servers, stop those still idle after ``idle_notice``."""
        return await self.idle_servers.run(datetime.now(UTC))

    async def _stop(
        self, user: str, name: str, reason: str, pod: ServerPod | None = None
    ) -> str | None:
        """Ask the hub to stop a server; the error in words, or None when done. With
        the ``pod`` the rule judged, only if the hub's server is still the one that
        made it (``not_the_judged_server``); a stop not sent is logged with why."""
        if why := self.acting.why_not():
            return f"{user}/{name} not stopped: {why}"
        async with self._stops:
            running = self.state.pod_of(user, name)
            try:
                if pod is not None and (why := await self._not_judged(user, name, pod)):
                    self._skipped_stop(user, name, reason, pod, why)
                    return None
                self.server_events.stopping(user, name, reason, running and running.uid)
                await self.hub.stop_server(user, name)
            except HubUnreachable as e:
                self.server_events.not_stopped(user, name)
                # the pod the rule judged, else the server's pod as the watch holds it
                target = pod or running
                if target is not None:
                    self.server_events.stopping(user, name, reason, target.uid)
                deleted, error = await self.stops_without_hub.stop(user, name, reason, target, e)
                if not deleted:
                    self.server_events.not_stopped(user, name)
                    return error
            except HubAPIError as e:
                self.server_events.not_stopped(user, name)
                if e.status == 404:  # already gone: nothing to do
                    self.stops_without_hub.done(user, name)
                    return None
                return str(e)
        self.stops_without_hub.done(user, name)
        self._count_stop(user, name, reason, pod or running)
        self.server_events.stopped(user, name)
        return None

    def _count_stop(self, user: str, name: str, reason: str, pod: ServerPod | None) -> None:
        """``servers_stopped_total`` counts each server's stop once, however often the
        rule asked the hub for it while the server was stopping."""
        counted = (pod.uid or pod.key if pod is not None else f"{user}/{name}", reason)
        if counted in self._stops_counted:
            return
        if len(self._stops_counted) > 10_000:
            self._stops_counted.clear()
        self._stops_counted.add(counted)
        self.stopped_counter.labels(reason).inc()

    async def _not_judged(self, user: str, name: str, pod: ServerPod) -> str | None:
        """Why the user's server now is not the one whose pod was judged, or None."""
        # the service's own view only counts while its watch holds (else it may be behind)
        state = self.state
        current = state.server_pods if state.server_pods_behind_since is None else None
        return not_the_judged_server(await self.hub.server(user, name), pod, current)

    def _skipped_stop(self, user: str, name: str, reason: str, pod: ServerPod, why: str) -> None:
        """Logged once per judged pod and reason (a rule judges again at every run)."""
        said = (pod.uid or pod.key, reason)
        level = logging.DEBUG if said in self._skips_told else logging.WARNING
        self._skips_told.add(said)
        if len(self._skips_told) > 10_000:
            self._skips_told = {said}
        label = f"{user}/{name}" if name else user
        self.log.log(level, "Not stopping %s's server (%s): %s", label, reason, why)

    def server_status(self, user: str, name: str) -> dict[str, Any]:
        """One server's GPU, budgets, quota use, scheduled stops and notices."""
        return server_status(self, user, name, datetime.now(UTC), self.last_stops.get((user, name)))

    async def reconcile(self) -> str:
        """One reconcile pass; a pass with errors raises, so it is retried with backoff."""
        if self._reconcile_passes is None:
            self._reconcile_passes = ReconcilePasses(
                Reconciler(
                    self.kube,
                    hub_namespace=self.namespace,
                    prune_namespaces=self.prune_namespaces,
                    dry_run=self.reconcile_dry_run,
                ),
                self.log,
            )
        return await self._reconcile_passes.run(self.policy)

    # ---- the web app ---------------------------------------------------------------

    def make_app(self) -> web.Application:
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpu/")
        self.hub_auth = HubOAuth.instance(
            api_token=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
            cache_max_age=self.auth_cache_max_age,
        )
        routes = [
            (prefix, handlers.PageHandler),
            (url_path_join(prefix, "api/usage"), handlers.UsageHandler),
            (url_path_join(prefix, "api/capacity"), handlers.CapacityHandler),
            (url_path_join(prefix, "api/history"), handlers.HistoryHandler),
            (url_path_join(prefix, "api/showback"), handlers.ShowbackHandler),
            (url_path_join(prefix, "api/invoice"), handlers.InvoiceHandler),
            (url_path_join(prefix, "invoice"), handlers.InvoicePageHandler),
            (url_path_join(prefix, r"api/servers/([^/]+)/?([^/]*)"), handlers.ServerStatusHandler),
            (url_path_join(prefix, "metrics"), handlers.MetricsHandler),
            (url_path_join(prefix, "oauth_callback"), handlers.OAuthCallbackHandler),
            (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        ]
        return web.Application(
            routes,
            service=self,
            hub_auth=self.hub_auth,
            # cookies only carry the OAuth session; a restart just re-runs OAuth
            cookie_secret=os.urandom(32),
            log_function=handlers.log_request,
        )

    async def start_async(self) -> None:
        # the pass, the rules and the server events do their database work on the
        # default executor: theirs alone (every reader has its own, ``readers``)
        enforcement_first(
            asyncio.get_running_loop(),
            ThreadPoolExecutor(
                max_workers=self.enforcement_threads,
                thread_name_prefix="jupyterhub-gpu-enforcement",
            ),
        )
        self.hub = HubAPI(
            os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
            os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        )
        await self._setup_kubernetes()
        self.add_periodic("hub servers", self.poll_hub, self.hub_poll_interval)
        self.add_periodic("runtime rules", self.apply_rules, self.rules_interval)
        self.add_periodic("orphaned pods", self.find_orphans, self.rules_interval)
        self.add_periodic("GPU time", self.gpu_time_pass, self.usage_interval)
        self.add_periodic("GPU budgets", self.budgets_pass, self.usage_interval)
        self.add_periodic("server events", self.server_events_pass, self.rules_interval)
        if self.idle_servers.active:
            self.add_periodic("idle servers", self.reclaim_idle, self.rules_interval)
        if self.reconcile_interval > 0:
            self.add_periodic("reconcile", self.reconcile, self.reconcile_interval)
        if needed_claims(self.policy, self.namespace):
            self.dataset_claims.read = claim_reader(self.kube)
            self.add_periodic("dataset claims", self.dataset_claims.run, self.datasets_interval)
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        server = HTTPServer(self.make_app(), xheaders=True)
        server.listen(url.port or 80, self.ip or listen_address(url.hostname))
        self._running = True
        elector = self._elect()
        for name, task in self.tasks.items():
            if name not in ACTING_TASKS or self.acting():
                task.start()
        election = asyncio.create_task(elector.run()) if elector is not None else None
        self.log.info(
            "jupyterhub-gpu-service on %s, policy from %s, namespace %s, %d groups",
            url.geturl(),
            self.policy_source,
            self.namespace,
            len(self.policy.groups),
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.stop()
        for task in self.tasks.values():
            await task.stop()
        if elector is not None and election is not None:
            election.cancel()
            await asyncio.gather(election, return_exceptions=True)
            # give the Lease up: the other replica takes it at its next retry
            await elector.release()
        await self.kube.close()

    def _elect(self) -> LeaseElector | None:
        """In a Deployment, this replica's candidacy for the Lease (it acts only while it
        leads); in the hub's pod, none: the one process acts."""
        if self.form != "deployment":
            return None
        elector = LeaseElector(
            self.kube,
            self.namespace,
            self.deployment_name,
            self.lease_timings(),
            on_started=self.acting.started,
            on_stopped=self.acting.stopped,
        )
        self.acting.elector = elector
        self.acting.standing_by()
        return elector

    def start(self) -> None:
        asyncio.run(self.start_async())


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s"
    )
    app = GPUService.instance()
    app.initialize(argv)
    app.start()
