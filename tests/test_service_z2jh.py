"""The GPU service started as JupyterHub starts it in a z2jh hub pod.

The hub's config is laid out as z2jh lays it out: the chart values (with
``hub.config.GPUPolicy``) beside the chart's ``z2jh`` helper, and a
``jupyterhub_config.py`` that needs the pod's Kubernetes Service variables
(``PROXY_API_SERVICE_PORT``, ``HUB_SERVICE_PORT``). The hub has them; the
service, a hub-managed process, gets only JupyterHub's variables. It must still
have the hub's exact policy, and a config it cannot read must stop it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from jupyterhub_gpu.service.app import GPUService
from jupyterhub_gpu_dev.localcluster.hub import Z2JH_HELPER
from kube_helpers import eventually
from test_service_hub import aget, user_token, wait_for_service

POLICY = {
    "flavors": {"h200": {"kind": "gpu"}},
    "profiles": {
        "small": {"cpu": "100m", "memory": "128Mi", "gpu": {"flavor": "h200"}},
        "cpu": {"cpu": "100m", "memory": "128Mi"},
    },
    "everyone": {"profiles": ["cpu"]},
    "groups": {
        "alpha": {"quota": {"gpus": 4}, "max_runtime": "8h", "profiles": ["small"]},
        "beta": {"quota": {"gpus": 1}, "profiles": ["small"]},
    },
    "namespace_per_group": True,
}


@pytest.mark.k8s
@pytest.mark.hub
async def test_in_a_z2jh_pod_the_service_has_the_hubs_groups_and_keeps_their_objects(
    hub_factory, core
):
    # a prefix of this test's own: the hub's clean-up deletes the groups' namespaces
    prefix = f"z2jh-{uuid.uuid4().hex[:8]}-"
    hub = await hub_factory(
        admin_users=("root",),
        policy={**POLICY, "namespace_prefix": prefix},
        gpu_service=True,
        z2jh_layout=True,
        service_settings={"reconcile_interval": 1, "hub_poll_interval": 1},
        extra_config='c.JupyterHub.load_roles.append({"name": "token-issuer", '
        '"scopes": ["tokens"], "services": ["demo-admin"]})\n',
    )
    # the hub itself really needs the Service variables it was given
    config = (hub.directory / "jupyterhub_config.py").read_text()
    assert "os.environ['PROXY_API_SERVICE_PORT']" in config
    await wait_for_service(hub)
    token = await user_token(hub, "root")

    async def reconciled(passes: int, ok: bool):
        status, _, body = await aget(hub.service_url + "api/usage", token)
        assert status == 200, body
        view = json.loads(body)
        task = next(t for t in view["tasks"] if t["name"] == "reconcile")
        return view if task["runs"] >= passes and (task["ok"] or not ok) else None

    view = await eventually(lambda: reconciled(1, ok=False), "a reconcile pass", within=60)
    assert {g["name"] for g in view["groups"]} == {"alpha", "beta", "everyone"}
    alpha = next(g for g in view["groups"] if g["name"] == "alpha")
    assert alpha["max_runtime_seconds"] == 8 * 3600
    await eventually(lambda: reconciled(3, ok=True), "three reconcile passes", within=60)
    # the group namespaces the policy implies exist, and no pass deleted them
    for group in ("alpha", "beta"):
        ns = await core.read_namespace(f"{prefix}{group}")
        assert ns.metadata.deletion_timestamp is None
        quota = await core.read_namespaced_resource_quota("jupyterhub-gpu", f"{prefix}{group}")
        assert quota.spec.hard["requests.nvidia.com/gpu"] == ("4" if group == "alpha" else "1")
    log = hub.log_path.read_text()
    assert "policy from the chart values (hub.config)" in log
    assert "Exception while loading config file" not in log


def test_a_hub_config_that_fails_to_load_stops_the_service(tmp_path):
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "import os\n"
        "c = get_config()  # noqa\n"
        "c.GPUPolicy.groups = {'alpha': {'profiles': []}}\n"
        "c.ConfigurableHTTPProxy.api_url = 'http://proxy:' + os.environ['PROXY_API_SERVICE_PORT']\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
        "JUPYTERHUB_SERVICE_NAME": "gpu",
        "JUPYTERHUB_API_TOKEN": "x",
    }
    result = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpu.service", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"the hub's config file {config} failed to load: the environment variable "
        "'PROXY_API_SERVICE_PORT' is not set" in result.stderr
    )
    assert "environment" in result.stderr


def z2jh_folder(folder: Path, values: dict) -> Path:
    """A folder laid out like z2jh's in a hub pod; returns its jupyterhub_config.py.

    The config file needs the hub pod's Service variables, as z2jh's does: the
    service must read the values through the helper and never run this file.
    """
    (folder / "z2jh.py").write_text(Z2JH_HELPER)
    (folder / "values.json").write_text(json.dumps(values))
    config = folder / "jupyterhub_config.py"
    config.write_text(
        "import os\n"
        "c = get_config()  # noqa\n"
        "c.ConfigurableHTTPProxy.api_url = 'http://proxy:' + os.environ['PROXY_API_SERVICE_PORT']\n"
    )
    return config


def start_up(argv: list[str]) -> GPUService:
    """The service's start-up (``initialize``), in this process: it reads its config only."""
    service = GPUService()
    service.initialize(argv)
    return service


def test_a_z2jh_pod_without_the_policy_in_its_values_stops_the_service(tmp_path):
    # e.g. the values Secret is not mounted: z2jh's helper then reads {} and
    # get_config answers None for every key
    config = z2jh_folder(tmp_path, {"hub": {"config": {"GPUService": {"prune_namespaces": True}}}})
    with pytest.raises(SystemExit) as stopped:
        start_up(["--config", str(config)])
    assert "have no hub.config.GPUPolicy" in str(stopped.value.code)
    assert "does not run without one" in str(stopped.value.code)


def test_the_command_line_wins_over_the_chart_values(tmp_path):
    # the admin adds --GPUService.reconcile_dry_run=True to the service's command
    # for a first dry run; a value in hub.config.GPUService must not undo it
    values = {
        "hub": {
            "config": {
                "GPUPolicy": {"groups": {"alpha": {"quota": {"gpus": 1}}}},
                "GPUService": {"reconcile_dry_run": False, "reconcile_interval": 30},
                "KubeSpawner": {"namespace": "jhub"},
            }
        }
    }
    config = z2jh_folder(tmp_path, values)
    service = start_up(["--config", str(config), "--GPUService.reconcile_dry_run=True"])
    assert service.reconcile_dry_run is True
    assert service.reconcile_interval == 30  # from the values
    assert service.namespace == "jhub"
    assert list(service.policy.groups) == ["alpha"]


def test_a_plain_hub_config_without_a_policy_stops_the_service(tmp_path):
    config = tmp_path / "jupyterhub_config.py"
    config.write_text("c = get_config()  # noqa\nc.JupyterHub.port = 8000\n")
    with pytest.raises(SystemExit) as stopped:
        start_up(["--config", str(config)])
    assert f"the hub's config file {config} sets no GPUPolicy" in str(stopped.value.code)


def test_a_key_error_that_is_not_a_variable_is_not_called_one(tmp_path):
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "c = get_config()  # noqa\n"
        "groups = {'alpha': {}}\n"
        "c.GPUPolicy.groups = {'beta': groups['beta']}\n"
    )
    with pytest.raises(SystemExit) as stopped:
        start_up(["--config", str(config)])
    message = str(stopped.value.code)
    assert f"the hub's config file {config} failed to load: KeyError: 'beta'" in message
    assert "environment variable" not in message
