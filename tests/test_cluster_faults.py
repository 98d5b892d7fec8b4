"""Faults of the cluster itself, with a real hub, its GPU service and a cluster of the
module's own (a node that stops answering, the API server restarted: nothing another
module should see).

What is asserted is what users and the dashboard see: the hub's refusals and profile
list (its ledger and the free capacity), the service's ``api/usage`` and dashboard,
all equal to the server pods that exist. A pod still holds its charge while it is
terminating, until it is gone.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from hub_helpers import api, page_as, ready, running_hub
from jupyterhub_gpu_dev.localcluster import hub as local_hub
from jupyterhub_gpu_dev.localcluster.cluster import KEEP_FINALIZERS, LocalCluster
from jupyterhub_gpu_dev.localcluster.nodepools import KWOK_ANNOTATION
from kube_helpers import eventually
from test_service_hub import aget, usage, user_token, wait_for_service

pytestmark = [pytest.mark.k8s, pytest.mark.hub]

PRODUCT = "NVIDIA-H200-NVL"
#: two GPU nodes of two GPUs: one can fail while the other serves
NODE_POOLS = {
    "node_pools": {
        "cpu": {"count": 1, "cpu": 16, "memory": "64Gi"},
        "h200": {
            "count": 2,
            "cpu": 32,
            "memory": "256Gi",
            "gpu": {"product": PRODUCT, "memory": 143771, "count": 2},
        },
    }
}
POLICY = {
    "flavors": {
        "h200": {
            "kind": "gpu",
            "display_name": "H200",
            "node_selector": {"nvidia.com/gpu.product": PRODUCT},
        }
    },
    "profiles": {"gpu": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}}},
    "groups": {"lab": {"display_name": "Lab", "quota": {"gpus": 2}, "profiles": ["gpu"]}},
}
GPU = {"profile": "lab--gpu"}
#: dan never starts a server: the spawn page he sees is the profile list
USERS = {"ann": ["lab"], "bob": ["lab"], "cat": ["lab"], "dan": ["lab"], "root": []}
FULL = (
    "Lab already uses 2 of its 2 GPUs, and this server needs 1: try again when one of its "
    "servers stops"
)
#: the service whose token the tests hold (renamed once: either name works here)
ADMIN_SERVICE = getattr(local_hub, "ADMIN_SERVICE", "test-admin")
#: the tests' admin token also issues users' own tokens
TOKEN_ISSUER = (
    'c.JupyterHub.load_roles.append({"name": "token-issuer", "scopes": ["tokens"], '
    f'"services": ["{ADMIN_SERVICE}"]}})\n'
)
#: a server's pod leaves a node that stopped answering 2 s after it is tainted (the
#: default is 5 minutes): an operator's choice, made here to keep the test short
SHORT_EVICTION = (
    "c.KubeSpawner.tolerations = ["
    + ", ".join(
        f'{{"key": "node.kubernetes.io/{key}", "operator": "Exists", '
        f'"effect": "NoExecute", "tolerationSeconds": 2}}'
        for key in ("not-ready", "unreachable")
    )
    + "]\n"
)
HOLD = "example.com/hold"


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory) -> LocalCluster:
    import os

    directory = tmp_path_factory.mktemp("cluster-faults")
    cluster = LocalCluster.create(
        name=f"pytest-cluster-faults-{os.getpid()}",
        directory=Path(directory),
        node_pools=NODE_POOLS,
    )
    yield cluster
    cluster.down()


@pytest.fixture(scope="module")
async def kube(local_cluster):
    async with local_cluster.api() as api_client:
        yield api_client


@pytest.fixture(scope="module")
def core(kube) -> client.CoreV1Api:
    return client.CoreV1Api(kube)


@pytest.fixture(scope="module")
def coordination(kube) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(kube)


@pytest.fixture(scope="module")
async def fault_hub(local_cluster, core, priority_class_objects):
    """One hub with its service for the module: it notices a server's pod gone within
    2 s, resyncs its ledger every second, and the service polls the hub every second."""
    async with running_hub(
        local_cluster,
        core,
        users=USERS,
        admin_users=("root",),
        policy=POLICY,
        gpu_service=True,
        service_settings={"rules_interval": 1, "hub_poll_interval": 1},
        extra_config=(
            "c.GPUKubeSpawner.ledger_resync_interval = 1\n"
            "c.Spawner.poll_interval = 2\n"
            "c.KubeSpawner.http_timeout = 120\n" + SHORT_EVICTION + TOKEN_ISSUER
        ),
    ) as hub:
        await wait_for_service(hub)
        hub.root_token = await user_token(hub, "root")
        yield hub


@pytest.fixture
async def hub(fault_hub, core):
    """The module's hub; every server stopped, and every pod gone, after each test."""
    yield fault_hub
    # a test that failed while a pod was held leaves the hold: lift it, or the pod stays
    for pod in await server_pods(core, fault_hub.namespace):
        if HOLD in (pod.metadata.finalizers or []):
            await core.patch_namespaced_pod(
                pod.metadata.name, fault_hub.namespace, {"metadata": {"finalizers": None}}
            )
    for user in USERS:
        await api(fault_hub, "DELETE", f"/users/{user}/server")
    await eventually(
        lambda: no_pods(core, fault_hub.namespace), "every server pod to be gone", within=90
    )


async def no_pods(core, namespace: str) -> bool:
    return not (await core.list_namespaced_pod(namespace)).items


async def start(hub, user: str) -> None:
    status, body = await api(hub, "POST", f"/users/{user}/server", GPU)
    assert status in (201, 202), (
        f"{user}'s spawn: {status} {body}; the hub's log ends:\n{log_tail(hub)}"
    )
    try:
        await eventually(lambda: ready(hub, user), f"{user}'s server", within=120)
    except AssertionError as e:
        raise AssertionError(f"{e}; the hub's log ends:\n{log_tail(hub)}") from e


def log_tail(hub) -> str:
    return hub.log_path.read_text(errors="replace")[-6000:]


async def refusal(hub, user: str) -> str:
    """The hub's answer to a GPU spawn of ``user`` that the group's quota refuses."""
    status, body = await api(hub, "POST", f"/users/{user}/server", GPU)
    assert status == 403, f"{user}'s spawn was not refused: {status} {body}"
    return body["message"]


async def server_pods(core, namespace: str) -> list:
    listed = await core.list_namespaced_pod(namespace, label_selector="gpu.jupyterhub.org/group")
    return listed.items


async def lab_used(hub) -> float:
    """The GPUs the service's api/usage has lab using."""
    view, _ = await usage(hub, hub.root_token)
    return next(g for g in view["groups"] if g["name"] == "lab")["gpus"]["used"]


async def dashboard_gpus(hub) -> str:
    """The lab card's GPU line on the service's dashboard, e.g. ``2 of 2 GPUs``."""
    status, _, page = await aget(hub.service_url, hub.root_token)
    assert status == 200, page
    found = re.search(r'data-group="lab">.*?<span>GPUs</span><span>([^<]*)</span>', page, re.DOTALL)
    assert found, f"no GPU line in the dashboard's lab card: {page[:2000]}"
    return found.group(1)


async def profile_line(hub, user: str) -> str:
    """The spawn page's description of lab's GPU profile, as ``user`` sees it."""
    page = await asyncio.to_thread(page_as, hub.url, user, hub.password)
    found = re.search(r"Lab: [0-9.]+ of 2 GPUs free · cluster: [^<]*", page)
    shown = page[page.find("Lab: ") - 200 : page.find("Lab: ") + 300] if "Lab: " in page else page
    assert found, f"no lab GPU profile with its free GPUs on {user}'s spawn page: {shown}"
    return found.group(0)


async def charged_as_the_pods_are(hub, core, expected: int) -> None:
    """The hub's ledger, the service and its dashboard all count ``expected`` GPUs for
    lab, and so many of lab's server pods exist (terminating ones included)."""
    assert len(await server_pods(core, hub.namespace)) == expected

    async def service_agrees():
        return await lab_used(hub) == expected

    await eventually(service_agrees, f"the service's api/usage to count {expected} GPUs")
    assert (await dashboard_gpus(hub)).startswith(f"{expected} of 2")
    free = 2 - expected
    assert (await profile_line(hub, "dan")).startswith(f"Lab: {free} of 2 GPUs free")


async def capacity_known_again(hub) -> None:
    """After an outage the spawn page's capacity comes back within the watches' longest
    retry (30 s): until they relist, the page says capacity is unknown, which is true,
    not a wrong count (``charged_as_the_pods_are`` checks the count)."""

    async def known():
        page = await asyncio.to_thread(page_as, hub.url, "dan", hub.password)
        return "cluster capacity unknown" not in page

    await eventually(known, "the spawn page to show cluster capacity again", within=45)


async def test_a_terminating_pod_stays_charged_until_it_is_gone(hub, core):
    await start(hub, "ann")
    await start(hub, "bob")
    (ann_pod,) = [p for p in await server_pods(core, hub.namespace) if "ann" in p.metadata.name]
    # something (a storage driver, a backup tool) holds the pod with a finalizer (and
    # the local cluster's kwok is told to leave it, as a kubelet does)
    hold = {"finalizers": [HOLD], "annotations": {KEEP_FINALIZERS: "true"}}
    await core.patch_namespaced_pod(ann_pod.metadata.name, hub.namespace, {"metadata": hold})
    status, _ = await api(hub, "DELETE", "/users/ann/server")
    assert status in (202, 204)

    async def terminating():
        pod = await core.read_namespaced_pod(ann_pod.metadata.name, hub.namespace)
        return pod.metadata.deletion_timestamp is not None

    await eventually(terminating, "ann's pod to be terminating")
    # several ledger resyncs (every second) and service passes while it terminates: the
    # GPU it holds is still lab's, and cat is refused
    await asyncio.sleep(3)
    assert await refusal(hub, "cat") == FULL
    await charged_as_the_pods_are(hub, core, 2)
    view, _ = await usage(hub, hub.root_token)
    assert view["orphans"] == []  # on its way out, not an orphan

    # the finalizer is removed: the pod goes, its charge with it, and cat starts
    await core.patch_namespaced_pod(
        ann_pod.metadata.name, hub.namespace, {"metadata": {"finalizers": None}}
    )

    async def cat_admitted():
        status, body = await api(hub, "POST", "/users/cat/server", GPU)
        assert status in (201, 202, 403), body
        return status in (201, 202) or None

    await eventually(cat_admitted, "cat's spawn once ann's pod is gone", within=60)
    await eventually(lambda: ready(hub, "cat"), "cat's server", within=120)
    await charged_as_the_pods_are(hub, core, 2)


async def restart_kwok(local_cluster, core, coordination, node: str, managed: bool) -> None:
    """kwok is every node's kubelet here. It manages the nodes annotated as its own, but
    filters them on its side and never hears that one stopped matching, nor does a
    Lease someone else takes stop it reliably: so ``node``'s annotation is changed and
    kwok restarted, managing every node but that one (or all of them again). The new
    kwok has a new identity and would wait out the old one's node Leases (40 s): they
    are deleted while it is down, and it takes them at once."""
    key, value = KWOK_ANNOTATION
    annotation = value if managed else "stopped-by-tests"
    await core.patch_node(node, {"metadata": {"annotations": {key: annotation}}})
    await asyncio.to_thread(local_cluster.stop_component, "kwok")
    await coordination.delete_collection_namespaced_lease("kube-node-lease")
    await asyncio.to_thread(local_cluster.start_component, "kwok")
    nodes = [n.metadata.name for n in (await core.list_node()).items]
    expected = {n for n in nodes if managed or n != node}

    async def leases_taken() -> bool:
        leases = await coordination.list_namespaced_lease("kube-node-lease")
        return {lease.metadata.name for lease in leases.items} == expected

    await eventually(leases_taken, f"kwok to take the Leases of {sorted(expected)}")


async def stop_answering(local_cluster, core, coordination, node: str) -> None:
    """``node``'s kubelet stops answering, its last report NotReady (its container
    runtime down, say): no heartbeat, no status, its pods left as they are (an evicted
    one stays Terminating). The node lifecycle controller taints it."""
    await restart_kwok(local_cluster, core, coordination, node, managed=False)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "KubeletNotReady",
        "message": "container runtime is down",
        "lastHeartbeatTime": now,
    }
    await core.patch_node_status(node, {"status": {"conditions": [ready]}})

    async def tainted_not_ready() -> bool:
        taints = (await core.read_node(node)).spec.taints or []
        return any(
            t.key == "node.kubernetes.io/not-ready" and t.effect == "NoExecute" for t in taints
        )

    await eventually(tainted_not_ready, f"{node} to be tainted not-ready", within=60)


async def test_a_node_that_goes_not_ready_keeps_charges_and_capacity_true(
    hub, core, coordination, local_cluster
):
    await start(hub, "ann")
    await start(hub, "bob")
    pods = {p.metadata.name: p for p in await server_pods(core, hub.namespace)}
    node = pods["jupyter-ann"].spec.node_name
    on_node = sorted(n for n, p in pods.items() if p.spec.node_name == node)
    elsewhere = len(pods) - len(on_node)
    await stop_answering(local_cluster, core, coordination, node)
    try:
        # the node's GPUs leave the free capacity at once: the spawn page and the
        # service's api/usage say the other node's only
        expected = f"cluster: {2 - elsewhere} of 2 GPUs free"

        async def capacity_dropped() -> bool:
            view, _ = await usage(hub, hub.root_token)
            (h200,) = view["capacity"]["flavors"]
            line = await profile_line(hub, "dan")
            return h200["allocatable"] == 2 and line.endswith(expected)

        await eventually(capacity_dropped, f"the profile list to say {expected!r}")

        # the taint evicts the node's server pods after their 2 s toleration; with no
        # kubelet to stop them they stay Terminating, still holding their GPUs: the
        # ledger, api/usage and the dashboard count them, and cat is refused
        async def evicted() -> bool:
            listed = {p.metadata.name: p for p in await server_pods(core, hub.namespace)}
            return all(listed[n].metadata.deletion_timestamp for n in on_node)

        await eventually(evicted, f"{on_node} to be evicted from {node}", within=60)
        await asyncio.sleep(3)  # several ledger resyncs and service passes meanwhile
        await charged_as_the_pods_are(hub, core, 2)
        assert await refusal(hub, "cat") == FULL
        # and the hub still has those servers (Kubernetes does not know them gone)
        for name in on_node:
            assert not await no_server_of(hub, name.removeprefix("jupyter-")), name

        # the operator, knowing the node dead, deletes them for good (docs/operations.md):
        # the hub sees those servers stopped, and they are charged no more, anywhere
        for name in on_node:
            await core.delete_namespaced_pod(name, hub.namespace, grace_period_seconds=0)
        for name in on_node:
            user = name.removeprefix("jupyter-")
            await eventually(
                lambda user=user: no_server_of(hub, user), f"the hub to see {user}'s server stopped"
            )
        await charged_as_the_pods_are(hub, core, elsewhere)

        # ann starts again, on the node that answers: one charge for her, not two
        await start(hub, "ann")
        now = await server_pods(core, hub.namespace)
        assert all(p.spec.node_name != node for p in now), [p.spec.node_name for p in now]
        assert [p.metadata.name for p in now].count("jupyter-ann") == 1
        await charged_as_the_pods_are(hub, core, elsewhere + 1)
        if elsewhere + 1 == 2:
            assert await refusal(hub, "cat") == FULL
    finally:
        await restart_kwok(local_cluster, core, coordination, node, managed=True)

    async def node_back() -> bool:
        used = len(await server_pods(core, hub.namespace))
        return (await profile_line(hub, "dan")).endswith(f"cluster: {4 - used} of 4 GPUs free")

    await eventually(node_back, f"{node}'s GPUs to be free again in the profile list", within=60)


async def no_server_of(hub, user: str) -> bool:
    _, model = await api(hub, "GET", f"/users/{user}")
    return model["servers"] == {}


async def test_the_watches_resume_after_the_api_server_restarts(hub, core, local_cluster):
    await start(hub, "ann")
    await start(hub, "bob")
    # ann's pod goes right before the API server stops: the watches may or may not
    # see it go before the restart
    await core.delete_namespaced_pod("jupyter-ann", hub.namespace, grace_period_seconds=0)
    await asyncio.to_thread(local_cluster.stop_component, "kube-apiserver")
    try:
        await asyncio.sleep(2)  # down long enough for every watch to lose its stream
    finally:
        await asyncio.to_thread(local_cluster.start_component, "kube-apiserver")
    # no hub restart: the hub's ledger, its pod watch and the service's follow
    await eventually(
        lambda: no_server_of(hub, "ann"), "the hub to see ann's server stopped", within=60
    )
    await capacity_known_again(hub)
    await charged_as_the_pods_are(hub, core, 1)
    # a server starts after the restart: the hub's pod watch sees it ready, the
    # ledger and the service count it
    await start(hub, "cat")
    await charged_as_the_pods_are(hub, core, 2)
    assert await refusal(hub, "ann") == FULL
