"""A server whose process exits as it starts: its spawn fails at once, saying why.

Two moments a start can see the exit (``core.exits`` reads it from the pod):

- while KubeSpawner waits for the pod to run: a container that exits before it is
  ever ready (``is_pod_running`` raises ``ServerExited``, so the wait ends now,
  not after ``start_timeout``);
- after the pod runs, until the server's port takes connections: a process that
  exits after the kubelet called it running (JupyterHub would wait
  ``http_timeout`` for a server that is gone, then say only that it never showed
  up). The wait ends at the latest when JupyterHub's own bounds would.

The spawn then fails with the exit code and the last lines of the server's log:
the kubelet's termination message, which ``terminationMessagePolicy:
FallbackToLogsOnError`` (set on the server's container unless the site set one)
fills with the end of the log of a container that failed; else the log read
through the API (``pods/log``, which z2jh's hub Role does not grant: the message
then says the log could not be read, and why).
JupyterHub then stops the server: its pod is deleted and its charge released.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from kubernetes_asyncio.client import ApiException

from ..core.exits import (
    LOG_LINES,
    NOTEBOOK_CONTAINER,
    ContainerExit,
    container_exit,
    exit_html,
    exit_message,
    log_tail,
)
from ..kube.client import exception_message
from .checks import SpawnRefused
from .ports import ExitWatcher

#: the status of a spawn whose server exited: the request was sound and the hub is
#: well; what was asked for cannot run (a 4xx is not counted as the hub failing)
EXITED_STATUS = 422
#: seconds between looks at a started server's port
PORT_POLL = 0.5


class ServerExited(Exception):
    """The server's container exited during its start."""

    def __init__(self, exited: ContainerExit, pod: dict[str, Any]) -> None:
        super().__init__(f"the server's container exited with {exited.exit_code}")
        self.exited = exited
        self.pod = pod


def raise_if_exited(pod: dict[str, Any] | None) -> None:
    exited = container_exit(pod)
    if exited is not None and pod is not None:
        raise ServerExited(exited, pod)


async def _port_open(host: str, port: int, within: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), within)
    except (OSError, TimeoutError):
        return False
    writer.close()
    # the connection was only to see that the port takes one
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def wait_until_serving(spawner: ExitWatcher, url: str, key: str, until: float) -> None:
    """Until the server at ``url`` takes connections (JupyterHub's own wait then
    checks it over HTTP), or ``time.monotonic()`` passes ``until``; ``ServerExited``
    when its pod (``key`` in KubeSpawner's pod watch) reports the container's exit."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    while True:
        raise_if_exited(spawner.pod_reflector.pods.get(key))
        left = until - time.monotonic()
        if left <= 0:
            return
        if await _port_open(host, port, min(2.0, left)):
            return
        await asyncio.sleep(min(PORT_POLL, max(until - time.monotonic(), 0)))


async def _log(spawner: ExitWatcher, error: ServerExited) -> tuple[list[str], str | None]:
    """The end of the server's log, and why it could not be read.

    The kubelet's termination message first: it is the end of the log of a container
    that failed (``FallbackToLogsOnError``), in the pod the hub already has, and needs
    no ``pods/log`` permission. Otherwise (a clean exit, a site's own policy) the log
    through the API.
    """
    if error.exited.message and (lines := log_tail(error.exited.message)):
        return lines, None
    meta = error.pod["metadata"]
    try:
        text = await asyncio.wait_for(
            spawner.api.read_namespaced_pod_log(
                meta["name"],
                meta["namespace"],
                container=_container_name(error.pod),
                tail_lines=LOG_LINES,
                # restarted since it exited: that run's log is the previous one
                previous=error.exited.restarted,
            ),
            spawner.k8s_api_request_timeout,
        )
    except ApiException as e:
        return [], f"the API server answered {e.status}: {exception_message(e)}"
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        return [], f"the API server could not be reached ({type(e).__name__})"
    return log_tail(text if isinstance(text, str) else ""), None


def _container_name(pod: dict[str, Any]) -> str:
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    return NOTEBOOK_CONTAINER if NOTEBOOK_CONTAINER in names or not names else names[0]


async def exited_refusal(spawner: ExitWatcher, error: ServerExited) -> SpawnRefused:
    """The spawn's failure in words, the end of the server's log in it."""
    log, log_error = await _log(spawner, error)
    message = exit_message(error.exited, log, log_error)
    meta = error.pod["metadata"]
    spawner.log.warning(
        "%s: pod %s/%s: %s", spawner._log_name, meta["namespace"], meta["name"], message
    )
    refusal = SpawnRefused(message, EXITED_STATUS)
    # the spawn page shows this instead of the plain text, its log lines as lines
    refusal.jupyterhub_html_message = exit_html(error.exited, log, log_error)
    return refusal
