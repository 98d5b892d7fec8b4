"""A real JupyterHub, with configurable-http-proxy, spawning into the local cluster.

Used by the tests and by ``jupyterhub-gpu demo``. The hub, its proxy and its
API all bind 127.0.0.1; the hub's config is written to a folder of its own,
removed when the hub stops.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from jupyterhub_gpu.config.hubconfig import CONFIG_D_FILE
from jupyterhub_gpu.service.hubapi import SERVICE_ROLE, SERVICE_SCOPES
from jupyterhub_gpu.service.views import CUSTOM_SCOPES, USAGE_READ_SCOPE

from . import build
from .cluster import LocalCluster, free_port

#: Stands in for z2jh's ``z2jh.py`` helper (same ``get_config``), over the hub's values.
Z2JH_HELPER = """
import json, os

_values = json.load(open(os.path.join(os.path.dirname(__file__), "values.json")))


def get_config(key, default=None):
    value = _values
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value
"""

#: The service whose token is ``LocalHub.api_token``: the demo's printed admin token and
#: the tests' own. It administers users, servers and groups, reads metrics, and reads
#: every group's usage and showback from the GPU service (the usage scope and access to
#: the service, as a billing job's token has them).
ADMIN_SERVICE = "demo-admin"
ADMIN_SCOPES = [
    "admin:users",
    "admin:servers",
    "access:servers",
    "admin:groups",
    "read:metrics",
    USAGE_READ_SCOPE,
    "access:services!service=gpu",
]

#: The proxy the hub runs: package.json names it, package-lock.json pins its whole
#: tree (every package in it declares support for Node.js 20), installed with `npm ci`.
CHP_LOCK_DIR = Path(__file__).with_name("chp")


def ensure_chp(progress=None) -> Path:
    """configurable-http-proxy, installed once with ``npm ci`` into the cache.

    The cache folder is keyed by the lockfile's hash, so a refreshed lockfile gets a
    fresh install and an unchanged one is never reinstalled.
    """
    files = ("package.json", "package-lock.json")
    lock_hash = hashlib.sha256(
        b"".join((CHP_LOCK_DIR / name).read_bytes() for name in files)
    ).hexdigest()[:12]
    prefix = build.cache_dir() / "node" / f"configurable-http-proxy-{lock_hash}"
    binary = prefix / "node_modules" / ".bin" / "configurable-http-proxy"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if not npm:
        raise build.BuildError(
            "configurable-http-proxy is installed with npm, "
            "and `npm` is not on PATH: install Node.js"
        )
    # two test workers (or a test session and the demo) may both find it missing
    with build._lock(prefix.parent / f"{prefix.name}.lock"):
        if binary.exists():
            return binary
        (progress or print)(
            "installing configurable-http-proxy with npm ci "
            f"(the tree pinned in {CHP_LOCK_DIR / 'package-lock.json'})"
        )
        prefix.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(CHP_LOCK_DIR / name, prefix / name)
        subprocess.run(
            [npm, "ci", "--engine-strict", "--no-audit", "--no-fund", "--prefix", str(prefix)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return binary


@dataclass
class LocalHub:
    """A hub subprocess; ``url`` is the proxy's public URL, ``api_token`` the token of
    the ``demo-admin`` service (``ADMIN_SCOPES``)."""

    cluster: LocalCluster
    namespace: str = "default"
    extra_config: str = ""
    users: dict[str, list[str]] = field(default_factory=dict)  # name -> groups
    admin_users: tuple[str, ...] = ()
    port: int | None = None
    password: str = "jupyterhub-gpu"
    #: hub.config.GPUPolicy; with it the hub runs GPUKubeSpawner, as z2jh would
    policy: dict | None = None
    #: stop users' servers when the hub stops (False: they outlive a restart)
    cleanup_servers: bool = True
    #: the kubeconfig the hub uses (default: the cluster's admin kubeconfig)
    kubeconfig: Path | None = None
    #: run jupyterhub-gpu-service hub-managed at /services/gpu/, as a z2jh admin would
    gpu_service: bool = False
    #: the service's own kubeconfig (e.g. a service account's); default: the cluster admin's
    service_kubeconfig: Path | None = None
    #: register the GPU service as an external one (``url`` and ``api_token``, no
    #: ``command``), as in its own Deployment: the caller runs it, with
    #: ``gpu_service_token``, and it outlives the hub
    external_gpu_service: bool = False
    #: lay the hub's config out as z2jh does in a hub pod: ``hub.config`` sections
    #: (the policy, ``service_settings``), ``hub.services`` and ``hub.loadRoles``
    #: in the chart values beside the ``z2jh`` helper, and a
    #: ``jupyterhub_config.py`` that reads them through it and needs the pod's
    #: Service variables, which the hub has and a hub-managed service does not inherit
    z2jh_layout: bool = False
    #: hub.config.GPUService: the service's settings
    service_settings: dict = field(default_factory=dict)
    #: more hub.config sections (z2jh layout), applied as z2jh applies hub.config
    hub_config: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="jupyterhub-gpu-hub-"))
        self.port = self.port or free_port()
        self.hub_port = free_port()
        self.proxy_api_port = free_port()
        self.api_token = os.urandom(16).hex()
        self.service_port = free_port()
        self.gpu_service_token = os.urandom(16).hex()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self, chp: Path) -> str:
        return (
            textwrap.dedent(
                f"""
            # written by jupyterhub_gpu_dev.localcluster.hub
            import os
            c = get_config()  # noqa
            c.JupyterHub.ip = "127.0.0.1"
            c.JupyterHub.port = {self.port}
            c.JupyterHub.hub_ip = "127.0.0.1"
            c.JupyterHub.hub_port = {self.hub_port}
            c.JupyterHub.hub_connect_url = {self._hub_connect_url()}
            c.ConfigurableHTTPProxy.api_url = {self._proxy_api_url()}
            c.ConfigurableHTTPProxy.command = [{str(chp)!r}]
            c.ConfigurableHTTPProxy.should_start = True
            c.JupyterHub.db_url = "sqlite:///{self.directory}/jupyterhub.sqlite"
            c.JupyterHub.cookie_secret_file = "{self.directory}/cookie_secret"
            c.JupyterHub.pid_file = "{self.directory}/jupyterhub.pid"
            c.JupyterHub.cleanup_servers = {self.cleanup_servers!r}
            c.JupyterHub.authenticator_class = "dummy"
            c.DummyAuthenticator.password = {self.password!r}
            c.Authenticator.allowed_users = {set(self.users) | set(self.admin_users)!r}
            c.Authenticator.admin_users = {set(self.admin_users)!r}
            c.JupyterHub.load_groups = {self._groups()!r}
            c.JupyterHub.services = [{{"name": {ADMIN_SERVICE!r}, "api_token": {self.api_token!r}}}]
            c.JupyterHub.load_roles = [{{
                "name": {ADMIN_SERVICE!r},
                "scopes": {ADMIN_SCOPES!r},
                "services": [{ADMIN_SERVICE!r}],
            }}]
            c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
            c.KubeSpawner.namespace = {self.namespace!r}
            c.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
            c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
            c.KubeSpawner.start_timeout = 120
            c.KubeSpawner.http_timeout = 60
            c.Spawner.default_url = "/lab"
            """
            )
            + self._policy_config()
            + self._service_config()
            # the admin token's usage scope, declared as base.yaml declares it; merged,
            # so values that declare custom scopes of their own keep them
            + f"c.JupyterHub.custom_scopes.update({CUSTOM_SCOPES!r})\n"
            + textwrap.dedent(self.extra_config)
        )

    def _proxy_api_url(self) -> str:
        if self.z2jh_layout:  # as z2jh's config: from the proxy-api Service's variables
            return (
                "f\"http://{os.environ['PROXY_API_SERVICE_HOST']}:"
                "{os.environ['PROXY_API_SERVICE_PORT']}\""
            )
        return repr(f"http://127.0.0.1:{self.proxy_api_port}")

    def _hub_connect_url(self) -> str:
        if self.z2jh_layout:  # as z2jh's config: from the hub Service's variables
            return "f\"http://{os.environ['HUB_SERVICE_HOST']}:{os.environ['HUB_SERVICE_PORT']}\""
        return repr(f"http://127.0.0.1:{self.hub_port}")

    def _pod_environment(self) -> dict[str, str]:
        """The Service variables Kubernetes gives the hub pod (z2jh layout)."""
        if not self.z2jh_layout:
            return {}
        return {
            "PROXY_API_SERVICE_HOST": "127.0.0.1",
            "PROXY_API_SERVICE_PORT": str(self.proxy_api_port),
            "HUB_SERVICE_HOST": "127.0.0.1",
            "HUB_SERVICE_PORT": str(self.hub_port),
        }

    @property
    def service_url(self) -> str:
        """The service's public URL, through the proxy."""
        return f"{self.url}/services/gpu/"

    def _service_entry(self) -> tuple[dict, list[dict]]:
        """The GPU service's ``hub.services`` entry and its roles."""
        # what docs/service.md tells a z2jh admin to write under hub.services and
        # hub.loadRoles; the command is the module rather than the console script,
        # so a source checkout on PYTHONPATH (kept by the hub for services) runs it
        command = [
            sys.executable,
            "-m",
            "jupyterhub_gpu.service",
            "--config",
            str(self.directory / "jupyterhub_config.py"),
        ]
        service = {
            "name": "gpu",
            "url": f"http://127.0.0.1:{self.service_port}",
            "command": command,
            "oauth_no_confirm": True,
            # a managed service gets only the hub's PATH/PYTHONPATH/LANG: in a pod
            # the service account suffices; here the local cluster's kubeconfig
            "environment": {
                "KUBECONFIG": str(self.service_kubeconfig or self.cluster.state.kubeconfig)
            },
        }
        if self.external_gpu_service:
            del service["command"], service["environment"]
            service["api_token"] = self.gpu_service_token
        roles = [
            {"name": SERVICE_ROLE, "scopes": list(SERVICE_SCOPES), "services": ["gpu"]},
            {"name": "user", "scopes": ["self", "access:services!service=gpu"]},
        ]
        return service, roles

    def _service_config(self) -> str:
        if not self.gpu_service or self.z2jh_layout:  # z2jh layout: in the values
            return ""
        service, roles = self._service_entry()
        return textwrap.dedent(
            f"""
            c.JupyterHub.services.append({service!r})
            c.JupyterHub.load_roles.extend({roles!r})
            """
        )

    def _policy_config(self) -> str:
        if self.z2jh_layout:
            config: dict = {section: dict(s) for section, s in self.hub_config.items()}
            config.setdefault("KubeSpawner", {})["namespace"] = self.namespace
            if self.policy is not None:
                config["GPUPolicy"] = self.policy
            config["GPUService"] = self.service_settings
            return self._z2jh_config({"hub": {"config": config}})
        if self.policy is None:
            return textwrap.dedent(
                f"""
                c.GPUService.update({self.service_settings!r})
                """
            )
        # the same steps z2jh takes: hub.config.JupyterHub, hub.config.GPUPolicy, then
        # the files of jupyterhub_config.d (where the hub image puts the policy check,
        # which reads the chart values through z2jh's helper module)
        sections = {"GPUPolicy": self.policy, "GPUService": self.service_settings}
        values = {"hub": {"config": {"KubeSpawner": {"namespace": self.namespace}, **sections}}}
        (self.directory / "values.json").write_text(json.dumps(values))
        (self.directory / "z2jh_values.py").write_text(Z2JH_HELPER)
        return textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(self.directory)!r})
            sys.modules['z2jh'] = __import__('z2jh_values')
            c.JupyterHub.update({{"spawner_class": "gpu-kubespawner"}})
            for section, settings in {sections!r}.items():
                c[section].update(settings)
            load_subconfig({str(CONFIG_D_FILE)!r})
            """
        )

    def _z2jh_config(self, values: dict) -> str:
        """z2jh's steps over the chart values, through its ``z2jh`` helper beside the config.

        ``hub.services`` and ``hub.loadRoles`` (mappings of name to entry) are
        appended, every ``hub.config`` section applied, then the files of
        ``jupyterhub_config.d`` run, where the hub image puts the policy check;
        ``extra_config`` comes last, as ``hub.extraConfig`` does.
        """
        hub = values["hub"]
        if "GPUPolicy" in hub["config"]:  # with a policy the hub runs GPUKubeSpawner
            hub["config"].setdefault("JupyterHub", {})["spawner_class"] = "gpu-kubespawner"
        if self.gpu_service:
            service, roles = self._service_entry()
            hub["services"] = {service.pop("name"): service}
            hub["loadRoles"] = {role.pop("name"): role for role in roles}
        (self.directory / "values.json").write_text(json.dumps(values))
        (self.directory / "z2jh.py").write_text(Z2JH_HELPER)
        return textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(self.directory)!r})
            from z2jh import get_config
            for name, service in (get_config("hub.services") or {{}}).items():
                c.JupyterHub.services.append({{"name": name, **service}})
            for name, role in (get_config("hub.loadRoles") or {{}}).items():
                c.JupyterHub.load_roles.append({{"name": name, **role}})
            for section, settings in (get_config("hub.config") or {{}}).items():
                c[section].update(settings)
            load_subconfig({str(CONFIG_D_FILE)!r})
            """
        )

    def _groups(self) -> dict:
        groups: dict[str, dict] = {}
        for user, names in self.users.items():
            for g in names:
                groups.setdefault(g, {"users": []})["users"].append(user)
        return groups

    def write_config(self) -> Path:
        """The hub's ``jupyterhub_config.py`` (written again at every start); before the
        hub starts, for an external GPU service to read as its replicas do."""
        config = self.directory / "jupyterhub_config.py"
        config.write_text(self.config(ensure_chp()))
        return config

    def start(self, timeout: float = 60) -> LocalHub:
        config = self.write_config()
        env = {
            **os.environ,
            **self._pod_environment(),
            "KUBECONFIG": str(self.kubeconfig or self.cluster.state.kubeconfig),
        }
        env.pop("JUPYTERHUB_API_TOKEN", None)
        self.log_path = self.directory / "jupyterhub.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config)],
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            # the proxy answers 404 until the hub has added its own route
            with contextlib.suppress(urllib.error.URLError, ConnectionError):
                if self.api("GET", "")[0] == 200:
                    return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-4000:]
                self.stop()
                raise RuntimeError(f"the hub did not start; its log ends:\n{tail}")
            time.sleep(0.2)

    def api(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        token: str | None = None,
        timeout: float = 30,
    ):
        """Call the hub's REST API through the proxy; returns (status, parsed body)."""
        return self.request(method, f"/hub/api{path}", body, token, timeout)

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        token: str | None = None,
        timeout: float = 30,
    ):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {token or self.api_token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return status, parsed

    def restart(self, timeout: float = 60) -> LocalHub:
        """Stop the hub process and start it again on the same database and config."""
        self._stop_process()
        return self.start(timeout)

    def stop(self) -> None:
        self._stop_process()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _stop_process(self) -> None:
        if self.process and self.process.poll() is None:
            # SIGTERM lets the hub stop its servers (cleanup_servers) and its proxy
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(60)
        if self.process:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        # JupyterHub starts the proxy in a session of its own; a hub that died
        # before it could clean up leaves it running, found by its pid file
        proxy_pid = self.directory / "jupyterhub-proxy.pid"
        if proxy_pid.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(proxy_pid.read_text().strip()), signal.SIGKILL)
            proxy_pid.unlink(missing_ok=True)
