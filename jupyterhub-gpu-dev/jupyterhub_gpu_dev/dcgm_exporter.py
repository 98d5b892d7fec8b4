"""A simulated NVIDIA DCGM exporter for the local cluster's GPU server pods.

The local cluster's GPUs are simulated (kwok nodes advertise them), so nothing
measures their use. This exporter serves what NVIDIA's ``dcgm-exporter``
would on those nodes, with its metric names and labels, for Prometheus to
scrape: each server pod (labelled ``gpu.jupyterhub.org/group``, Running on a
node) gets the devices it requested, with the utilisation a test or the demo
sets for it (``set_utilization``, or ``PUT /utilization/<namespace>/<pod>``
with ``{"percent": 50}``; default ``default_utilization``). ``set_mapped(namespace,
pod, False)`` reports a pod's devices without its ``namespace``/``pod`` labels, as
dcgm-exporter does for a device it cannot map to a pod (no pod-resources access,
DRA devices): Prometheus then has no series for the pod.

What it serves, per device kind (as dcgm-exporter does when it maps devices to
pods through the kubelet's pod-resources API):

- whole GPUs (``nvidia.com/gpu`` on a node without sharing):
  ``DCGM_FI_DEV_GPU_UTIL`` (percent) for every GPU of the node, with the pod's
  ``namespace``, ``pod`` and ``container`` on those a pod holds;
- time-sliced and MPS replicas (``nvidia.com/gpu.shared``, or ``nvidia.com/gpu``
  on a node with a sharing strategy): ``DCGM_FI_DEV_GPU_UTIL`` of the device,
  the sum of its pods' utilisation (at most 100), once per pod on it: each pod
  sees the whole device's use, which is why it cannot be told apart;
- MIG slices (``nvidia.com/mig-<profile>``, or ``nvidia.com/gpu`` on a node
  with the single strategy): ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio 0 to 1)
  per GPU instance, with ``GPU_I_PROFILE`` and ``GPU_I_ID``;
- DRA devices (NVIDIA's DRA driver: a node with a ResourceSlice of
  ``gpu.nvidia.com``), as dcgm-exporter reports them with its DRA mapping on
  (``--kubernetes-enable-dra``, which reads the kubelet's pod-resources API for
  claims): ``DCGM_FI_DEV_GPU_UTIL`` for every whole GPU the slice publishes, and
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` for each MIG partition a claim holds, with the
  device's own index and UUID from the slice; a device a pod's claim was allocated
  carries the pod's labels and ``dra_claim_name``, ``dra_claim_namespace``,
  ``dra_driver_name``, ``dra_pool_name`` and ``dra_device_name``. With
  ``set_mapped(namespace, pod, False)`` a DRA device is reported as by an exporter
  without the DRA mapping: no pod labels;
- HAMi shares and KAI fractions: nothing (no per-pod device here);
- power: ``DCGM_FI_DEV_POWER_USAGE`` (watts) and
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (millijoules, a counter integrated from
  that power) with the labels of each utilisation series above: each GPU draws its
  idle power plus its utilisation's share of the rest up to its model's maximum (an
  H200's 700 W); a MIG instance's and a shared replica's series give the whole
  device's (``dcgm_power``). ``set_power_series(namespace, pod, gauge, counter)``
  leaves either out of a pod's series, as an exporter whose counters file lacks it;
  ``reset_energy()`` resets every counter, as a driver reload does.

Every series has dcgm-exporter's device labels: ``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` and
``DCGM_FI_DRIVER_VERSION``.

From Python (the HTTP server runs in a thread of its own, on 127.0.0.1)::

    exporter = SimulatedDCGMExporter(cluster.state.kubeconfig).start()
    prometheus = LocalPrometheus([exporter.target]).start()
    exporter.set_utilization("hub-ns", "jupyter-ann", 50)
    ...
    prometheus.stop(); exporter.stop()

Or ``python -m jupyterhub_gpu_dev.dcgm_exporter --kubeconfig PATH --port 9400``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from .dcgm_dra import DRIVER_VERSION, ENGINE_ACTIVE, GPU_UTIL, DraObjects, dra_samples
from .dcgm_power import EnergyMeter, power_families

GROUP_LABEL = "gpu.jupyterhub.org/group"


@dataclass(frozen=True)
class Device:
    """One device a pod holds: a whole GPU, a shared replica's GPU, or a MIG instance."""

    node: str
    kind: str  # "gpu", "shared" or "mig"
    gpu: int
    mig_profile: str | None = None
    instance: int | None = None  # GPU_I_ID


@dataclass(frozen=True)
class PodOnNode:
    namespace: str
    name: str
    uid: str
    node: str
    container: str
    requests: Mapping[str, int]  # nvidia.com/* resources, whole units


def _pods(items: Iterable[Mapping[str, Any]]) -> list[PodOnNode]:
    """The Running, bound, not-deleting pods with their NVIDIA device requests."""
    result = []
    for pod in items:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if metadata.get("deletionTimestamp") or not spec.get("nodeName"):
            continue
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        containers = spec.get("containers") or [{}]
        requests: dict[str, int] = {}
        for container in containers:
            resources = container.get("resources") or {}
            wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            for name, amount in wanted.items():
                if name.startswith("nvidia.com/") and str(amount).isdigit():
                    requests[name] = requests.get(name, 0) + int(amount)
        result.append(
            PodOnNode(
                namespace=metadata.get("namespace", ""),
                name=metadata.get("name", ""),
                uid=metadata.get("uid", ""),
                node=spec["nodeName"],
                container=containers[0].get("name", ""),
                requests=requests,
            )
        )
    return sorted(result, key=lambda p: (p.node, p.namespace, p.name))


def model_name(labels: Mapping[str, str]) -> str:
    """``NVIDIA H200 NVL`` from GFD's ``nvidia.com/gpu.product`` (``NVIDIA-H200-NVL-SHARED``)."""
    product = labels.get("nvidia.com/gpu.product", "NVIDIA-GPU")
    product = product.partition("-MIG-")[0].removesuffix("-SHARED")
    return product.replace("-", " ")


class DeviceMap:
    """Which devices each pod holds; a pod keeps its devices while it runs."""

    def __init__(self) -> None:
        self.held: dict[str, list[Device]] = {}  # pod uid -> devices

    def update(self, pods: list[PodOnNode], nodes: Mapping[str, Mapping[str, str]]) -> None:
        running = {p.uid for p in pods}
        for gone in set(self.held) - running:
            del self.held[gone]
        for pod in pods:
            if pod.uid not in self.held:
                self.held[pod.uid] = self._assign(pod, nodes.get(pod.node, {}))

    def _taken(self, node: str) -> set[Device]:
        return {d for devices in self.held.values() for d in devices if d.node == node}

    def _assign(self, pod: PodOnNode, labels: Mapping[str, str]) -> list[Device]:
        count = int(labels.get("nvidia.com/gpu.count", "0") or 0)
        sharing = labels.get("nvidia.com/gpu.sharing-strategy", "none")
        taken = self._taken(pod.node)
        devices: list[Device] = []
        for resource, amount in sorted(pod.requests.items()):
            if resource.startswith("nvidia.com/mig-"):
                profile = resource.removeprefix("nvidia.com/mig-")
                devices += self._mig(pod.node, profile, amount, labels, taken)
            elif resource == "nvidia.com/gpu" and labels.get("nvidia.com/mig.strategy") == "single":
                profile = labels.get("nvidia.com/gpu.product", "").partition("-MIG-")[2]
                devices += self._mig(pod.node, profile, amount, labels, taken)
            elif resource == "nvidia.com/gpu.shared" or (
                resource == "nvidia.com/gpu" and sharing in ("time-slicing", "mps")
            ):
                # replicas spread over the devices, as the device plugin hands them out
                replicas = int(labels.get("nvidia.com/gpu.replicas", "1") or 1)
                used = [d.gpu for d in taken if d.kind == "shared"]
                for _ in range(amount):
                    gpu = min(range(max(count, 1)), key=lambda g: (used.count(g), g))
                    used.append(gpu)
                    if used.count(gpu) <= replicas:
                        devices.append(Device(pod.node, "shared", gpu))
            elif resource == "nvidia.com/gpu" and labels.get("gpu") != "on":  # not HAMi
                free = [g for g in range(count) if Device(pod.node, "gpu", g) not in taken]
                devices += [Device(pod.node, "gpu", g) for g in free[:amount]]
            taken |= set(devices)
        return devices

    @staticmethod
    def _mig(
        node: str, profile: str, amount: int, labels: Mapping[str, str], taken: set[Device]
    ) -> list[Device]:
        count = int(labels.get(f"nvidia.com/mig-{profile}.count", "0") or 0)
        gpus = max(int(labels.get("nvidia.com/gpu.count", "1") or 1), 1)
        profiles = sorted(
            k for k in labels if k.startswith("nvidia.com/mig-") and k.endswith(".count")
        )
        first = profiles.index(f"nvidia.com/mig-{profile}.count") if count else 0
        held = {d.instance for d in taken if d.kind == "mig" and d.mig_profile == profile}
        free = [i for i in range(count) if i not in held][:amount]
        # the instances of one profile live on one GPU (the mixed strategy's layout here)
        return [Device(node, "mig", first % gpus, profile, i) for i in free]


def _device_labels(device: Device, node_labels: Mapping[str, str]) -> dict[str, str]:
    uid = uuid.uuid5(uuid.NAMESPACE_URL, f"jupyterhub-gpu-sim/{device.node}/{device.gpu}")
    labels = {
        "gpu": str(device.gpu),
        "UUID": f"GPU-{uid}",
        "pci_bus_id": f"00000000:{0x18 + device.gpu:02X}:00.0",
        "device": f"nvidia{device.gpu}",
        "modelName": model_name(node_labels),
    }
    if device.kind == "mig":
        labels["GPU_I_PROFILE"] = device.mig_profile or ""
        labels["GPU_I_ID"] = str(device.instance)
    labels["Hostname"] = device.node
    labels["DCGM_FI_DRIVER_VERSION"] = DRIVER_VERSION
    return labels


def metric_families(
    pods: list[PodOnNode],
    nodes: Mapping[str, Mapping[str, str]],
    devices: DeviceMap,
    utilization: Mapping[tuple[str, str], float],
    default: float,
    unmapped: Collection[tuple[str, str]] = (),
    dra: DraObjects | None = None,
) -> list[Metric]:
    """The two metric families, as dcgm-exporter would report them now (pure);
    the devices of the ``unmapped`` (namespace, pod) without pod labels; the DRA
    driver's devices (``dra``) as ``dra_samples`` says."""
    util = Metric(GPU_UTIL, "GPU utilization (in %).", "gauge")
    engine = Metric(ENGINE_ACTIVE, "Ratio of time the graphics engine is active.", "gauge")
    by_pod = {p.uid: p for p in pods}
    dra = dra or DraObjects()

    def percent(pod: PodOnNode) -> float:
        return min(max(utilization.get((pod.namespace, pod.name), default), 0.0), 100.0)

    def with_pod(labels: dict[str, str], pod: PodOnNode) -> dict[str, str]:
        if (pod.namespace, pod.name) in unmapped:
            return labels
        return {**labels, "container": pod.container, "namespace": pod.namespace, "pod": pod.name}

    for metric, labels, value in dra_samples(pods, dra, percent, with_pod):
        (util if metric == GPU_UTIL else engine).add_sample(metric, labels, value)
    dra_nodes = dra.nodes

    whole: dict[tuple[str, int], PodOnNode] = {}
    shared: dict[tuple[str, int], list[PodOnNode]] = {}
    for uid, held in sorted(devices.held.items()):
        pod = by_pod.get(uid)
        if pod is None:
            continue
        for device in held:
            node_labels = nodes.get(device.node, {})
            if device.kind == "gpu":
                whole[(device.node, device.gpu)] = pod
            elif device.kind == "shared":
                shared.setdefault((device.node, device.gpu), []).append(pod)
            else:
                labels = with_pod(_device_labels(device, node_labels), pod)
                engine.add_sample(ENGINE_ACTIVE, labels, percent(pod) / 100)
    for node, labels in sorted(nodes.items()):
        count = int(labels.get("nvidia.com/gpu.count", "0") or 0)
        if labels.get("nvidia.com/mig.strategy") or labels.get("gpu") == "on" or not count:
            continue
        if node in dra_nodes:  # the DRA driver's devices: reported from its slices above
            continue
        sharing = labels.get("nvidia.com/gpu.sharing-strategy", "none") != "none"
        for gpu in range(count):
            device = Device(node, "shared" if sharing else "gpu", gpu)
            base = _device_labels(device, labels)
            on_it = shared.get((node, gpu), []) if sharing else []
            if not sharing and (node, gpu) in whole:
                on_it = [whole[(node, gpu)]]
            if not on_it:
                util.add_sample(GPU_UTIL, base, 0.0)
                continue
            value = min(sum(percent(p) for p in on_it), 100.0)
            # unmapped pods sharing the device make one series without pod labels
            series = {tuple(sorted(with_pod(base, p).items())) for p in on_it}
            for sample in sorted(series):
                util.add_sample(GPU_UTIL, dict(sample), value)
    return [util, engine]


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class SimulatedDCGMExporter:
    """dcgm-exporter's ``/metrics`` for the local cluster's server pods, on 127.0.0.1."""

    def __init__(
        self, kubeconfig: Path | str, *, port: int = 0, default_utilization: float = 0.0
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.port = port
        self.default_utilization = default_utilization
        self.devices = DeviceMap()
        self._utilization: dict[tuple[str, str], float] = {}
        self._unmapped: set[tuple[str, str]] = set()
        #: each GPU's energy counter, and the pods whose power series leave one out
        self.meter = EnergyMeter()
        self._power_series: dict[tuple[str, str], tuple[bool, bool]] = {}
        self._pod_power: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def target(self) -> str:
        """``host:port``, as a Prometheus scrape target."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    def set_utilization(self, namespace: str, pod: str, percent: float | None) -> None:
        """The GPU utilisation (0-100) the pod's devices report from the next scrape on;
        None: back to ``default_utilization``."""
        with self._lock:
            if percent is None:
                self._utilization.pop((namespace, pod), None)
            else:
                self._utilization[(namespace, pod)] = float(percent)

    def utilization(self) -> dict[tuple[str, str], float]:
        with self._lock:
            return dict(self._utilization)

    def set_mapped(self, namespace: str, pod: str, mapped: bool) -> None:
        """False: from the next scrape on, the pod's devices are reported (with their
        utilisation) without its ``namespace``, ``pod`` and ``container`` labels, as
        for a device dcgm-exporter cannot map to a pod; True (the default): with them."""
        with self._lock:
            if mapped:
                self._unmapped.discard((namespace, pod))
            else:
                self._unmapped.add((namespace, pod))

    def unmapped(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._unmapped)

    def set_power_series(
        self, namespace: str, pod: str, gauge: bool = True, counter: bool = True
    ) -> None:
        """Which of a pod's power series the next scrapes have: the power gauge, the
        total-energy counter (both by default)."""
        with self._lock:
            if gauge and counter:
                self._power_series.pop((namespace, pod), None)
            else:
                self._power_series[(namespace, pod)] = (gauge, counter)

    def _published(self, namespace: str, pod: str) -> tuple[bool, bool]:
        with self._lock:
            return self._power_series.get((namespace, pod), (True, True))

    def reset_energy(self, uuids: Collection[str] | None = None) -> None:
        """These GPUs' energy counters (by ``UUID`` label; None: every GPU's) back to
        zero from the next scrape on, as when the driver is reloaded (a counter reset)."""
        if self._loop is None:
            raise RuntimeError("the simulated DCGM exporter is not running")
        # on the exporter's loop: never in the middle of a scrape
        self._loop.call_soon_threadsafe(self.meter.reset, uuids)

    def pod_power(self, namespace: str, pod: str) -> float | None:
        """The pod's GPUs' power together (watts) at the last scrape; None: no series
        carried its labels."""
        with self._lock:
            return self._pod_power.get((namespace, pod))

    async def render(self, core) -> bytes:
        """One scrape: the pods and nodes as the API server lists them now."""
        nodes_raw = await core.list_node(_preload_content=False)
        pods_raw = await core.list_pod_for_all_namespaces(
            label_selector=GROUP_LABEL, _preload_content=False
        )
        nodes = {
            n["metadata"]["name"]: n["metadata"].get("labels") or {}
            for n in json.loads(await nodes_raw.read())["items"]
        }
        pods = _pods(json.loads(await pods_raw.read())["items"])
        self.devices.update(pods, nodes)
        dra = await self._dra_objects(core)
        families = metric_families(
            pods,
            nodes,
            self.devices,
            self.utilization(),
            self.default_utilization,
            self.unmapped(),
            dra,
        )
        power, per_pod = power_families(families, self.meter, published=self._published)
        with self._lock:
            self._pod_power = per_pod
        return generate_latest(_Families(families + power))

    @staticmethod
    async def _dra_objects(core) -> DraObjects:
        """The DRA driver's slices and every claim (none on a cluster without DRA)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client import ApiException

        custom = client.CustomObjectsApi(core.api_client)
        try:
            slices = await custom.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices"
            )
            claims = await custom.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceclaims"
            )
        except ApiException as e:
            if e.status == 404:
                return DraObjects()
            raise
        return DraObjects(slices["items"], claims["items"])

    # ---- the server thread ------------------------------------------------------------

    def start(self, timeout: float = 30) -> SimulatedDCGMExporter:
        self._thread = threading.Thread(target=self._run, name="dcgm-exporter", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the simulated DCGM exporter did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"the simulated DCGM exporter failed: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def __enter__(self) -> SimulatedDCGMExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start(), or logged by the thread
            self._error = e
            self._ready.set()
            raise

    async def _serve(self) -> None:
        from kubernetes_asyncio import client

        from .localcluster.kubeconfig import load_configuration

        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        api = client.ApiClient(await load_configuration(self.kubeconfig))
        app = web.Application(
            [
                (r"/metrics", _MetricsHandler, {"exporter": self, "core": client.CoreV1Api(api)}),
                (r"/utilization", _UtilizationHandler, {"exporter": self}),
                (r"/utilization/([^/]+)/([^/]+)", _UtilizationHandler, {"exporter": self}),
            ]
        )
        server = HTTPServer(app)
        sockets = bind_sockets(self.port, "127.0.0.1")
        server.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.stop()
            await api.close()


class _MetricsHandler(web.RequestHandler):
    def initialize(self, exporter: SimulatedDCGMExporter, core: Any) -> None:
        self.exporter = exporter
        self.core = core

    async def get(self) -> None:
        body = await self.exporter.render(self.core)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.write(body)


class _UtilizationHandler(web.RequestHandler):
    """``PUT /utilization/<namespace>/<pod>`` ``{"percent": 50}`` (null: the default);
    ``GET /utilization``: what is set."""

    def initialize(self, exporter: SimulatedDCGMExporter) -> None:
        self.exporter = exporter

    def get(self, namespace: str | None = None, pod: str | None = None) -> None:
        self.write(
            {f"{ns}/{name}": value for (ns, name), value in self.exporter.utilization().items()}
        )

    def put(self, namespace: str, pod: str) -> None:
        try:
            percent = json.loads(self.request.body or b"{}")["percent"]
            if percent is not None and not 0 <= float(percent) <= 100:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            raise web.HTTPError(
                400, 'expected {"percent": a number from 0 to 100, or null}'
            ) from None
        self.exporter.set_utilization(namespace, pod, percent)
        self.set_status(204)

    post = put


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jupyterhub_gpu_dev.dcgm_exporter", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--kubeconfig", required=True, help="the local cluster's kubeconfig")
    parser.add_argument("--port", type=int, default=9400, help="port on 127.0.0.1 (0: any)")
    parser.add_argument(
        "--default-utilization", type=float, default=0.0, help="percent for pods not set"
    )
    args = parser.parse_args(argv)
    exporter = SimulatedDCGMExporter(
        args.kubeconfig, port=args.port, default_utilization=args.default_utilization
    ).start()
    print(f"simulated dcgm-exporter at {exporter.url}/metrics", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    exporter.stop()


if __name__ == "__main__":
    main()
