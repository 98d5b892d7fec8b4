"""Helpers for tests with a real hub: namespaces, REST calls, and the cluster objects pods need."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from pathlib import Path

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from jupyterhub_gpu.core.manifests import priority_classes
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu.dev.localcluster.hub import LocalHub
from kube_helpers import eventually

#: KAI installs these itself; here they stand in for its chart
KAI_PRIORITY_CLASSES = [("build", 100), ("build-preemptible", 75)]


async def create_priority_classes(kube) -> None:
    """Our PriorityClasses, KAI's, and the GPU Operator's RuntimeClass (idempotent)."""
    scheduling = client.SchedulingV1Api(kube)
    objects = priority_classes(parse_policy())
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


async def api(hub: LocalHub, method: str, path: str, body=None):
    return await asyncio.to_thread(hub.api, method, path, body)


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

    def kubeconfig(self, original: Path, directory: Path) -> Path:
        """A copy of ``original`` whose server is this relay."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path = directory / "relay.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path
