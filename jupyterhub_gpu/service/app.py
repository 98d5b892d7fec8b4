"""``jupyterhub-gpu-service``: the hub-managed service at ``/services/gpu/``.

It reads the hub's policy where the hub reads it (in a z2jh hub pod the chart
values through the chart's ``z2jh`` helper, elsewhere the hub's config file), so
``hub.config.GPUPolicy`` is one policy for hub and service. It watches
Kubernetes (server pods for usage; nodes and bound pods for capacity), polls the
hub's REST API for servers, applies the runtime rules, and serves the views.
See docs/service.md for the z2jh configuration, the scopes and the RBAC.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import json
import logging
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth
from jupyterhub.utils import url_path_join
from kubernetes_asyncio import client
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import Bool, Float, Int, Unicode, default
from traitlets.config import Application

from ..config.hubconfig import config_from_z2jh_values
from ..config.policy import GPUPolicy
from ..config.values import ValuesError, service_setting_errors
from ..core.model import PolicyError
from ..core.quantities import format_duration, format_gpus
from ..core.shaping import GROUP_LABEL
from ..kube.client import api_client, in_cluster_namespace
from ..kube.clusterview import BOUND_PODS
from ..kube.reconciler import Reconciler
from ..kube.reflector import Reflector, slim_node, slim_pod
from . import handlers, metrics, rules
from .hubapi import HubAPI, HubAPIError
from .state import ServiceState, server_pod
from .tasks import BackgroundTask
from .views import Notice, Viewer, usage_view

#: where z2jh mounts the hub's config in the hub container
Z2JH_CONFIG = "/usr/local/etc/jupyterhub/jupyterhub_config.py"
#: everything the hub (and so this service) is told about by an admin
ALL_SEEING = Viewer(name="", admin=True)


def default_config_file() -> str:
    """``$JUPYTERHUB_GPU_CONFIG``, else z2jh's hub config, else ./jupyterhub_config.py."""
    if os.environ.get("JUPYTERHUB_GPU_CONFIG"):
        return os.environ["JUPYTERHUB_GPU_CONFIG"]
    if Path(Z2JH_CONFIG).exists():
        return Z2JH_CONFIG
    return "jupyterhub_config.py"


def z2jh_helper(path: Path) -> ModuleType:
    """The chart's ``z2jh`` helper module, loaded from ``path`` itself.

    Not ``import z2jh``: that would take whichever ``z2jh`` is imported already
    or comes first on the path, not the one beside the hub's config.
    """
    spec = importlib.util.spec_from_file_location("z2jh", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"jupyterhub-gpu-service: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _raised_by_environ(error: KeyError) -> bool:
    """True when the KeyError is ``os.environ[name]`` of a variable that is not set."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    # the frame that raised is os._Environ's (its file may be "<frozen os>")
    return tb is not None and tb.tb_frame.f_globals.get("__name__") == "os"


def listen_address(host: str | None) -> str:
    """Where to listen for a service URL's host (see ``GPUService.ip``)."""
    if not host or host == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return ""  # a name others resolve to this pod: every interface
    return host


class GPUService(Application):
    name = "jupyterhub-gpu-service"
    description = "The jupyterhub-gpu hub service: usage views, runtime rules, capacity."

    aliases = {"config": "GPUService.config_file", "log-level": "Application.log_level"}

    config_file = Unicode(
        help="""
        The hub's config file, where the service finds ``GPUPolicy`` (the same
        policy as the hub's) and its own ``GPUService`` settings. Default:
        ``$JUPYTERHUB_GPU_CONFIG``, else z2jh's
        ``/usr/local/etc/jupyterhub/jupyterhub_config.py``, else
        ``jupyterhub_config.py`` in the working directory.

        In a z2jh hub pod (the file's folder holds the chart's ``z2jh.py``) the
        service does not run that file, which needs the pod's Kubernetes Service
        variables a hub-managed service does not inherit: it reads
        ``hub.config.GPUPolicy``, ``hub.config.GPUService`` and
        ``hub.config.KubeSpawner`` from the chart values, as the hub's start-up
        check does. Elsewhere it loads the file; a file that fails to load
        stops the service.
        """,
    ).tag(config=True)

    @default("config_file")
    def _default_config_file(self) -> str:
        return default_config_file()

    @default("log_level")
    def _default_log_level(self) -> int:
        # what it did at start-up and each reconcile write belong in the hub's log
        return logging.INFO

    namespace = Unicode(
        "",
        help="""
        The namespace the hub spawns servers in. Default:
        ``KubeSpawner.namespace`` from the hub's config (z2jh:
        ``hub.config.KubeSpawner.namespace``), else ``$POD_NAMESPACE``, else the
        service account's namespace (in the hub pod), else ``default``.
        """,
    ).tag(config=True)

    hub_poll_interval = Float(5.0, help="Seconds between reads of the hub's server list.").tag(
        config=True
    )

    rules_interval = Float(
        30.0,
        help="""
        Seconds between runs of the runtime rules (``max_runtime`` stops and the
        over-limit report). A server is stopped at most this long after its
        ``max_runtime``.
        """,
    ).tag(config=True)

    reconcile_interval = Float(
        60.0,
        help="""
        Seconds between reconcile passes (0: never): the namespaces, quotas,
        network policies, priority classes, scheduler queues and DRA claim
        templates the policy implies are created, updated when they drift, and
        pruned when the policy drops them (``jupyterhub_gpu.kube.reconciler``; the same
        objects as ``jupyterhub-gpu manifests``). A pass that changes nothing
        writes nothing. Errors (a missing CRD, missing RBAC) show under *Service
        health* and are retried with backoff.
        """,
    ).tag(config=True)

    prune_namespaces = Bool(
        False,
        help="""
        Delete the namespace of a group the policy no longer has
        (``namespace_per_group``). Off by default: such a namespace is kept and
        reported on the page and in the log, while the objects the service made
        in it (quota, limit range, network policy, ...) are pruned. Even when on,
        a namespace that still holds pods is never deleted: it is reported, and
        deleted by a later pass once its servers are gone.
        """,
    ).tag(config=True)

    reconcile_dry_run = Bool(
        False,
        help="""
        Reconcile without writing: each pass logs every object it would create,
        update or prune, and changes nothing in the cluster. Turn it on for the
        first start of the service on a cluster that already has objects, read
        the log, then turn it off.
        """,
    ).tag(config=True)

    hub_service_account = Unicode(
        "hub",
        help="""
        The hub's Kubernetes service account (z2jh: ``hub``), bound in each group
        namespace so the hub can spawn there when ``namespace_per_group`` is on.
        """,
    ).tag(config=True)

    max_backoff = Float(
        300.0,
        help="""
        Longest wait, in seconds, between retries of a failing task (API
        errors, conflicts, missing permissions); retries start at the task's
        interval and double.
        """,
    ).tag(config=True)

    stop_over_limit_after = Float(
        None,
        allow_none=True,
        help="""
        Stop servers of a group that stays over its limit (e.g. after the
        policy lowered it) for this many seconds, youngest first, until the
        group fits. ``None`` (the default): only report them on the page, in
        the log and in metrics.
        """,
    ).tag(config=True)

    metrics_require_auth = Bool(
        True,
        help="""
        Require a hub token with the ``read:metrics`` scope for ``metrics``
        (the scope the hub's own /hub/metrics uses with
        ``JupyterHub.authenticate_prometheus``): give Prometheus the token of a
        service whose role has ``read:metrics``. ``False``: anyone who can
        reach the service may read the per-group numbers.
        """,
    ).tag(config=True)

    ip = Unicode(
        "",
        help="""
        The address to listen on. Default: the host of
        ``$JUPYTERHUB_SERVICE_URL`` (the service's ``url``) when it is an IP
        address or ``localhost``; otherwise (z2jh's ``http://hub:10101``, a
        Kubernetes Service name the proxy pod connects to) all interfaces.
        """,
    ).tag(config=True)

    auth_cache_max_age = Int(
        30,
        help="""
        Seconds the service trusts what the hub said about a user's token (their
        name, admin flag and groups) before asking again. A user an admin removes
        from a group stops seeing that group's usage within this time.
        JupyterHub's own default for services is 300 seconds.
        """,
    ).tag(config=True)

    watch_timeout = Int(300, help="Seconds a Kubernetes watch runs before it is renewed.").tag(
        config=True
    )

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
                self.config.get("KubeSpawner", {}).get("namespace")
                or os.environ.get("POD_NAMESPACE")
                or in_cluster_namespace()
                or "default"
            )
        self.state = ServiceState(self.policy)
        self.tasks: dict[str, BackgroundTask] = {}
        self.registry, self.stopped_counter = metrics.registry(lambda: self.view(ALL_SEEING))
        self._over_limit_since: dict[str, datetime] = {}
        # servers whose max_runtime stop was announced (user, name, started)
        self._announced: set[tuple[str, str, datetime | None]] = set()
        self._announced_pods: set[str] = set()
        self._reconciler: Reconciler | None = None
        self._last_reconcile = ""
        # at most this many stop requests to the hub at once
        self._stops = asyncio.Semaphore(10)
        # group name -> (what the view is made of, view); -> (view, its JSON)
        self._group_cache: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._group_json: dict[str, tuple[dict[str, Any], str]] = {}

    def load_hub_config(self, path: Path) -> str:
        """Read the hub's config into ``self.config``; where the policy came from, in words.

        Never an empty policy in place of the hub's: a config that cannot be read
        stops the service (a service without the policy would prune what the
        policy created).
        """
        folder = path.parent.resolve()
        if (folder / "z2jh.py").exists():
            # a z2jh hub pod: the chart's helper beside the config reads the mounted values
            try:
                values = config_from_z2jh_values(z2jh_helper(folder / "z2jh.py").get_config)
            except ValuesError as e:
                raise SystemExit(f"jupyterhub-gpu-service: {e}") from None
            if "GPUPolicy" not in values:
                raise SystemExit(
                    f"jupyterhub-gpu-service: the chart values, read by {folder / 'z2jh.py'}, "
                    "have no hub.config.GPUPolicy; the service serves the hub's GPU policy and "
                    "does not run without one: set hub.config.GPUPolicy (or check that the "
                    "hub's values Secret is mounted in the hub pod)"
                )
            values.merge(self.cli_config)  # the command line wins, as over a config file
            self.update_config(values)
            return "the chart values (hub.config)"
        if "POD_NAMESPACE" not in os.environ and in_cluster_namespace():
            # a hub config may read it (z2jh's does); a managed service does not inherit it
            os.environ["POD_NAMESPACE"] = in_cluster_namespace() or ""
        self.raise_config_file_errors = True
        try:
            self.load_config_file(path.name, path=str(folder))
        except Exception as e:
            if isinstance(e, KeyError) and _raised_by_environ(e):
                raise SystemExit(
                    f"jupyterhub-gpu-service: the hub's config file {path} failed to load: "
                    f"the environment variable {e} is not set. A hub-managed service gets only "
                    "JupyterHub's variables: pass it in the service's `environment` "
                    "(c.JupyterHub.services)"
                ) from None
            raise SystemExit(
                f"jupyterhub-gpu-service: the hub's config file {path} failed to load: "
                f"{type(e).__name__}: {e}"
            ) from None
        if "GPUPolicy" not in self.config:
            raise SystemExit(
                f"jupyterhub-gpu-service: the hub's config file {path} sets no GPUPolicy; the "
                "service serves the hub's GPU policy and does not run without one: pass the "
                "hub's own config file (--config PATH or $JUPYTERHUB_GPU_CONFIG)"
            )
        return str(path)

    # ---- views ---------------------------------------------------------------------

    def task_statuses(self) -> list[dict[str, Any]]:
        return [t.status.to_json() for t in self.tasks.values()]

    def view(self, viewer: Viewer, **paging: int) -> dict[str, Any]:
        snapshot = self.state.snapshot(self.task_statuses())
        return usage_view(
            self.policy,
            snapshot,
            viewer,
            datetime.now(UTC),
            group_cache=self._group_cache,
            **paging,
        )

    def view_json(self, viewer: Viewer, **paging: int) -> str:
        """``view`` as JSON, each group's part encoded once per change of that group.

        An admin's view of 500 groups is mostly group views, the same for every
        viewer until the group changes; encoding each once takes most of the
        cost out of repeated requests.
        """
        view = self.view(viewer, **paging)
        groups = view.pop("groups")
        parts = []
        for group in groups:
            cached = self._group_json.get(group["name"])
            if cached is None or cached[0] is not group:
                cached = self._group_json[group["name"]] = (group, json.dumps(group))
            parts.append(cached[1])
        rest = json.dumps(view)
        return f'{rest[:-1]}, "groups": [{",".join(parts)}]}}'

    # ---- background tasks ----------------------------------------------------------

    def add_periodic(
        self, name: str, job: Callable[[], Any], interval: float, *, forever: bool = False
    ) -> BackgroundTask:
        """Run ``job`` every ``interval`` s with backoff; its status shows on the page."""
        task = BackgroundTask(name, job, interval, self.max_backoff, forever=forever)
        self.tasks[name] = task
        if getattr(self, "_running", False):
            task.start()
        return task

    def make_reflectors(self, core: client.CoreV1Api | None) -> list[Reflector]:
        """The three watches, wired to the state (``core`` None: fed by hand, as in tests)."""
        state = self.state

        def call(name: str) -> Callable[..., Any] | None:
            return getattr(core, name) if core is not None else None

        if self.policy.namespace_per_group:
            # servers live in a namespace per group: one cluster-wide watch
            list_servers = call("list_pod_for_all_namespaces")
        else:

            def list_servers(**kw: Any) -> Any:
                assert core is not None
                return core.list_namespaced_pod(self.namespace, **kw)

        return [
            Reflector(
                "server pods",
                list_servers,
                transform=server_pod,
                on_change=lambda r: state.server_pods_listed(r.items),
                on_event=state.server_pod_event,
                watch_timeout=self.watch_timeout,
                label_selector=GROUP_LABEL,
            ),
            Reflector(
                "nodes",
                call("list_node"),
                transform=slim_node,
                on_change=lambda r: state.nodes_changed(r.items),
                watch_timeout=self.watch_timeout,
            ),
            Reflector(
                "bound pods",
                call("list_pod_for_all_namespaces"),
                transform=slim_pod,
                on_change=lambda r: state.bound_pods_listed(r.items),
                on_event=state.bound_pod_event,
                watch_timeout=self.watch_timeout,
                # capacity needs what is bound to a node and not finished, in any namespace
                field_selector=BOUND_PODS,
            ),
        ]

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
        servers = await self.hub.servers()
        self.state.set_servers(servers)
        return f"{len(servers)} servers"

    async def apply_rules(self) -> str:
        """Stop servers past ``max_runtime``; report (optionally stop) groups over limit."""
        state = self.state
        if state.servers is None:
            raise RuntimeError("no server list from the hub yet (see the hub-servers task)")
        if state.server_pods is None:
            raise RuntimeError("server pods not listed yet (see the watch server pods task)")
        now = datetime.now(UTC)
        errors: list[str] = []
        stopped = 0
        overdue = rules.overdue(self.policy, state.servers, now)
        # say it once per server, when asking the hub to stop it: the hub may
        # finish the stop after this call returns, or after a retry
        current = {(s.user, s.name, s.started) for s, _ in overdue}
        self._announced &= current
        for server, limit in overdue:
            if (server.user, server.name, server.started) in self._announced:
                continue
            self._announced.add((server.user, server.name, server.started))
            runtime = int((now - server.started).total_seconds()) if server.started else 0
            state.notice(
                Notice(
                    at=now,
                    text=f"Stopping {server.label}'s server in {server.group}: it ran "
                    f"{runtime // 60}m {runtime % 60:02d}s, past the group's max_runtime of "
                    f"{format_duration(limit)}",
                    group=server.group,
                    user=server.user,
                )
            )
        results = await asyncio.gather(
            *(self._stop(s.user, s.name, "max_runtime") for s, _ in overdue)
        )
        errors += [r for r in results if r]
        stopped += sum(1 for r in results if r is None)
        over = rules.over_limit(self.policy, state.ledger)
        for group, reason in over.items():
            if group not in self._over_limit_since:
                self._over_limit_since[group] = now
                state.notice(Notice(at=now, text=f"Over limit: {reason}", group=group))
        for group in list(self._over_limit_since):
            if group not in over:
                del self._over_limit_since[group]
        state.set_over_limit(over)
        if self.stop_over_limit_after is not None:
            stopped += await self._stop_over_limit(now, errors)
        if errors:
            raise RuntimeError(f"{len(errors)} stop(s) failed; first: {errors[0]}")
        return f"{stopped} stopped, {len(over)} group(s) over limit"

    async def _stop(self, user: str, name: str, reason: str) -> str | None:
        """Ask the hub to stop a server; the error in words, or None when done."""
        async with self._stops:
            try:
                await self.hub.stop_server(user, name)
            except HubAPIError as e:
                if e.status == 404:  # already gone: nothing to do
                    return None
                return str(e)
        self.stopped_counter.labels(reason).inc()
        return None

    async def _stop_over_limit(self, now: datetime, errors: list[str]) -> int:
        state = self.state
        stopped = 0
        created = {k: p.created for k, p in (state.server_pods or {}).items() if p.created}
        for group, since in self._over_limit_since.items():
            if (now - since).total_seconds() < (self.stop_over_limit_after or 0):
                continue
            for charge in rules.to_stop_for_limit(self.policy, state.ledger, group, created):
                pod = (state.server_pods or {}).get(charge.key)
                if pod is None or pod.user is None:
                    continue
                if charge.key not in self._announced_pods:
                    self._announced_pods.add(charge.key)
                    grace = format_duration(int(self.stop_over_limit_after or 0))
                    state.notice(
                        Notice(
                            at=now,
                            text=f"Stopping {pod.user}'s server in {group} "
                            f"({format_gpus(charge.request.gpus)} GPUs): the group stayed over "
                            f"its limit for {grace}",
                            group=group,
                            user=pod.user,
                        )
                    )
                error = await self._stop(pod.user, pod.servername, "over_limit")
                if error:
                    errors.append(error)
                else:
                    stopped += 1
        return stopped

    async def reconcile(self) -> str:
        """One reconcile pass; a pass with errors raises, so it is retried with backoff."""
        if self._reconciler is None:
            self._reconciler = Reconciler(
                self.kube,
                hub_namespace=self.namespace,
                service_account=self.hub_service_account,
                prune_namespaces=self.prune_namespaces,
                dry_run=self.reconcile_dry_run,
            )
        report = await self._reconciler.reconcile(self.policy)
        if report.errors:
            raise RuntimeError(report.summary())
        summary = report.summary()
        # every pass that writes; a pass that keeps or would write, when that changes
        if report.writes or (not report.unchanged_only and summary != self._last_reconcile):
            self.log.info("reconcile: %s", summary)
        self._last_reconcile = summary
        return summary

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
        self.hub = HubAPI(
            os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
            os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        )
        await self._setup_kubernetes()
        self.add_periodic("hub servers", self.poll_hub, self.hub_poll_interval)
        self.add_periodic("runtime rules", self.apply_rules, self.rules_interval)
        if self.reconcile_interval > 0:
            self.add_periodic("reconcile", self.reconcile, self.reconcile_interval)
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        server = HTTPServer(self.make_app(), xheaders=True)
        server.listen(url.port or 80, self.ip or listen_address(url.hostname))
        self._running = True
        for task in self.tasks.values():
            task.start()
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
        await self.kube.close()

    def start(self) -> None:
        asyncio.run(self.start_async())


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s"
    )
    app = GPUService.instance()
    app.initialize(argv)
    app.start()
