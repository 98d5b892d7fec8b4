"""The GPU service in its own Deployment: the values file, what ``check`` says of it, the
objects ``manifests`` renders, and the hub's config reaching the service through the
mounts the Deployment gives it.

The chart's own objects are not rendered here: no registry these tests may use serves
the z2jh chart. What the service's pods mount of them (the hub Secret's ``values.yaml``
and the ConfigMap's ``z2jh.py`` helper) is laid out as the chart names them, with a
stand-in for the helper that reads the values file where z2jh's does; the objects
``manifests`` adds are checked by the local cluster's API server.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml
from jupyterhub.app import JupyterHub
from kubernetes_asyncio import utils

from cli_helpers import cli
from jupyterhub_gpu.config.service_form import service_form
from jupyterhub_gpu.config.values import hub_config, load_values, merge, policy_from_config
from jupyterhub_gpu.core.service_deployment import CONFIG_DIR
from jupyterhub_gpu.service.startup import read_hub_config

ROOT = Path(__file__).parents[1]
VALUES = ROOT / "helm-values"
FILES = [VALUES / "base.yaml", VALUES / "university.yaml", VALUES / "service-deployment.yaml"]
#: z2jh's helper module as the hub pod has it: its get_config reads the chart values
#: from the hub Secret mounted at /usr/local/etc/jupyterhub/secret/ (a stand-in written
#: here: only the path and the dotted lookup matter to the service)
Z2JH_HELPER = """
import yaml


def get_config(key, default=None):
    with open("/usr/local/etc/jupyterhub/secret/values.yaml") as f:
        value = yaml.safe_load(f)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value
"""
DB = "postgresql://jupyterhub@hub-db/jupyterhub"


@pytest.fixture
def site(tmp_path) -> list[Path]:
    """The example files, and the site's usage database (shared by hub and replicas)."""
    database = tmp_path / "database.yaml"
    database.write_text(yaml.safe_dump({"hub": {"config": {"GPUPolicy": {"accounting_url": DB}}}}))
    return [*FILES, database]


def rendered(paths: list[Path], *extra: str) -> list[dict[str, Any]]:
    result = cli("manifests", "--hub-namespace", "jhub", *map(str, paths), *extra)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def test_check_says_which_form_each_values_file_uses(site):
    result = cli("check", *map(str, site))
    assert result.returncode == 0, result.stderr
    assert (
        "GPU service: its own Deployment jupyterhub-gpu-service (2 replicas, leader elected on "
        "Lease jupyterhub-gpu-service) at http://jupyterhub-gpu-service:10101"
    ) in result.stdout
    assert "warning" not in result.stderr
    in_pod = service_form(load_values(FILES[:2]))
    assert in_pod.words == "in the hub's pod (hub.services.gpu.command)"
    assert (in_pod.errors, in_pod.warnings) == ([], [])


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"hub": {"services": {"gpu": {"command": ["jupyterhub-gpu-service"]}}}},
            "hub.services.gpu.command: the hub would start the service in its pod too",
        ),
        (
            {"hub": {"config": {"GPUService": {"lease_renew_deadline": 20}}}},
            "hub.config.GPUService.lease_renew_deadline (20.0) must be shorter than "
            "lease_duration (15.0)",
        ),
        ({"hub": {"config": {"GPUService": {"form": "sidecar"}}}}, "hub.config.GPUService:"),
        ({"hub": {"services": None}}, "hub.services.gpu: not set"),
    ],
)
def test_check_refuses_a_deployment_form_that_cannot_work(site, change, problem):
    values = merge(load_values(site), change)
    assert any(problem in e for e in service_form(values).errors)


def test_check_warns_of_a_usage_database_the_pods_cannot_share():
    (warning,) = service_form(load_values(FILES)).warnings
    assert "accounting_url is a sqlite file, while the service runs in pods" in warning


def test_check_warns_of_a_hub_that_starts_no_service():
    values = merge(load_values(FILES[:2]), {"hub": {"services": {"gpu": {"command": None}}}})
    (warning,) = service_form(values).warnings
    assert "the hub starts no GPU service" in warning


async def test_the_hub_starts_nothing_and_routes_to_the_deployments_service(site, tmp_path):
    values = load_values(site)
    spec = values["hub"]["services"]["gpu"]
    assert "command" not in spec  # base.yaml's command is nulled, the rest kept
    assert spec["oauth_no_confirm"] is True
    config = hub_config(values)
    config.JupyterHub.services = [{"name": "gpu", **spec, "api_token": secrets.token_hex(16)}]
    config.JupyterHub.db_url = f"sqlite:///{tmp_path}/jupyterhub.sqlite"
    config.JupyterHub.authenticator_class = "dummy"
    config.JupyterHub.cookie_secret_file = str(tmp_path / "cookie_secret")
    hub = JupyterHub(config=config)
    await hub.initialize([])
    service = hub._service_map["gpu"]
    assert not service.managed
    assert service.url == "http://jupyterhub-gpu-service:10101"
    # the hub pod no longer opens the service's port; the proxy and servers reach the pods
    assert values["hub"]["service"]["extraPorts"] == []
    assert values["hub"]["networkPolicy"]["ingress"] == []
    for egress in (
        values["proxy"]["chp"]["networkPolicy"]["egress"],
        values["singleuser"]["networkPolicy"]["egress"],
    ):
        (rule,) = egress
        selector = rule["to"][0]["podSelector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == "gpu-service"


def test_manifests_render_the_deployment_with_its_own_account_resources_and_lease(site):
    objects = rendered(site)
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert container["image"] == "registry.example.org/jupyterhub-gpu/k8s-hub:0.1.0.dev0-4.4.0"
    assert container["resources"] == {
        "requests": {"cpu": "200m", "memory": "512Mi"},
        "limits": {"memory": "2Gi"},
    }
    account = pod["serviceAccountName"]
    assert one(objects, "ServiceAccount", account)["metadata"]["namespace"] == "jhub"
    # the selector the Service and the values' network rules use matches the pods
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert one(objects, "Service")["spec"]["selector"].items() <= labels.items()
    assert labels["hub.jupyter.org/network-access-hub"] == "true"  # it reaches the hub
    # its own account holds the reconciler's rights and the one Lease; the hub's neither
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    lease_role = one(objects, "Role", "jupyterhub-gpu-service-lease")
    assert {"resources": ["leases"], "verbs": ["get", "update"]}.items() <= (
        lease_role["rules"][1].items()
    )
    assert lease_role["rules"][1]["resourceNames"] == ["jupyterhub-gpu-service"]
    for binding in bindings:
        subjects = {s["name"] for s in binding["subjects"]}
        role = binding["roleRef"]["name"]
        if "reconcile" in role or "lease" in role or role == "jupyterhub-gpu-service":
            assert subjects == {account}, role
        if role == "jupyterhub-gpu-spawner":
            assert subjects == {"hub"}
    env = {e["name"]: e for e in container["env"]}
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hub",
        "key": "hub.services.gpu.apiToken",
    }
    assert env["JUPYTERHUB_API_URL"]["value"] == "http://hub:8081/hub/api"


def test_the_in_pod_form_renders_no_deployment_and_no_lease():
    objects = rendered(FILES[:2])
    kinds = {o["kind"] for o in objects}
    assert "Deployment" not in kinds
    assert "Role" not in kinds


def lay_out_mounts(deployment: dict, files: dict[tuple[str, str], str], root: Path) -> Path:
    """The container's files as the kubelet mounts them (``CONFIG_DIR`` under ``root``),
    from ``files`` ((volume's ConfigMap or Secret name, key) -> content); the z2jh
    helper is told to look under ``root``. Returns the config file the service reads."""
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        source = volume.get("configMap") or volume.get("secret")
        name = source.get("name") or source.get("secretName")
        target = root / mount["mountPath"].lstrip("/")
        if "subPath" in mount:
            keys = {mount["subPath"]: target}
        else:
            items = source.get("items") or [{"key": k, "path": k} for (n, k) in files if n == name]
            keys = {i["key"]: target / i["path"] for i in items}
        for key, path in keys.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            text = files[(name, key)]
            if key == "z2jh.py":  # where the kubelet put the mounts, here
                text = text.replace("/usr/local/etc/jupyterhub/", f"{root}{CONFIG_DIR}/")
            path.write_text(text)
    env = {e["name"]: e.get("value") for e in container["env"]}
    return root / env["JUPYTERHUB_GPU_CONFIG"].lstrip("/")


def assert_the_service_reads_the_hubs_policy(values: dict, config_file: Path) -> None:
    loaded, source = read_hub_config(config_file)
    assert source == "the chart values (hub.config)"
    expected = policy_from_config(hub_config(values))
    assert policy_from_config(loaded) == expected
    assert loaded.GPUService.form == "deployment"
    assert loaded.GPUPolicy.accounting_url == DB


def test_the_hubs_config_reaches_the_service_through_its_mounts(site, tmp_path):
    values = load_values(site)
    deployment = one(rendered(site), "Deployment")
    files = {
        ("hub", "values.yaml"): yaml.safe_dump(values),
        ("hub", "z2jh.py"): Z2JH_HELPER,
        ("hub", "jupyterhub_config.py"): "raise RuntimeError('the hub pod's config: not run')\n",
        # the hub's own secrets in the same Secret never reach the service's pod
        ("hub", "hub.config.JupyterHub.cookie_secret"): "not for the service",
    }
    config_file = lay_out_mounts(deployment, files, tmp_path / "pod")
    assert_the_service_reads_the_hubs_policy(values, config_file)
    mounted = {p.name for p in (tmp_path / "pod").rglob("*") if p.is_file()}
    assert "hub.config.JupyterHub.cookie_secret" not in mounted


@pytest.mark.k8s
async def test_the_api_server_accepts_the_extra_objects_as_rendered(site, kube, namespace):
    """Every object ``manifests`` renders for the external form in the release's
    namespace, created on the local cluster's API server as a dry run (its schemas,
    admission, RBAC checks)."""
    extra = [
        o
        for o in rendered(site, "--hub-namespace", namespace)
        if o["metadata"].get("namespace") == namespace or o["kind"] == "Deployment"
    ]
    kinds = {o["kind"] for o in extra}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "NetworkPolicy"} <= kinds
    for obj in extra:
        await utils.create_from_dict(kube, obj, namespace=namespace, dry_run="All")
