"""Helpers for tests with a real hub: namespaces, REST calls, and the cluster objects pods need."""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import json
import re
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException
from rbac_helpers import apply_rendered_rbac, token_kubeconfig
from rbac_helpers import remove as remove_rbac

from jupyterhub_gpu.core.manifests import namespace_objects, priority_classes
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu_dev.localcluster.cluster import LocalCluster
from jupyterhub_gpu_dev.localcluster.hub import LocalHub
from kube_helpers import eventually

#: KAI installs these itself; here they stand in for its chart
KAI_PRIORITY_CLASSES = [("build", 100), ("build-preemptible", 75)]


async def create_priority_classes(kube) -> None:
    """Our PriorityClasses, KAI's, and the GPU Operator's RuntimeClass (idempotent)."""
    scheduling = client.SchedulingV1Api(kube)
    # with fair share: its burst bands too
    objects = priority_classes(parse_policy(fair_share={"half_life": "1d"}))
    objects += [
        {"metadata": {"name": n}, "value": v, "globalDefault": False}
        for n, v in KAI_PRIORITY_CLASSES
    ]
    for body in objects:
        try:
            await scheduling.create_priority_class(body)
        except ApiException as e:
            if e.status != 409:
                raise
    # the GPU Operator's RuntimeClass, which pods of runtime_class_name flavors name
    try:
        await client.NodeV1Api(kube).create_runtime_class(
            {"metadata": {"name": "nvidia"}, "handler": "nvidia"}
        )
    except ApiException as e:
        if e.status != 409:
            raise


async def fresh_namespace(core) -> str:
    name = f"hub-{uuid.uuid4().hex[:8]}"
    await core.create_namespace({"metadata": {"name": name}})

    async def account():
        items = (await core.list_namespaced_service_account(name)).items
        return any(a.metadata.name == "default" for a in items)

    await eventually(account, "the default service account")
    return name


def logged_in_opener(url: str, user: str, password: str) -> urllib.request.OpenerDirector:
    """A cookie-keeping opener logged in through the hub's login form, as a browser is."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    login = opener.open(f"{url}/hub/login", timeout=30).read().decode()
    xsrf = re.search(r'name="_xsrf"\s+value="([^"]+)"', login)
    form = {"username": user, "password": password, **({"_xsrf": xsrf.group(1)} if xsrf else {})}
    opener.open(f"{url}/hub/login", urllib.parse.urlencode(form).encode(), timeout=30).read()
    return opener


def page_as(url: str, user: str, password: str, path: str = "/hub/spawn") -> str:
    """Log in through the hub's login form as a browser would; the page at ``path``."""
    opener = logged_in_opener(url, user, password)
    return opener.open(f"{url}{path}", timeout=60).read().decode()


async def api(hub: LocalHub, method: str, path: str, body=None):
    return await asyncio.to_thread(hub.api, method, path, body)


async def server(hub: LocalHub, user: str) -> dict | None:
    """``user``'s default server as the hub's REST API describes it; None when it has none."""
    _, model = await api(hub, "GET", f"/users/{user}")
    return model["servers"].get("")


async def ready(hub: LocalHub, user: str) -> bool:
    found = await server(hub, user)
    return bool(found and found["ready"])


async def no_server(hub: LocalHub, user: str) -> bool:
    return await server(hub, user) is None


async def pod_json(core, namespace: str, name: str) -> dict:
    response = await core.read_namespaced_pod(name, namespace, _preload_content=False)
    return json.loads(await response.read())


async def wait_no_pods(core, namespace: str) -> None:
    async def empty():
        return not (await core.list_namespaced_pod(namespace)).items

    await eventually(empty, f"no pods left in {namespace}", within=60)


def progress_messages(hub: LocalHub, user: str, until: str, within: float = 90) -> list[str]:
    """The spawn page's progress messages for ``user``, read until one contains ``until``.

    Reads the same event stream the spawn page shows (``.../server/progress``).
    """
    request = urllib.request.Request(
        f"{hub.url}/hub/api/users/{user}/server/progress",
        headers={"Authorization": f"token {hub.api_token}"},
    )
    messages: list[str] = []
    deadline = time.monotonic() + within
    with urllib.request.urlopen(request, timeout=within) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("data:"):
                messages.append(json.loads(line.removeprefix("data:")).get("message", ""))
                if until in messages[-1]:
                    return messages
            if time.monotonic() > deadline:
                break
    raise AssertionError(f"no progress message with {until!r} for {user}; got {messages}")


class Relay:
    """A loopback TCP relay to the API server that a test can cut and restore.

    The hub reaches Kubernetes through it, so cutting it makes the API server
    unreachable for the hub alone, mid-spawn, while the test keeps its own client.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()

    async def start(self) -> Relay:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.connections |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter):
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.connections -= {writer, up_writer}

    async def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        assert self.server
        self.server.close()
        for connection in list(self.connections):
            connection.close()
        self.connections.clear()
        await self.server.wait_closed()

    async def restore(self) -> None:
        await self.start()

    async def ensure_serving(self) -> None:
        """Restore the relay if a test left it cut."""
        if self.server is None or not self.server.is_serving():
            await self.restore()

    def kubeconfig(self, original: Path, directory: Path) -> Path:
        """A copy of ``original`` whose server is this relay."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path = directory / "relay.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path


def group_namespaces(policy: dict | None) -> list[str]:
    """The namespaces a ``namespace_per_group`` policy has the service create."""
    if not policy or not policy.get("namespace_per_group"):
        return []
    objects = namespace_objects(parse_policy(**policy), hub_namespace="")
    return [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]


async def delete_namespace(core, name: str) -> None:
    try:
        await core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


async def stop_hub(hub: LocalHub, core) -> None:
    """Stop every user's server, wait until no pod is left, and stop the hub.

    The hub is stopped even when its servers' pods outlive the wait (that failure is
    then raised): the cluster is shared, and a pod left behind holds its GPUs.
    """
    try:
        if hub.process is not None and hub.process.poll() is None:
            answers = {}
            for user in hub.users:
                answers[user] = await stop_server(hub, user)
                for name in await named_servers(hub, user):
                    await stop_server(hub, user, name)
            try:
                await wait_no_pods(core, hub.namespace)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{await left_behind(hub, core, answers)}") from None
    finally:
        await asyncio.to_thread(hub.stop)


async def named_servers(hub: LocalHub, user: str) -> list[str]:
    """The names of the user's named servers the hub has (none without named servers)."""
    status, model = await api(hub, "GET", f"/users/{user}")
    return [name for name in model["servers"] if name] if status == 200 else []


async def stop_server(hub: LocalHub, user: str, name: str = "", within: float = 60) -> int:
    """DELETE the user's server (``name``: a named one), as a user presses Stop again
    while the hub says it cannot: JupyterHub gives a spawn it interrupts one second to
    end, then answers 500 ("pending spawn") and stops nothing. The hub's last answer."""
    path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
    deadline = time.monotonic() + within
    while True:
        status, _ = await api(hub, "DELETE", path)
        if status < 500 or time.monotonic() > deadline:
            return status
        await asyncio.sleep(2)


async def left_behind(hub: LocalHub, core, answers: dict[str, int]) -> str:
    """What a teardown found still there, and what the hub said of it: enough to tell
    a stop the hub never made from a pod Kubernetes was slow to remove."""
    lines = []
    for pod in (await core.list_namespaced_pod(hub.namespace)).items:
        meta = pod.metadata
        lines.append(
            f"pod {meta.name}: phase {pod.status.phase}, node {pod.spec.node_name},"
            f" deletion {meta.deletion_timestamp}, finalizers {meta.finalizers}"
        )
        user = (meta.annotations or {}).get("hub.jupyter.org/username")
        if user in answers:
            lines.append(f"  the hub answered DELETE /users/{user}/server with {answers[user]}")
        log = hub.log_path.read_text(errors="replace").splitlines()
        lines += ["  " + line for line in log if meta.name in line or (user and user in line)][-15:]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def running_hub(
    cluster: LocalCluster,
    core,
    *,
    start: bool = True,
    rendered_rbac: bool = True,
    **settings: Any,
) -> AsyncIterator[LocalHub]:
    """A ``LocalHub`` in a fresh namespace; afterwards its servers, the hub and the
    namespace are gone, and so are the group namespaces of a ``namespace_per_group`` policy.

    ``settings`` are LocalHub's (``policy``, ``users``, ``extra_config``, ...). With
    ``start=False`` the caller starts the hub, e.g. after making objects in its namespace.

    Unless given a ``kubeconfig``, the hub and its GPU service authenticate as the hub's
    service account, granted what a real install grants: z2jh's Role in the hub's
    namespace and the RBAC ``jupyterhub-gpu manifests`` renders for the policy (the
    group namespaces made as the admin applies them). ``rendered_rbac=False`` runs them
    as the cluster's administrator (a test whose policy changes while the hub runs).
    """
    namespace = await fresh_namespace(core)
    hub: LocalHub | None = None
    try:
        if rendered_rbac and "kubeconfig" not in settings:
            # the hub and its service run as z2jh's hub service account, with exactly the
            # chart's Role and the RBAC `jupyterhub-gpu manifests` renders for the policy
            kubeconfig = await hub_account(cluster, core, namespace, settings.get("policy"))
            settings["kubeconfig"] = kubeconfig
            settings.setdefault("service_kubeconfig", kubeconfig)
        hub = LocalHub(cluster, namespace=namespace, **settings)
        if start:
            await asyncio.to_thread(hub.start)
        yield hub
    finally:
        try:
            if hub is not None:
                await stop_hub(hub, core)
        finally:
            for name in [namespace, *group_namespaces(hub and hub.policy)]:
                await delete_namespace(core, name)
            await remove_rbac(core.api_client, namespace)


async def hub_account(cluster: LocalCluster, core, namespace: str, policy: dict | None) -> Path:
    """The hub's service account in ``namespace`` with the chart's Role and the rendered
    RBAC of ``policy`` (applied again after a policy change, as an admin does); a
    kubeconfig with its token."""
    await apply_policy_rbac(core, namespace, policy)
    directory = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-hub-account-"))
    return await token_kubeconfig(
        core.api_client, cluster.state.kubeconfig, namespace, "hub", directory / "hub.kubeconfig"
    )


async def apply_policy_rbac(core, namespace: str, policy: dict | None) -> None:
    """What an admin applies for ``policy`` (``jupyterhub-gpu manifests``) before the hub
    runs it."""
    from jupyterhub_gpu.core.model import PolicyError

    try:
        model = parse_policy(**policy) if policy is not None else None
    except (PolicyError, TypeError):
        model = None  # a test of a policy the hub refuses: the chart's Role alone
    await apply_rendered_rbac(core.api_client, model, namespace, create_hub_namespace=False)


class HubFactory:
    """Starts hubs for one test (the ``hub_factory`` fixture) and cleans each up after
    it, the last started first; see ``running_hub``."""

    def __init__(
        self, cluster: LocalCluster, core, stack: contextlib.AsyncExitStack, directory: Path
    ) -> None:
        self.cluster = cluster
        self.core = core
        self.stack = stack
        self.directory = directory

    async def __call__(self, **settings: Any) -> LocalHub:
        """A started hub in a fresh namespace, with LocalHub's ``settings``."""
        return await self.stack.enter_async_context(
            running_hub(self.cluster, self.core, **settings)
        )

    async def behind_relay(
        self, service_behind_relay: bool = False, **settings: Any
    ) -> tuple[Relay, LocalHub]:
        """A started hub that reaches the API server through a ``Relay`` the test can
        cut (its GPU service too with ``service_behind_relay``, as in a hub pod); the
        relay is restored before the hub is cleaned up, and closed after."""
        relay = await Relay(self.cluster.state.ports["apiserver"]).start()
        self.stack.push_async_callback(relay.cut)
        directory = self.directory / f"relay-{relay.port}"
        directory.mkdir()
        kubeconfig = relay.kubeconfig(self.cluster.state.kubeconfig, directory)
        if service_behind_relay:
            settings["service_kubeconfig"] = kubeconfig
        hub = await self(kubeconfig=kubeconfig, **settings)
        self.stack.push_async_callback(relay.ensure_serving)
        return relay, hub
