"""The local pod runner: what a Running pod describes, run as a local process.

kwok makes pods Running with a loopback IP but runs nothing. For the pods a hub
spawns, that is not enough: the hub must really reach the notebook server. The
pod runner watches pods; when one is Running it starts the first container's
command, if that command is one it is allowed to run and exists locally, as a
process bound to the pod's IP, with the pod's environment (values, secrets,
config maps and field references resolved the way the kubelet would). When the
pod is deleted, the process group is stopped; when the process exits on its
own, the pod is marked Succeeded or Failed, as a kubelet would report it: the
container ``terminated`` with its exit code, and, for a container with
``terminationMessagePolicy: FallbackToLogsOnError`` that failed, the end of its
log as the termination message (the kubelet's last 80 lines, at most 2048 bytes).
Its log itself is not served through the API (kwok's nodes run no kubelet API):
it is in the runner's folder, ``logs/``.

The Jupyter Docker Stacks images start ``jupyterhub-singleuser`` when they are
given no command and a hub token (``start-notebook.py``); the runner does the
same, so stock KubeSpawner pods run unchanged.

Every server runs from this machine's Python environment, as if every image
were the same one. When code-server is installed (``jupyterhub_gpu_dev.codeserver``,
looked up at each start) its folder is on the server's PATH and the server's home
gets the offline config an image with VS Code would carry, so
``jupyter-vscode-proxy`` serves VS Code at ``/vscode/``.

Volumes: a container's mounts are made visible in the server's home, which is
also its working and root directory, since the process cannot mount anything.
For each ``volumeMount`` of the first container whose volume is a ``hostPath``,
an ``nfs`` volume of a loopback server (127.0.0.0/8: the export's path is a
folder on this machine), or a ``persistentVolumeClaim`` bound to a
PersistentVolume of either kind, ``<home>/<mountPath without its leading />``
(``subPath`` appended to the source) is a symlink to that folder: a dataset
mounted at ``/data/imagenet`` is ``data/imagenet`` in the file browser. It is not
read-only even where the mount says so (a symlink cannot be), and an existing
file or folder of the user's at that place is left alone (the mount is skipped,
with a warning in the runner's log). Every other volume stays simulated.

Run by the local cluster as ``python -m jupyterhub_gpu_dev.localcluster.podrunner``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger("jupyterhub_gpu.podrunner")

#: Commands the runner starts. Anything else stays a simulated (empty) pod.
DEFAULT_ALLOWED = ("jupyterhub-singleuser", "jupyter", "jupyter-lab", "jupyter-labhub")
#: Docker Stacks entry points and what they run when a hub token is present.
_STACKS_ENTRYPOINTS = {
    "start-notebook.py": "jupyterhub-singleuser",
    "start-notebook.sh": "jupyterhub-singleuser",
    "start-singleuser.py": "jupyterhub-singleuser",
    "start-singleuser.sh": "jupyterhub-singleuser",
}
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
#: what a kubelet keeps of a failed container's log as its termination message
#: (kubelet: MaxContainerTerminationMessageLogLines, ...LogLength)
TERMINATION_LOG_LINES = 80
TERMINATION_LOG_BYTES = 2048


class NotRunnable(Exception):
    """This pod stays simulated; the message says why."""


@dataclass
class LocalProcess:
    key: str
    process: asyncio.subprocess.Process
    home: Path
    grace: float
    #: the symlinks standing in for its mounts, removed when it ends
    links: list[Path] = field(default_factory=list)


def container_argv(container: dict, env: dict[str, str], allowed: tuple[str, ...]) -> list[str]:
    """The local command line for a container, or NotRunnable."""
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    if not argv:
        if "JUPYTERHUB_API_TOKEN" not in env:
            raise NotRunnable("no command and no hub token: nothing known to run")
        argv = ["jupyterhub-singleuser"]
    if argv[0] in _STACKS_ENTRYPOINTS:
        argv = [_STACKS_ENTRYPOINTS[argv[0]], *argv[1:]]
    name = os.path.basename(argv[0])
    if name not in allowed:
        raise NotRunnable(f"command {name!r} is not in the runner's allow-list")
    resolved = shutil.which(argv[0])
    if not resolved:
        raise NotRunnable(f"command {argv[0]!r} is not installed locally")
    return [resolved, *argv[1:]]


def termination_message(container: dict, code: int, log: bytes) -> str | None:
    """The message a kubelet reports for a container that exited with ``code``: with
    ``FallbackToLogsOnError`` and an error, the end of its log; else none (the
    runner's containers write no termination-log file)."""
    if code == 0 or container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return None
    tail = b"\n".join(log.splitlines()[-TERMINATION_LOG_LINES:])[-TERMINATION_LOG_BYTES:]
    return tail.decode(errors="replace") or None


def bind_to_pod_ip(argv: list[str], env: dict[str, str], pod_ip: str) -> tuple[list[str], dict]:
    """Make the server listen on the pod's own loopback address, never 0.0.0.0."""
    env = dict(env)
    service_url = env.get("JUPYTERHUB_SERVICE_URL")
    if service_url:
        url = urllib.parse.urlsplit(service_url)
        netloc = f"{pod_ip}:{url.port or 8888}"
        env["JUPYTERHUB_SERVICE_URL"] = urllib.parse.urlunsplit(url._replace(netloc=netloc))
    out = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg.startswith(("--ip=", "--ServerApp.ip=", "--NotebookApp.ip=")):
            out.append(arg.split("=", 1)[0] + "=" + pod_ip)
        elif arg in ("--ip", "--ServerApp.ip") and i + 1 < len(argv):
            out += [arg, pod_ip]
            skip = True
        else:
            out.append(arg)
    if "JUPYTERHUB_SERVICE_URL" not in env and not any(a.startswith("--ip") for a in out):
        out.append(f"--ip={pod_ip}")
    return out, env


def is_loopback_server(server: str | None) -> bool:
    """An NFS server on this machine: ``localhost`` or a loopback address."""
    if server == "localhost":
        return True
    try:
        return ipaddress.ip_address(server or "") in _LOOPBACK
    except ValueError:
        return False  # a host name: another machine's export


def volume_folder(source: Mapping) -> str | None:
    """The local folder a volume source is, if it is one on this machine: a
    ``hostPath``, or an ``nfs`` export of a loopback server."""
    if "hostPath" in source:
        return source["hostPath"]["path"]
    nfs = source.get("nfs")
    if nfs and is_loopback_server(nfs.get("server")):
        return nfs["path"]
    return None


def local_mounts(
    container: Mapping, volumes: list[Mapping], bound: Mapping[str, Mapping]
) -> list[tuple[str, str]]:
    """(place in the home, local folder) for each of the container's mounts the runner
    links; ``bound``: claim name -> the spec of the PersistentVolume it is bound to."""
    by_name = {v["name"]: v for v in volumes}
    found = []
    for mount in container.get("volumeMounts") or []:
        volume = by_name.get(mount["name"])
        if volume is None:
            continue
        claim = volume.get("persistentVolumeClaim")
        folder = volume_folder(bound.get(claim["claimName"], {}) if claim else volume)
        place = mount["mountPath"].strip("/")
        if folder is None or not place or ".." in place.split("/"):
            continue
        if mount.get("subPath"):
            folder = os.path.join(folder, mount["subPath"])
        found.append((place, folder))
    return found


def link_mounts(home: Path, mounts: list[tuple[str, str]]) -> list[Path]:
    """Make each mount a symlink in ``home``; the links made. A user's own file or
    folder at that place is left alone, with a warning."""
    links = []
    for place, folder in mounts:
        link = home / place
        if link.is_symlink():
            link.unlink()  # an earlier start's (a runner killed outright leaves them)
        elif link.exists():
            log.warning(
                "%s is the user's own, not linked to %s (the volume mounted there): "
                "move it away to see the volume",
                link,
                folder,
            )
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder)
        links.append(link)
    return links


def unlink_mounts(home: Path, links: list[Path]) -> None:
    """Remove the links, and the folders made only to hold them once they are empty."""
    for link in links:
        if link.is_symlink():
            link.unlink()
        parent = link.parent
        while parent != home and parent.is_relative_to(home):
            try:
                parent.rmdir()
            except OSError:
                break  # not empty: the user's files, or another mount's link
            parent = parent.parent


class PodRunner:
    def __init__(
        self,
        api,
        workdir: Path,
        allowed: tuple[str, ...],
        tools: Callable[[], Path | None] | None = None,
    ) -> None:
        """``tools``: the folder holding code-server, if installed, asked at each start
        (default: the cached install, ``codeserver.installed_bin_dir``)."""
        from kubernetes_asyncio import client

        self.core = client.CoreV1Api(api)
        self.workdir = workdir
        self.allowed = allowed
        if tools is None:
            from ..codeserver import installed_bin_dir

            tools = installed_bin_dir
        self.tools = tools
        self.running: dict[str, LocalProcess] = {}
        self.skipped: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    # ---- pod environment, as the kubelet builds it ---------------------------

    async def _secret(self, namespace: str, name: str) -> dict[str, str]:
        secret = await self.core.read_namespaced_secret(name, namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    async def _config_map(self, namespace: str, name: str) -> dict[str, str]:
        return dict((await self.core.read_namespaced_config_map(name, namespace)).data or {})

    async def bound_volumes(self, pod: dict, container: dict) -> dict[str, dict]:
        """Claim name -> the spec of the PersistentVolume it is bound to, for the claims
        the container mounts (as the kubelet finds what to mount)."""
        from kubernetes_asyncio.client import ApiException

        mounted = {m["name"] for m in container.get("volumeMounts") or []}
        namespace = pod["metadata"]["namespace"]
        bound: dict[str, dict] = {}
        for volume in pod["spec"].get("volumes") or []:
            claim = volume.get("persistentVolumeClaim")
            if not claim or volume["name"] not in mounted:
                continue
            name = claim["claimName"]
            try:
                found = await self.core.read_namespaced_persistent_volume_claim(name, namespace)
                if not found.spec.volume_name:
                    continue  # not bound: the scheduler would not have placed the pod
                volume_object = await self.core.read_persistent_volume(found.spec.volume_name)
            except ApiException as e:
                if e.status != 404:
                    raise
                log.info(
                    "%s/%s: claim %s or its volume is gone: not linked",
                    namespace,
                    pod["metadata"]["name"],
                    name,
                )
                continue
            bound[name] = self.core.api_client.sanitize_for_serialization(volume_object.spec)
        return bound

    async def pod_env(self, pod: dict, container: dict) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                data = await self._secret(ns, source["secretRef"]["name"])
            else:
                data = await self._config_map(ns, source["configMapRef"]["name"])
            env.update({prefix + k: v for k, v in data.items()})
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": ns,
            "metadata.uid": pod["metadata"].get("uid", ""),
            "spec.nodeName": pod["spec"].get("nodeName", ""),
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.podIP": pod["status"].get("podIP", ""),
            "status.hostIP": pod["status"].get("hostIP", ""),
        }
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
                continue
            ref = var.get("valueFrom") or {}
            if "secretKeyRef" in ref:
                r = ref["secretKeyRef"]
                env[var["name"]] = (await self._secret(ns, r["name"]))[r["key"]]
            elif "configMapKeyRef" in ref:
                r = ref["configMapKeyRef"]
                env[var["name"]] = (await self._config_map(ns, r["name"]))[r["key"]]
            elif "fieldRef" in ref:
                env[var["name"]] = fields.get(ref["fieldRef"]["fieldPath"], "")
        return env

    # ---- reconciling one pod ---------------------------------------------------

    async def observe(self, event_type: str, pod: dict) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}/{meta.get('uid', '')}"
        gone = event_type == "DELETED" or meta.get("deletionTimestamp")
        if gone:
            self.skipped.discard(key)
            if key in self.running:
                await self.stop(key)
            return
        status = pod.get("status") or {}
        if (
            key in self.running
            or key in self.skipped
            or status.get("phase") != "Running"
            or not status.get("podIP")
        ):
            return
        try:
            await self.start(key, pod)
        except NotRunnable as reason:
            self.skipped.add(key)
            log.info("%s stays simulated: %s", key, reason)

    async def start(self, key: str, pod: dict) -> None:
        pod_ip = pod["status"]["podIP"]
        if ipaddress.ip_address(pod_ip) not in _LOOPBACK:
            raise NotRunnable(f"pod IP {pod_ip} is not loopback; the runner binds loopback only")
        container = pod["spec"]["containers"][0]
        pod_env = await self.pod_env(pod, container)
        argv = container_argv(container, pod_env, self.allowed)
        argv, pod_env = bind_to_pod_ip(argv, pod_env, pod_ip)
        home = self.home_of(key, pod)
        home.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # images run notebooks as an unprivileged user; here we may be root
            (home / ".jupyter").mkdir(exist_ok=True)
            (home / ".jupyter" / "jupyter_server_config.json").write_text(
                json.dumps({"ServerApp": {"allow_root": True}})
            )
        path = os.environ.get("PATH", "/usr/bin:/bin")
        tools: dict[str, str] = {}
        code_server = self.tools()
        if code_server is not None:
            from ..codeserver import offline_setup

            path = f"{code_server}{os.pathsep}{path}"
            tools = offline_setup(home)
        bound = await self.bound_volumes(pod, container)
        links = link_mounts(home, local_mounts(container, pod["spec"].get("volumes") or [], bound))
        env = {
            "PATH": path,
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
            "HOSTNAME": pod["metadata"]["name"],
            **tools,
            **pod_env,
        }
        log_path = self._log_path(key)
        # a local file: opening it does not block the loop in any way that matters
        with open(log_path, "ab") as out:  # noqa: ASYNC230
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=home,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        grace = float(pod["spec"].get("terminationGracePeriodSeconds") or 30)
        self.running[key] = LocalProcess(key, process, home, min(grace, 10), links)
        log.info("%s: started %s on %s (pid %s)", key, argv[0], pod_ip, process.pid)
        task = asyncio.create_task(self._report_exit(key, pod))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _log_path(self, key: str) -> Path:
        return self.workdir / "logs" / f"{key.replace('/', '_')}.log"

    async def _report_exit(self, key: str, pod: dict) -> None:
        local = self.running[key]
        code = await local.process.wait()
        if self.running.get(key) is not local:
            return  # stopped by us because the pod went away
        del self.running[key]
        self.skipped.add(key)  # never restart: restartPolicy is Never for hub pods
        log.info("%s: process exited with %s; marking the pod finished", key, code)
        unlink_mounts(local.home, local.links)
        self._remove_pod_home(local.home)
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        name = container["name"]
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            # when it ended, as a kubelet reports it (whole seconds, UTC)
            "finishedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        # a local file the process has finished writing
        path = self._log_path(key)
        output = path.read_bytes() if path.exists() else b""
        message = termination_message(container, code, output)
        if message:
            terminated["message"] = message
        body = {
            "status": {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [
                    {
                        "name": name,
                        "ready": False,
                        "restartCount": 0,
                        "image": pod["spec"]["containers"][0].get("image", ""),
                        "imageID": "",
                        "state": {"terminated": terminated},
                    }
                ],
            }
        }
        from kubernetes_asyncio.client import ApiException

        try:
            await self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
        except ApiException as e:
            if e.status != 404:
                log.warning("%s: could not mark the pod finished: %s", key, e.reason)

    def home_of(self, key: str, pod: dict) -> Path:
        """A server's home: its user's, kept across that user's servers' stops and starts
        as z2jh's per-user volume is (removed with the runner's folder); a pod of no
        hub user gets one of its own, removed when it ends."""
        annotations = pod["metadata"].get("annotations") or {}
        user = annotations.get("hub.jupyter.org/username")
        if user:
            namespace = pod["metadata"].get("namespace", "")
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
            return self.workdir / "homes" / f"{namespace}_{safe}"
        return self.workdir / "pods" / key.replace("/", "_")

    def _remove_pod_home(self, home: Path) -> None:
        if home.parent == self.workdir / "pods":
            shutil.rmtree(home, ignore_errors=True)

    async def stop(self, key: str) -> None:
        local = self.running.pop(key)
        pid = local.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(local.process.wait(), local.grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            await local.process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # anything the server left in its group
        unlink_mounts(local.home, local.links)
        self._remove_pod_home(local.home)
        log.info("%s: stopped", key)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(k) for k in list(self.running)))

    # ---- the watch loop --------------------------------------------------------

    async def run(self) -> None:
        import aiohttp
        from kubernetes_asyncio.client import ApiException

        while True:
            try:
                await self._list_and_watch()
            except (ApiException, aiohttp.ClientError, OSError, TimeoutError) as e:
                # the API server restarting, as a kubelet outlives it: list again once
                # it answers (pods deleted meanwhile are stopped by the list)
                log.warning("pod list or watch failed (%s); listing again", e)
                await asyncio.sleep(1)

    async def _list_and_watch(self) -> None:
        from kubernetes_asyncio import watch

        while True:
            listed = await self.core.list_pod_for_all_namespaces(_preload_content=False)
            data = json.loads(await listed.read())
            seen = set()
            for pod in data["items"]:
                meta = pod["metadata"]
                seen.add(f"{meta['namespace']}/{meta['name']}/{meta.get('uid', '')}")
                await self.observe("ADDED", pod)
            for key in [k for k in self.running if k not in seen]:
                await self.stop(key)
            version = data["metadata"]["resourceVersion"]
            async with watch.Watch().stream(
                self.core.list_pod_for_all_namespaces,
                resource_version=version,
                timeout_seconds=300,
                _preload_content=False,
            ) as stream:
                async for event in stream:
                    raw = event.get("raw_object") or {}
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    await self.observe(event["type"], raw)


async def _main(args: argparse.Namespace) -> None:
    from kubernetes_asyncio import client

    from .kubeconfig import load_configuration

    configuration = await load_configuration(Path(args.kubeconfig))
    async with client.ApiClient(configuration) as api:
        runner = PodRunner(api, Path(args.workdir), tuple(args.allow))
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        watcher = asyncio.create_task(runner.run())
        stopper = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait({watcher, stopper}, return_when=asyncio.FIRST_COMPLETED)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await runner.stop_all()
        if watcher in done and watcher.exception():
            raise watcher.exception()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="jupyterhub-gpu-pod-runner", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument(
        "--allow",
        action="append",
        default=list(DEFAULT_ALLOWED),
        help="a command the runner may start (repeatable)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout
    )
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
