"""Start, inspect and stop the local Kubernetes GPU cluster.

The cluster is real Kubernetes: etcd, kube-apiserver (RBAC, ResourceQuota
admission), kube-controller-manager (quota, namespace, garbage collection,
service accounts, node lifecycle) and kube-scheduler, with kwok simulating GPU
nodes and the pod lifecycle, and our pod runner starting what a Running pod
describes as a local process.

Loopback only: every process binds 127.0.0.1; node, pod and service addresses
are in 127.0.0.0/8. Everything a cluster writes lives in its state folder, which
``down`` removes together with every process it started.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from . import build, dra, nodepools, pki, volcano
from .cluster_state import (
    POD_PREFIX,
    POD_RANGE,
    ClusterError,
    ClusterState,
    ProgressFn,
    choose_pod_cidr,
    pod_addresses_in_use,
    running_state_files,
    state_root,
)
from .ports import free_port as free_port
from .processes import alive, stop_group
from .scheduler_starts import KUEUE_SERVERS, SchedulerStarts

# what callers import from here, some of it defined in the modules above
__all__ = [
    "DEFAULT_NODE_POOLS",
    "KEEP_FINALIZERS",
    "POD_PREFIX",
    "POD_RANGE",
    "PORT_TAKEN",
    "ClusterError",
    "ClusterState",
    "LocalCluster",
    "choose_pod_cidr",
    "find",
    "free_port",
    "pod_addresses_in_use",
    "running_state_files",
    "state_root",
]

SERVICE_CIDR = "127.128.0.0/16"
DEFAULT_NODE_POOLS = Path(__file__).with_name("nodepools.yaml")
#: kwok's pod stages: its defaults, but a pod annotated KEEP_FINALIZERS keeps its
#: finalizers when deleted (stays Terminating until they are removed), as with a kubelet
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
KEEP_FINALIZERS = "kwok.jupyterhub-gpu.dev/keep-finalizers"
#: The controllers quota replenishment, namespace deletion, garbage collection,
#: service accounts, node readiness and claims bound to volumes (home and dataset
#: storage) need. Endpoint(-slice) controllers are left out: they reject loopback
#: pod IPs.
CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "resourcequota-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "root-ca-certificate-publisher-controller",
    "persistentvolume-binder-controller",
    # a pod's ResourceClaimTemplate becomes its ResourceClaim, released and deleted
    # with the pod (DRA)
    "resourceclaim-controller",
)


#: what a component's log says when the port it was given was taken meanwhile
PORT_TAKEN = "address already in use"
#: the components that make simulated nodes Ready
NODE_ROLES = ("kwok", "kube-controller-manager")


class LocalCluster(SchedulerStarts):
    """One local cluster, identified by its state folder."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        #: how each component this object started was run, to start it again
        self._commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}

    # ---- lifecycle -------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        name: str = "default",
        directory: Path | None = None,
        bin_dir: Path | str | None = None,
        node_pools: dict | None = None,
        progress: ProgressFn | None = None,
        start_timeout: float = 60,
        stand_in_schedulers: tuple[str, ...] = (),
        schedulers: tuple[str, ...] = (),
        kueue_fair_sharing: bool = False,
        volcano_proportion: bool = False,
    ) -> LocalCluster:
        """Build (or reuse) the binaries and start a fresh cluster; return when it is Ready.

        ``stand_in_schedulers``: scheduler names (``schedulerName`` of pods) that
        kube-scheduler places as its own, for a policy whose scheduler the cluster
        does not run: every label and annotation stays, the placement is the default's.
        ``schedulers``: schedulers the cluster runs for real besides kube-scheduler
        (``"kueue"``: Kueue's manager with its CRDs and webhooks), built on first use.
        ``kueue_fair_sharing``: Kueue runs with fair sharing on, as a site sets it for
        a policy with ``fair_share``. ``volcano_proportion``: Volcano's ``proportion``
        plugin (queues by weight) instead of ``capacity`` (queues by ``deserved``).
        """
        progress = progress or (lambda m: print(f"[cluster] {m}", file=sys.stderr, flush=True))
        schedulers = tuple(dict.fromkeys(schedulers))
        binaries = build.ensure_binaries(bin_dir, progress=progress, schedulers=schedulers)
        description = node_pools or yaml.safe_load(DEFAULT_NODE_POOLS.read_text())
        nodes = nodepools.render_nodes(description)  # fail on a bad description before starting
        slices = dra.render_resource_slices(description)
        classes = dra.device_classes(description)
        if directory is None:
            state_root().mkdir(parents=True, exist_ok=True)
            directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=state_root()))
        directory.mkdir(parents=True, exist_ok=True)
        roles = ["etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"]
        if "kueue" in schedulers:
            roles += [f"kueue-{server}" for server in KUEUE_SERVERS]
        if "volcano" in schedulers:
            roles += [f"volcano-{server}" for server in volcano.SERVERS]
        for attempt in (1, 2):
            # a port is free when chosen and bound a moment later by the component: in
            # between, another cluster starting beside this one (two test workers) may
            # take it, and the component exits; the next attempt chooses anew
            state = ClusterState(
                name=name,
                directory=str(directory),
                ports={k: free_port() for k in roles},
                versions=build.versions(schedulers),
                pod_cidr=choose_pod_cidr(pod_addresses_in_use()),
                stand_in_schedulers=list(stand_in_schedulers),
                schedulers=list(schedulers),
                kueue_fair_sharing=kueue_fair_sharing,
                volcano_proportion=volcano_proportion,
            )
            cluster = cls(state)
            try:
                cluster._start(Path(binaries), nodes, progress, start_timeout, slices, classes)
            except ClusterError as e:
                cluster.down()
                if attempt == 1 and PORT_TAKEN in str(e):
                    progress(f"a port was taken by another process meanwhile ({e}); again")
                    directory.mkdir(parents=True, exist_ok=True)
                    continue
                raise
            except BaseException:
                cluster.down()
                raise
            return cluster
        raise AssertionError("unreachable")

    def _spawn(self, role: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        logs = self.state.path / "logs"
        logs.mkdir(exist_ok=True)
        with open(logs / f"{role}.log", "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survives the CLI, stopped as a group by down()
                cwd=self.state.path,
                env=env,
            )
        self.state.pids[role] = proc.pid
        self._commands[role] = (argv, env)
        self.state.save()

    def stop_component(self, role: str) -> None:
        """Stop one component (``kube-apiserver``, say) and leave the others running:
        what a control-plane restart looks like to every client. ``start_component``
        starts it again on the same ports."""
        stop_group(self.state.pids[role], grace=10)

    def start_component(self, role: str, timeout: float = 60) -> None:
        """Start again a component ``stop_component`` stopped, as it was started; for
        the API server, return once it is ready."""
        if role not in self._commands:
            raise ClusterError(
                f"{role} was not started by this LocalCluster object, so how to start it "
                "again is not known; use the object LocalCluster.create returned"
            )
        argv, env = self._commands[role]
        self._spawn(role, argv, env)
        if role == "kube-apiserver":
            self._wait(self._apiserver_ready, role, timeout)

    def _scheduler_config(self, kubeconfig: Path | str) -> list[str]:
        """kube-scheduler's --config when it also answers to stand-in scheduler names."""
        if not self.state.stand_in_schedulers:
            return []
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [
                {"schedulerName": name}
                for name in ["default-scheduler", *self.state.stand_in_schedulers]
            ],
        }
        path = self.state.path / "scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return [f"--config={path}"]

    def _start(
        self,
        bins: Path,
        nodes: list[dict],
        progress: ProgressFn,
        timeout: float,
        slices: list[dict] | None = None,
        classes: list[dict] | None = None,
    ) -> None:
        started = time.monotonic()
        d = self.state.path
        p = self.state.ports
        kubeconfigs = pki.write_pki(d / "pki", self.state.server)
        pk = d / "pki"
        self.state.save()

        progress("starting etcd")
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=local",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
                f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                f"--initial-cluster=local=http://127.0.0.1:{p['etcd-peer']}",
                "--unsafe-no-fsync",  # a throwaway test cluster: speed over durability
                "--log-level=warn",
            ],
        )
        self._wait(lambda: self._http_ok(f"http://127.0.0.1:{p['etcd']}/health"), "etcd", timeout)

        progress("starting kube-apiserver")
        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p['apiserver']}",
                f"--cert-dir={pk}",
                f"--tls-cert-file={pk / 'apiserver.crt'}",
                f"--tls-private-key-file={pk / 'apiserver.key'}",
                f"--client-ca-file={pk / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pk / 'sa.pub'}",
                f"--service-account-signing-key-file={pk / 'sa.key'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # the default reconciler writes Endpoints for the API server's own
                # address; loopback Endpoints are invalid, so none are written
                "--endpoint-reconciler-type=none",
                "--enable-admission-plugins=ResourceQuota,LimitRanger,Priority,RuntimeClass",
                "--profiling=false",
                # a pod's logs are asked of its node's kubelet: by the node's IP
                # (loopback), never its name, which would be looked up in the
                # machine's DNS
                "--kubelet-preferred-address-types=InternalIP",
                "--v=1",
            ],
        )
        self._wait(self._apiserver_ready, "kube-apiserver", timeout)

        progress("starting kube-controller-manager, kube-scheduler, kwok and the pod runner")
        for role, kubeconfig, extra in (
            (
                "kube-controller-manager",
                kubeconfigs["controller-manager"],
                [
                    f"--controllers={','.join(CONTROLLERS)}",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={pk / 'sa.key'}",
                    f"--root-ca-file={pk / 'ca.crt'}",
                    f"--secure-port={p['controller-manager']}",
                    "--cert-dir=" + str(d / "controller-manager"),
                ],
            ),
            (
                "kube-scheduler",
                kubeconfigs["scheduler"],
                [
                    f"--secure-port={p['scheduler']}",
                    "--cert-dir=" + str(d / "scheduler"),
                    *self._scheduler_config(kubeconfigs["scheduler"]),
                ],
            ),
        ):
            self._spawn(
                role,
                [
                    str(bins / role),
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    "--v=1",
                    *extra,
                ],
            )
        self._spawn(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={kubeconfigs['kwok']}",
                "--manage-nodes-with-annotation-selector=" + "=".join(nodepools.KWOK_ANNOTATION),
                f"--cidr={self.state.pod_cidr}",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--config={KWOK_STAGES}",
                # without an explicit address kwok serves on 0.0.0.0
                f"--server-address=127.0.0.1:{p['kwok']}",
            ],
            env={**os.environ, "HOME": str(d)},  # kwok reads ~/.kwok/kwok.yaml: keep it ours
        )
        self._spawn(
            "pod-runner",
            [
                sys.executable,
                "-m",
                "jupyterhub_gpu_dev.localcluster.podrunner",
                f"--kubeconfig={kubeconfigs['pod-runner']}",
                f"--workdir={d / 'pods'}",
            ],
        )
        progress(f"registering {len(nodes)} simulated nodes")
        asyncio.run(self._register_nodes(nodes, timeout - (time.monotonic() - started)))
        if slices:
            progress(f"publishing {len(slices)} ResourceSlices of the DRA driver")
            asyncio.run(self._publish_slices(slices, classes or dra.DEVICE_CLASSES))
        if "kueue" in self.state.schedulers:
            self._start_kueue(bins, progress, timeout)
        if "volcano" in self.state.schedulers:
            self._start_volcano(bins, kubeconfigs["volcano"], progress, timeout)
        progress(f"cluster ready in {time.monotonic() - started:.1f}s")

    async def _register_nodes(self, nodes: list[dict], within: float) -> None:
        from kubernetes_asyncio.client import ApiException

        async with self.api() as api:
            from kubernetes_asyncio import client

            core = client.CoreV1Api(api)
            for node in nodes:
                try:
                    await core.create_node(node)
                except ApiException as e:
                    if e.status != 409:
                        raise
            deadline = time.monotonic() + max(within, 10)
            while True:
                missing = await self._not_ready(core, nodes)
                if not missing:
                    return
                # kwok makes nodes Ready, the controller-manager lifts their not-ready
                # taint: one that exited (a port taken, say) says why at once
                for role in NODE_ROLES:
                    if not alive(self.state.pids[role]):
                        raise ClusterError(
                            f"{role} exited during start-up; its log ends:\n{self._log_tail(role)}"
                        )
                if time.monotonic() > deadline:
                    tails = "".join(
                        f"\n--- {role} log ends:\n{self._log_tail(role, 1500)}"
                        for role in NODE_ROLES
                    )
                    raise ClusterError(f"cluster not ready in time: {missing}{tails}")
                await asyncio.sleep(0.25)

    async def _publish_slices(self, slices: list[dict], classes: list[dict]) -> None:
        """What NVIDIA's DRA driver publishes: its DeviceClasses (as its chart installs
        them) and each DRA node's ResourceSlice (as its kubelet plugin does)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client import ApiException

        async with self.api() as api:
            # as custom objects: the oldest supported hub's kubernetes_asyncio (31) has no
            # ResourceV1Api, and its tests start this cluster too
            objects = client.CustomObjectsApi(api)
            for device_class in classes:
                try:
                    await objects.create_cluster_custom_object(
                        "resource.k8s.io", "v1", "deviceclasses", device_class
                    )
                except ApiException as e:
                    if e.status != 409:
                        raise
            for resource_slice in slices:
                await objects.create_cluster_custom_object(
                    "resource.k8s.io", "v1", "resourceslices", resource_slice
                )

    @staticmethod
    async def _not_ready(core, nodes: list[dict]) -> str:
        listed = await core.list_node()
        ready = {
            n.metadata.name
            for n in listed.items
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            and not any(t.key == "node.kubernetes.io/not-ready" for t in (n.spec.taints or []))
        }
        waiting = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in ready]
        if waiting:
            return f"nodes not Ready: {', '.join(waiting)}"
        # pods can only be admitted once the namespace's default service account exists
        accounts = await core.list_namespaced_service_account("default")
        if not any(a.metadata.name == "default" for a in accounts.items):
            return "service account default/default not created yet"
        return ""

    def api(self):
        """An async kubernetes_asyncio ApiClient for this cluster (use ``async with``)."""
        from kubernetes_asyncio import client

        from .kubeconfig import load_configuration

        async def make() -> client.ApiClient:
            return client.ApiClient(await load_configuration(self.state.kubeconfig))

        return _AsyncApi(make)

    # ---- checks --------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        pk = self.state.path / "pki"
        ctx = ssl.create_default_context(cafile=str(pk / "ca.crt"))
        ctx.load_cert_chain(str(pk / "admin.crt"), str(pk / "admin.key"))
        return ctx

    @staticmethod
    def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                return r.status == 200
        except OSError:
            return False

    def _apiserver_ready(self) -> bool:
        return self._http_ok(f"{self.state.server}/readyz", self._ssl())

    def _wait(self, check: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pid = self.state.pids.get(what)
        while not check():
            if pid and not alive(pid):
                raise ClusterError(
                    f"{what} exited during start-up; its log ends:\n{self._log_tail(what)}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{what} not ready after {timeout:.0f}s; its log ends:\n{self._log_tail(what)}"
                )
            time.sleep(0.1)

    def _log_tail(self, role: str, size: int = 3000) -> str:
        """The end of a component's log: the state folder goes with a failed cluster,
        so its error says what the log said."""
        log = self.state.path / "logs" / f"{role}.log"
        return log.read_text(errors="replace")[-size:] if log.exists() else "(no log)"

    def status(self) -> dict[str, Any]:
        processes = {role: alive(pid) for role, pid in self.state.pids.items()}
        return {
            "name": self.state.name,
            "directory": self.state.directory,
            "server": self.state.server,
            "kubeconfig": str(self.state.kubeconfig),
            "processes": processes,
            "apiserver_ready": processes.get("kube-apiserver", False) and self._apiserver_ready(),
            "versions": self.state.versions,
        }

    def down(self) -> None:
        """Stop every process this cluster started and remove its state folder."""
        # reverse start order: the pod runner stops its pods' processes first
        for _role, pid in reversed(list(self.state.pids.items())):
            stop_group(pid, grace=10)
        shutil.rmtree(self.state.path, ignore_errors=True)


class _AsyncApi:
    def __init__(self, make) -> None:
        self._make = make
        self._client = None

    async def __aenter__(self):
        self._client = await self._make()
        return self._client

    async def __aexit__(self, *exc) -> None:
        await self._client.close()


def find(name: str = "default") -> LocalCluster | None:
    """The running cluster of that name started by ``cluster up``, if any."""
    root = state_root()
    if not root.is_dir():
        return None
    for directory in sorted(root.iterdir()):
        state_file = directory / "state.json"
        if state_file.exists():
            state = ClusterState.load(directory)
            if state.name == name:
                return LocalCluster(state)
    return None
