"""Shared fixtures: the real local cluster, a namespace per test, a real hub.

The cluster fixture builds the control plane on first use (with progress on
stderr) and starts one cluster for the whole session; every `k8s` test gets a
fresh namespace that is deleted afterwards.

``scripts/test`` runs the suite in two pytest-xdist workers (``-n 2 --dist loadfile``):
each worker is a session of its own, with its own cluster, Prometheus and Chromium,
and runs whole modules, so a module's hubs and scheduler clusters start once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from kube_helpers import module_cluster


def pytest_configure(config: pytest.Config) -> None:
    # a session started in the background (`pytest &` in a script) ignores Ctrl-C, and
    # every process it starts inherits that; the demo tests stop the demo with Ctrl-C as
    # a user at a terminal does, so the processes they start must not ignore it
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory) -> LocalCluster:
    directory = tmp_path_factory.mktemp("cluster")
    cluster = LocalCluster.create(name=f"pytest-{os.getpid()}", directory=Path(directory))
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
def kueue_cluster(request, tmp_path_factory) -> LocalCluster:
    """A module's cluster with a real Kueue (see ``module_cluster``)."""
    cluster = module_cluster(request, tmp_path_factory, "kueue")
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

    from jupyterhub_gpu_dev.dcgm_exporter import SimulatedDCGMExporter
    from jupyterhub_gpu_dev.prometheus import LocalPrometheus

    exporter = SimulatedDCGMExporter(local_cluster.state.kubeconfig).start()
    try:
        with LocalPrometheus([exporter.target], scrape_interval=1) as prometheus:
            prometheus.wait_for_targets()
            yield SimpleNamespace(exporter=exporter, prometheus=prometheus)
    finally:
        exporter.stop()


@pytest.fixture(scope="session")
def ldap_directory():
    """A real OpenLDAP directory (Debian's slapd) on 127.0.0.1, laid out as
    helm-values/university.yaml says: ``.add_person``, ``.add_group``, ``.set_members``,
    ``.stop()`` / ``.start()`` for an outage (see jupyterhub_gpu_dev.ldap)."""
    from jupyterhub_gpu_dev.ldap import LocalDirectory

    with LocalDirectory() as directory:
        yield directory


@pytest.fixture(scope="session")
def keycloak():
    """A real Keycloak (an OIDC provider) on 127.0.0.1, started once per session (the
    distribution is downloaded into the cache the first time): ``.create_realm``,
    ``.add_to_group``, ``.remove_from_group`` (see jupyterhub_gpu_dev.keycloak)."""
    from jupyterhub_gpu_dev.keycloak import LocalKeycloak

    with LocalKeycloak() as provider:
        yield provider


# headless Chromium fixtures (`browser`, `page`) for page tests
pytest_plugins = ["browser"]


@pytest.fixture(scope="module")
def built():
    """Build (or find) what the demo needs first, so its start-up timeout is about starting."""
    from jupyterhub_gpu_dev.localcluster.build import ensure_binaries
    from jupyterhub_gpu_dev.localcluster.hub import ensure_chp

    ensure_binaries()
    ensure_chp()


# ---- two workers: which modules share one, and which go first -------------------------

#: modules that run on the same worker as another (one after the other, never at the
#: same time): a demo starting removes what demos no longer running left behind, so a
#: demo of the other module starting meanwhile would take away the leftovers the test
#: of that clean-up leaves for its next demo
SAME_WORKER_AS = {
    "tests/test_demo_values.py": "tests/test_demo.py",
    "tests/test_demo_scheduler.py": "tests/test_demo.py",
    "tests/test_demo_vscode.py": "tests/test_demo.py",
}

#: rough seconds a test takes: one that starts a hub (or the demo) is slow, one that
#: uses the cluster is not, the rest are quick
HUB_TEST_SECONDS = 20.0
CLUSTER_TEST_SECONDS = 4.0
OTHER_TEST_SECONDS = 0.1


def _worker_unit(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: the test's module, or its partner's."""
    module = nodeid.split("::", 1)[0]
    return SAME_WORKER_AS.get(module, module)


def _seconds_estimate(item: pytest.Item) -> float:
    if item.get_closest_marker("hub"):
        return HUB_TEST_SECONDS
    if item.get_closest_marker("k8s"):
        return CLUSTER_TEST_SECONDS
    return OTHER_TEST_SECONDS


#: what a test of tests/unit/ may not use: each starts a real part
UNIT_ROOM_BARS = frozenset(
    {"local_cluster", "kueue_cluster", "kube", "hub_factory", "gpu_metrics", "ldap_directory"}
    | {"keycloak", "built", "browser", "page"}
)


def _keep_the_unit_room_fast(items: list[pytest.Item]) -> None:
    """tests/unit/ is the loop one runs while working: a test there that needs the
    cluster, a hub or a browser belongs in tests/ (an error, not a slow run)."""
    wrong = []
    for item in items:
        if item.path.parent.name != "unit":
            continue
        marks = {m for m in ("k8s", "hub") if item.get_closest_marker(m)}
        uses = UNIT_ROOM_BARS.intersection(getattr(item, "fixturenames", ()))
        if marks or uses:
            wrong.append(f"{item.nodeid} ({', '.join(sorted(marks | uses))})")
    if wrong:
        raise pytest.UsageError(
            "tests in tests/unit/ may not start a cluster, a hub or a browser; move these "
            "to tests/: " + "; ".join(wrong)
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """tests/unit/ kept fast; and in an xdist worker: the slowest units first, so that
    the two workers end together instead of one still running a long module after the
    other has run out of work (the scheduler hands units out in collection order, see
    below)."""
    _keep_the_unit_room_fast(items)
    if not hasattr(config, "workerinput"):
        return
    cost: dict[str, float] = {}
    for item in items:
        unit = _worker_unit(item.nodeid)
        cost[unit] = cost.get(unit, 0.0) + _seconds_estimate(item)
    # stable: a module's tests keep their order
    items.sort(key=lambda item: -cost[_worker_unit(item.nodeid)])


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` with the partners of SAME_WORKER_AS in one unit, handed out
    in the order the workers collected them (slowest first) rather than by test count."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _worker_unit(nodeid)

    config.option.loadscopereorder = False
    return ModuleScheduling(config, log)
