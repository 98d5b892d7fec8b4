"""Shared fixtures: the real local cluster, a namespace per test, a real hub.

The cluster fixture builds the control plane on first use (with progress on
stderr) and starts one cluster for the whole session; every `k8s` test gets a
fresh namespace that is deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from jupyterhub_gpu.dev.localcluster.cluster import LocalCluster


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory) -> LocalCluster:
    directory = tmp_path_factory.mktemp("cluster")
    cluster = LocalCluster.create(name=f"pytest-{os.getpid()}", directory=Path(directory))
    yield cluster
    cluster.down()


def module_cluster(request, tmp_path_factory, scheduler: str, **settings) -> LocalCluster:
    """A cluster of the test module's own that runs ``scheduler`` for real (the modules'
    queues share names, so each gets one); modules that use it override ``kube``."""
    module = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    directory = tmp_path_factory.mktemp(f"{module}-cluster")
    return LocalCluster.create(
        name=f"pytest-{module}-{os.getpid()}",
        directory=Path(directory),
        schedulers=(scheduler,),
        **settings,
    )


@pytest.fixture(scope="module")
def kueue_cluster(request, tmp_path_factory) -> LocalCluster:
    """A module's cluster with a real Kueue (see ``module_cluster``)."""
    cluster = module_cluster(request, tmp_path_factory, "kueue")
    yield cluster
    cluster.down()


#: two H200 GPUs in all: a queue's room is the cluster's, so Volcano queues and reclaims
VOLCANO_NODE_POOLS = {
    "node_pools": {
        "cpu": {"count": 1, "cpu": 32, "memory": "128Gi"},
        "h200": {
            "count": 1,
            "cpu": 64,
            "memory": "512Gi",
            "gpu": {"product": "NVIDIA-H200-NVL", "memory": 143771, "count": 2},
        },
    }
}


@pytest.fixture(scope="module")
def volcano_cluster(request, tmp_path_factory) -> LocalCluster:
    """A module's cluster with Volcano's scheduler and controllers, and two GPUs."""
    cluster = module_cluster(request, tmp_path_factory, "volcano", node_pools=VOLCANO_NODE_POOLS)
    yield cluster
    cluster.down()


@pytest.fixture(scope="session")
async def kube(local_cluster):
    async with local_cluster.api() as api:
        yield api


@pytest.fixture(scope="session")
def core(kube) -> client.CoreV1Api:
    return client.CoreV1Api(kube)


@pytest.fixture
async def namespace(core):
    name = f"t-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": name}})
    # pods are admitted only once the namespace's default service account exists
    for _ in range(100):
        accounts = await core.list_namespaced_service_account(name)
        if any(a.metadata.name == "default" for a in accounts.items):
            break
        await asyncio.sleep(0.1)
    yield name
    await core.delete_namespace(name)


@pytest.fixture(scope="module")
async def priority_class_objects(kube):
    """The PriorityClasses and RuntimeClass the policies' pods name, made sure of per
    module: the reconciler's tests prune the ones they came to own."""
    from hub_helpers import create_priority_classes

    await create_priority_classes(kube)


@pytest.fixture
async def hub_factory(local_cluster, core, priority_class_objects, tmp_path):
    """Starts real hubs, each in a fresh namespace: ``await hub_factory(policy=..., ...)``
    takes LocalHub's settings; ``hub_factory.behind_relay(...)`` puts a cuttable relay
    between the hub and the API server. After the test every hub's servers, the hub and
    its namespaces are gone (module-wide hubs use ``hub_helpers.running_hub``)."""
    from hub_helpers import HubFactory

    async with contextlib.AsyncExitStack() as stack:
        yield HubFactory(local_cluster, core, stack, tmp_path)


@pytest.fixture(scope="session")
def gpu_metrics(local_cluster):
    """The simulated DCGM exporter for the cluster's server pods and a real Prometheus
    (Debian's package) scraping it every second: ``.exporter``, ``.prometheus``."""
    from types import SimpleNamespace

    from jupyterhub_gpu.dev.dcgm_exporter import SimulatedDCGMExporter
    from jupyterhub_gpu.dev.prometheus import LocalPrometheus

    exporter = SimulatedDCGMExporter(local_cluster.state.kubeconfig).start()
    try:
        with LocalPrometheus([exporter.target], scrape_interval=1) as prometheus:
            prometheus.wait_for_targets()
            yield SimpleNamespace(exporter=exporter, prometheus=prometheus)
    finally:
        exporter.stop()


# headless Chromium fixtures (`browser`, `page`) for page tests
pytest_plugins = ["browser"]


@pytest.fixture(scope="module")
def built():
    """Build (or find) what the demo needs first, so its start-up timeout is about starting."""
    from jupyterhub_gpu.dev.localcluster.build import ensure_binaries
    from jupyterhub_gpu.dev.localcluster.hub import ensure_chp

    ensure_binaries()
    ensure_chp()
