"""``GPUService``: the settings of the hub service (``hub.config.GPUService``).

Declared here, beside ``GPUPolicy``, so that checking a hub's configuration
(``jupyterhub-gpu check``, the hub's start-up check) knows every setting of the
service without importing it; the service's application
(``jupyterhub_gpu.service.app.GPUService``) inherits them, and traitlets applies
the ``GPUService`` section to both. The service is a traitlets ``Application``:
its log settings (``log_level``, ...) are ``GPUService`` settings too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from traitlets import Bool, CaselessStrEnum, Dict, Float, Int, Unicode
from traitlets.config import Application, Configurable

#: what a server's own token (``Spawner.server_token_scopes``) needs beside JupyterHub's
#: defaults (its activity, access to itself): access to the GPU service, whose
#: ``api/servers/<user>/<name>`` then answers for that server alone
SERVER_TOKEN_SCOPES = [
    "users:activity!user",
    "access:servers!server",
    "access:services!service=gpu",
]
#: the variable a server's JupyterLab extension reads the service's URL from
SERVICE_URL_ENV = "JUPYTERHUB_GPU_SERVICE_URL"


def gpu_service_url(config: Any, name: str = "gpu") -> str:
    """Where servers reach the hub's service ``name``: its ``url`` and the hub's
    ``base_url`` (its prefix, ``<base_url>services/<name>/``); "" without one."""
    hub = config.JupyterHub if "JupyterHub" in config else {}
    services = hub.get("services") if "services" in hub else None
    for service in services if isinstance(services, list) else ():
        if isinstance(service, Mapping) and service.get("name") == name and service.get("url"):
            base = hub.get("base_url") if "base_url" in hub else "/"
            base = base if isinstance(base, str) and base else "/"
            prefix = "/".join(part for part in (base.strip("/"), "services", name) if part)
            return f"{str(service['url']).rstrip('/')}/{prefix}/"
    return ""


class GPUService(Configurable):
    """The service's own settings; how it runs is ``jupyterhub_gpu.service.app``."""

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

    namespace = Unicode(
        "",
        help="""
        The namespace the hub spawns servers in. Default:
        the spawner's namespace in the hub's config (``GPUKubeSpawner.namespace``,
        else ``KubeSpawner.namespace``; z2jh: ``hub.config.KubeSpawner.namespace``,
        which the chart sets), else ``$POD_NAMESPACE``, else the
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
        over-limit report) and of the idle rule. A server is stopped at most this
        long after its ``max_runtime``.
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
        No longer used: the service writes no RBAC. The RoleBindings that let the hub
        spawn in each group namespace are rendered by ``jupyterhub-gpu manifests
        --service-account`` and applied by the admin. Kept so existing values still load.
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

    prometheus_url = Unicode(
        "",
        help="""
        The Prometheus server that scrapes the NVIDIA DCGM exporter (the GPU
        Operator's ``dcgm-exporter``), e.g. ``http://prometheus-server.monitoring``
        or kube-prometheus-stack's
        ``http://kube-prometheus-stack-prometheus.monitoring:9090``. The idle
        rule (a group's ``idle: {after, gpu_utilization_below}``) asks it, through
        ``/api/v1/query``, for the GPU utilisation of each server's pod
        (``DCGM_FI_DEV_GPU_UTIL``; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` for MIG
        slices), by the ``namespace`` and ``pod`` labels dcgm-exporter adds
        (scrape it with ``honor_labels: true`` so they are kept as they are).

        Empty (the default): no GPU metrics; idle servers are found by the
        hub's record of notebook activity alone. When it is set and cannot be
        reached, servers judged by GPU utilisation are neither warned nor
        stopped, and the *idle servers* task shows the error. A server whose
        pod it has no series for is neither warned nor stopped either; when
        that is most of them, the task shows that as an error too.
        """,
    ).tag(config=True)

    idle_notice = Float(
        600.0,
        help="""
        Seconds between the notice that a server is idle (on the dashboard and in
        the log, with the time of the stop) and its stop. The server is stopped
        only if it is still idle then: use in between (GPU utilisation at or
        above the group's ``gpu_utilization_below``, or notebook activity where
        that is the signal) cancels the stop.
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

    usage_interval = Float(
        30.0,
        help="""
        Seconds between passes that write down GPU time (``GPUPolicy.accounting_url``):
        each GPU server pod is marked as seen, pods the hub did not record get a row
        from their own start, and rows of pods that are gone are ended at their last
        sighting. An end nobody witnessed (the hub down when a pod was removed) is
        off by at most this long. The budgets, history and showback the service
        shows are read back at the same time.
        """,
    ).tag(config=True)

    orphan_grace = Float(
        600.0,
        allow_none=True,
        help="""
        Seconds a server pod of this hub may run with no hub server owning it before
        the service deletes it (``None``: never delete, only report). Such a pod is
        left by a stop that failed while the Kubernetes API was away, followed by a
        hub restart: JupyterHub forgot the server, the pod holds its GPUs. While it
        exists it stays charged to its group and is listed on the dashboard and in
        ``api/usage``. With ``reconcile_dry_run`` it is only reported.
        """,
    ).tag(config=True)

    billing_timezone = Unicode(
        "UTC",
        help="""
        The time zone a showback month is taken in, as an IANA name such as
        ``Europe/Berlin`` or ``America/New_York``: ``api/showback?month=2026-11``
        runs from the first midnight of November there to the first midnight of
        December (a month with a daylight saving change is an hour shorter or
        longer). The default month is the current one there.
        """,
    ).tag(config=True)

    emissions_factor = Float(
        None,
        allow_none=True,
        min=0.0,
        help="""
        Grams of CO2 equivalent per kWh of the electricity your GPUs use (your
        grid's or your supplier's figure, such as ``350``). Showback then gives
        ``emissions_kg`` beside ``energy_kwh`` for each group, user and flavor in its
        JSON, and an ``emissions_kg`` column at the end of its CSV. Default
        ``None``: no emissions figures.
        """,
    ).tag(config=True)

    utilisation_refresh = Float(
        300.0,
        help="""
        Seconds between reads of the current day's GPU utilisation from Prometheus
        for showback's *utilised* figures (a finished day is read once). Shorter
        shows a server's use sooner and costs a query over the day so far each
        time.
        """,
    ).tag(config=True)

    datasets_interval = Float(
        60.0,
        # a check every second at most: each reads every claim the policy names
        min=1.0,
        help="""
        Seconds between checks that the PersistentVolumeClaims the groups'
        datasets name (``GPUPolicy.datasets``, ``claim: <name>``) exist where
        the groups' servers run. A missing claim is shown on the dashboard and
        in ``api/usage``, and counted in the metric
        ``jupyterhub_gpu_dataset_claim_missing``, at most this long after it
        goes (or until this long after it is created). Each check reads every
        claim the policy needs by name, one small request per claim and
        namespace.
        """,
    ).tag(config=True)

    history_per_user = Int(
        2,
        min=1,
        help="""
        At most this many computations of GPU use over time (``api/history``, the
        dashboard's charts) at once for one user; a request beyond is answered 429
        with ``Retry-After``. An answer already computed (the same group, step and
        window since the last GPU-time pass) is never refused: windows are aligned
        to the step, so the same request a second later is such an answer.
        """,
    ).tag(config=True)

    history_total = Int(
        4,
        min=1,
        help="""
        At most this many computations of GPU use over time at once for all users
        together (429 beyond), and the number of threads they and the showback of
        months older than the records kept in memory run on. These threads and
        their database connections are the readers' own: the GPU-time pass and
        the budget rule never wait behind them.
        """,
    ).tag(config=True)

    history_timeout = Float(
        30.0,
        help="""
        Seconds a request for GPU use over time waits for its answer before it is
        answered 503 (the computation goes on, and serves the next request).
        """,
    ).tag(config=True)

    enforcement_threads = Int(
        4,
        min=1,
        help="""
        Threads for the usage database work of the GPU-time pass, the budget rule
        and the server events (the service's own writes and reads): theirs alone,
        so no reader's request takes one.
        """,
    ).tag(config=True)

    # ---- where the service runs ----------------------------------------------------

    form = CaselessStrEnum(
        ["hub-pod", "deployment"],
        "hub-pod",
        help="""
        Where the service runs. ``hub-pod`` (the default, small sites): the hub
        starts it inside its own pod (``hub.services.gpu.command``); it stops
        whenever the hub stops. ``deployment``: its own Deployment of ``replicas``
        pods under its own service account, with resources of its own,
        reached at ``hub.services.gpu.url`` (JupyterHub's external service, no
        ``command``), which ``jupyterhub-gpu manifests`` renders. Its replicas
        elect a leader on a ``coordination.k8s.io`` Lease (``lease_*``): one acts
        (writes usage, applies the rules, reconciles, deletes orphaned pods),
        all answer the dashboard and the API, and accounting and enforcement go
        on while the hub is upgraded.
        """,
    ).tag(config=True)

    replicas = Int(2, min=1, help="The Deployment's replicas (``form: deployment``).").tag(
        config=True
    )

    deployment_name = Unicode(
        "jupyterhub-gpu-service",
        help="""
        The name of the Deployment, its Service (``hub.services.gpu.url`` is
        ``http://<name>:10101``), its ServiceAccount and its Lease (``form:
        deployment``).
        """,
    ).tag(config=True)

    resources = Dict(
        {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        help="""
        The service container's resources in its own Deployment (``form:
        deployment``), as a container's ``resources``: the hub pod's no longer
        carry the service's passes, dashboard and history reads.
        """,
    ).tag(config=True)

    lease_duration = Float(
        15.0,
        help="""
        Seconds another replica waits, from when it last saw the Lease renewed,
        before it may take the Lease (``form: deployment``): the longest time
        nobody acts after the acting replica dies.
        """,
    ).tag(config=True)

    lease_renew_deadline = Float(
        10.0,
        help="""
        Seconds after its last successful renewal began that the acting replica
        stops acting unless it has renewed again (a suspended or cut-off
        replica). Shorter than ``lease_duration``, so it stops before another
        may start.
        """,
    ).tag(config=True)

    lease_retry_period = Float(
        2.0,
        help="Seconds between a replica's attempts to renew or take the Lease.",
    ).tag(config=True)

    stop_without_hub = CaselessStrEnum(
        ["wait", "delete-pod"],
        "wait",
        help="""
        What a stop does while the hub's API does not answer (a hub upgrade or
        restart) when a server's ``max_runtime``, budget grace, idle notice or
        over-limit wait ends. ``wait`` (the default): nothing is stopped; the
        service says so (the rule's task fails naming the server, the log, the
        metric ``jupyterhub_gpu_stops_waiting_for_hub``) and the stop goes
        through the hub's API at the rule's first run once the hub answers.
        ``delete-pod``: the service deletes the server's pod itself (the pod it
        judged, by uid), records the stop with its reason, and asks the hub to
        stop the server once the hub answers, so the hub's record matches.
        """,
    ).tag(config=True)


def service_setting_names() -> set[str]:
    """Every setting ``hub.config.GPUService`` may hold: the service's own and its
    application's (``log_level``, ...)."""
    return set(GPUService.class_trait_names(config=True)) | set(
        Application.class_trait_names(config=True)
    )


def prometheus_url_error(url: object) -> str | None:
    """Why ``url`` cannot be the Prometheus server's URL, or None (empty: not configured)."""
    if url == "" or url is None:
        return None
    if not isinstance(url, str):
        return f"expected the Prometheus server's http(s) URL, got {url!r}"
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return (
            "expected the Prometheus server's http(s) URL, such as "
            f"http://prometheus-server.monitoring or http://127.0.0.1:9090, got {url!r}"
        )
    if parsed.query or parsed.fragment:
        return f"expected a URL without ?query or #fragment, got {url!r}"
    return None
