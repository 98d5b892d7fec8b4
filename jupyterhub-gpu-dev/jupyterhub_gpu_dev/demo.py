"""``jupyterhub-gpu demo [VALUES...]``: the local cluster and a real hub with a GPU policy.

With no values files it runs the built-in example (``demo_values.yaml``); with
them, the admin's own values, merged in order like ``helm -f`` and checked like
``jupyterhub-gpu check`` before anything starts. It builds (or reuses) the local
cluster with simulated nodes that offer every flavor of the policy (or the
``--node-pools`` file's) and runs the scheduler the policy names when the local
cluster can run it (Kueue or Volcano; ``--scheduler`` runs the built-in example
with it; KAI is stood in for by kube-scheduler), creates the cluster objects the policy
implies, starts a real JupyterHub with configurable-http-proxy and ``GPUKubeSpawner``
configured from ``hub.config`` the way z2jh does, and the GPU service at
/services/gpu/, with two demo users in each group who log in with a shared
password. GPU time is recorded in a usage database in the demo's state folder;
for the built-in example (and values with an ``idle`` rule) a simulated NVIDIA
DCGM exporter reports the servers' GPU use to a local Prometheus, which the
service's idle rule asks (``GPUService.prometheus_url``). Datasets: the exports of
a loopback NFS server are folders the demo makes in its state folder (with a README
and a sample file), and each claim a group's servers mount is an empty stand-in,
bound to a PersistentVolume of an empty folder there; the pod runner links both
into the servers' homes at their mount paths. VS Code (code-server, installed by
``jupyterhub-gpu demo`` before it starts) opens where the policy offers it. Prints the URL, the
logins, an admin API token and what to try; Ctrl-C (or SIGTERM, or closing the
terminal) stops the hub, its servers, Prometheus, the exporter and the cluster,
and removes their folders; what a demo killed outright left, the next demo removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time

from .dcgm_exporter import SimulatedDCGMExporter
from .demo_leftovers import (
    MARKER,
    clean_leftovers,
    stop_leftover_hub,
    stop_leftover_prometheus,
    write_marker,
)
from .demo_objects import reconcile_once, serve_loopback_exports, stand_in_claims, stand_in_objects
from .demo_plan import DemoPlan, fill_directory, plan_demo, print_node_pools
from .demo_settings import (
    DEMO_ADMIN,
    DEMO_VALUES,
    HUB_NAMESPACE,
    NFS_FOLDER,
    SCHEDULER_OBJECTS,
    SCHEDULER_ROLES,
    SCRAPE_INTERVAL,
    USAGE_DATABASE,
    DemoError,
)
from .demo_walkthrough import FAIR_SHARE_HISTORY, GPUMetrics, banner, seed_fair_share_history
from .ldap import LocalDirectory, SlapdMissing
from .localcluster.cluster import LocalCluster
from .localcluster.hub import LocalHub
from .prometheus import LocalPrometheus

# what callers import from here, some of it defined in the modules above
__all__ = [
    "DEMO_VALUES",
    "FAIR_SHARE_HISTORY",
    "HUB_NAMESPACE",
    "MARKER",
    "SCHEDULER_OBJECTS",
    "SCHEDULER_ROLES",
    "DemoError",
    "DemoPlan",
    "fill_directory",
    "plan_demo",
    "print_node_pools",
    "reconcile_once",
    "run_demo",
    "seed_fair_share_history",
    "stand_in_claims",
    "stand_in_objects",
    "stop_leftover_hub",
    "stop_leftover_prometheus",
]


def _check_port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise DemoError(
                f"port {port} on 127.0.0.1 is in use ({e.strerror}): "
                "stop what uses it, or pass another with --port"
            ) from None


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run_demo(plan: DemoPlan, bin_dir: str | None = None, port: int = 8000) -> int:
    def say(message: str) -> None:
        print(f"[demo] {message}", file=sys.stderr, flush=True)

    for note in plan.notes:
        say(note)
    clean_leftovers(say)  # before the port check: a leftover hub may hold the port
    _check_port_free(port)
    # SIGTERM and a closed terminal (SIGHUP) stop the demo as cleanly as Ctrl-C does
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    cluster: LocalCluster | None = None
    hub: LocalHub | None = None
    exporter: SimulatedDCGMExporter | None = None
    prometheus: LocalPrometheus | None = None
    directory: LocalDirectory | None = None
    try:
        # a Ctrl-C while it starts: create() removes what it started, then re-raises
        cluster = LocalCluster.create(
            name="demo",
            bin_dir=bin_dir,
            progress=say,
            node_pools=plan.node_pools,
            stand_in_schedulers=plan.stand_ins,
            schedulers=plan.schedulers,
            # a policy with fair share: Kueue's own fair sharing on, as a site sets it
            kueue_fair_sharing=plan.policy.fair_share is not None,
        )
        write_marker(cluster, None)
        created = asyncio.run(reconcile_once(cluster, plan.policy, plan.crds))
        say(f"reconciled the policy's cluster objects: created {', '.join(created) or 'none'}")
        # GPU time outlives hub restarts in a real deployment; here it lives as long as
        # the demo's cluster, in its state folder (an absolute path: the hub and the
        # service each read it)
        policy_values = {
            **serve_loopback_exports(
                plan.policy_values, plan.policy, cluster.state.path / NFS_FOLDER
            ),
            "accounting_url": f"sqlite:///{cluster.state.path / USAGE_DATABASE}",
        }
        for line in seed_fair_share_history(plan, policy_values["accounting_url"], time.time()):
            say(line)
        service_settings = dict(plan.service_settings)
        metrics: GPUMetrics | None = None
        if plan.gpu_metrics:
            exporter = SimulatedDCGMExporter(cluster.state.kubeconfig)
            exporter.start()
            say(f"started the simulated DCGM exporter at {exporter.url}/metrics")
            prometheus = LocalPrometheus([exporter.target], scrape_interval=SCRAPE_INTERVAL)
            say(f"starting Prometheus at {prometheus.url}, scraping the exporter")
            try:
                prometheus.start()
            except RuntimeError as e:
                raise DemoError(str(e)) from None
            write_marker(cluster, None, prometheus)
            metrics = GPUMetrics(exporter, prometheus)
            service_settings["prometheus_url"] = prometheus.url
        else:
            # the values' own Prometheus is the site's, never reached from here (loopback
            # only): without the demo's, the idle rule falls back to notebook activity
            service_settings.pop("prometheus_url", None)
        hub_config = plan.hub_config
        if plan.auth == "ldap":
            try:
                # entered here and closed with the rest below (it cleans up after itself
                # when it fails to start)
                directory = LocalDirectory().__enter__()
            except (SlapdMissing, RuntimeError) as e:
                raise DemoError(f"--auth ldap: {e}") from None
            settings = fill_directory(directory, plan, LocalHub.password)
            say(f"started OpenLDAP at {directory.url} with the demo users in their groups")
            hub_config = {
                **hub_config,
                "JupyterHub": {
                    **hub_config.get("JupyterHub", {}),
                    "authenticator_class": "ldap-groups",
                },
                "LDAPGroupsAuthenticator": settings,
            }
        hub = LocalHub(
            cluster,
            namespace=HUB_NAMESPACE,
            # with --auth ldap or values, the groups come from the logins alone
            users=plan.users if plan.auth == "demo" else {},
            admin_users=(DEMO_ADMIN,) if plan.auth != "values" else (),
            port=port,
            policy=policy_values,
            hub_config=hub_config,
            service_settings=service_settings,
            # hub.config as z2jh lays it out in a hub pod, read through its helper
            z2jh_layout=True,
            # the GPU service at /services/gpu/: dashboard, usage API, runtime rules,
            # and the reconciler keeping the policy's objects in the cluster
            gpu_service=True,
        )
        write_marker(cluster, hub, prometheus)
        say(f"starting JupyterHub with GPUKubeSpawner and the policy on port {port}")
        try:
            hub.start(timeout=180)
        except RuntimeError as e:
            raise DemoError(str(e)) from None
        if prometheus is not None:
            try:
                prometheus.wait_for_targets()
            except RuntimeError as e:
                raise DemoError(f"{e}; its log: {prometheus.log_path}") from None
            say("Prometheus scrapes the exporter")
        print(banner(plan, hub, cluster, metrics), flush=True)
        while hub.process.poll() is None:
            time.sleep(0.5)
        tail = hub.log_path.read_text(errors="replace")[-3000:]
        say(f"the hub exited on its own; its log ends:\n{tail}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # a second Ctrl-C must not cut the clean-up short and leave processes behind
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        say(
            "stopping the hub, its servers, "
            + ("Prometheus, the DCGM exporter " if prometheus or exporter else "")
            + "and the cluster"
        )
        # the callbacks run last first: the hub, Prometheus, the exporter, the cluster
        with contextlib.ExitStack() as cleanup:
            if cluster:
                cleanup.callback(cluster.down)
            if exporter:
                cleanup.callback(exporter.stop)
            if prometheus:
                cleanup.callback(prometheus.stop)
            if directory:
                cleanup.callback(directory.close)
            if hub:
                cleanup.callback(hub.stop)  # first: it stops the servers' pods
        say("stopped; nothing is left running")
