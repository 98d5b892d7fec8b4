"""The values files in helm-values/: keys the z2jh 4.x chart accepts, config the
hub's classes accept, and a GPU service the hub, its Service, its network policy
and the proxy agree on.

The chart's schema keys come from tests/z2jh_schema.py (transcribed from the
chart; see there for what is and is not checked). Everything under
``hub.config``, ``hub.services`` and ``hub.loadRoles`` is checked against the
installed JupyterHub, KubeSpawner and authenticators themselves.
"""

from __future__ import annotations

import re
import secrets
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from jupyterhub import orm
from jupyterhub.app import JupyterHub
from jupyterhub.roles import _validate_role_name
from jupyterhub.scopes import _check_scopes_exist
from jupyterhub.services.service import Service

import z2jh_schema
from jupyterhub_gpu.config.values import hub_config, load_values, merge, policy_from_config
from jupyterhub_gpu.core.selection import offers
from jupyterhub_gpu.core.shaping import namespace_for
from jupyterhub_gpu.hub.offline import offline_spawner
from jupyterhub_gpu.hub.spawner import GPUKubeSpawner
from jupyterhub_gpu.service.hubapi import SERVICE_ROLE, SERVICE_SCOPES
from jupyterhub_gpu.service.views import CUSTOM_SCOPES, USAGE_READ_SCOPE

ROOT = Path(__file__).parents[2]
VALUES = ROOT / "helm-values"
BASE = VALUES / "base.yaml"
EXAMPLES = ["university", "department", "enterprise"]
#: the chart's own default (jupyterhub/values.yaml, 4.0.0-4.4.0: singleuser.profileList: [])
CHART_DEFAULTS = {"singleuser": {"profileList": []}}


def layered(name: str) -> list[Path]:
    return [BASE, VALUES / f"{name}.yaml"]


def every_file() -> list[Path]:
    return sorted(VALUES.glob("*.yaml"))


def test_every_values_file_is_tested():
    assert {p.stem for p in every_file()} == {"base", "service-deployment", *EXAMPLES}


@pytest.mark.parametrize("path", every_file(), ids=lambda p: p.name)
def test_every_key_is_one_the_chart_accepts(path):
    assert z2jh_schema.unknown_keys(load_values([path])) == []


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"hub": {"servce": {"extraPorts": []}}}, "hub.servce: not a key"),
        ({"hub": {"service": {"ipFamilies": ["IPv4"]}}}, "hub.service.ipFamilies: not a key"),
        ({"hub": {"config": {"gpuPolicy": {}}}}, "hub.config.gpuPolicy: a section must be"),
        ({"hub": {"db": {"type": "sqlite-pvc"}}}, "hub.db: closed in the chart's schema"),
        ({"proxy": {"chp": {"networkPolicy": {"egres": []}}}}, "networkPolicy.egres: not a key"),
    ],
)
def test_keys_the_chart_refuses_are_reported(values, problem):
    (found,) = z2jh_schema.unknown_keys(values)
    assert problem in found


def config_classes() -> dict[str, type]:
    from kubespawner import KubeSpawner
    from ldapauthenticator import LDAPAuthenticator
    from oauthenticator.generic import GenericOAuthenticator

    from jupyterhub_gpu.auth.ldap import LDAPGroupsAuthenticator
    from jupyterhub_gpu.auth.oidc import OIDCGroupsAuthenticator
    from jupyterhub_gpu.config.policy import GPUPolicy
    from jupyterhub_gpu.service.app import GPUService

    classes = [JupyterHub, KubeSpawner, GPUKubeSpawner, GPUPolicy, GPUService]
    classes += [GenericOAuthenticator, LDAPAuthenticator, LDAPGroupsAuthenticator]
    classes += [OIDCGroupsAuthenticator]
    return {c.__name__: c for c in classes}


@pytest.mark.parametrize("name", EXAMPLES)
def test_hub_config_sets_only_traits_the_classes_have(name):
    sections = load_values(layered(name))["hub"]["config"]
    classes = config_classes()
    for section, settings in sections.items():
        assert section in classes, f"hub.config.{section}: no class of that name is checked"
        traits = classes[section].class_traits(config=True)
        unknown = sorted(set(settings) - set(traits))
        assert unknown == [], f"hub.config.{section} has no trait {unknown}"


@pytest.mark.parametrize(
    ("name", "authenticator"),
    [
        ("university", "LDAPGroupsAuthenticator"),  # through the ldap-groups entry point
        ("department", "OIDCGroupsAuthenticator"),  # through the oidc-groups entry point
        ("enterprise", None),  # the site brings its own; the chart's default otherwise
    ],
)
def test_hub_loads_the_spawner_and_authenticator_the_values_name(name, authenticator):
    hub = JupyterHub(config=hub_config(load_values(layered(name))))
    assert hub.spawner_class is GPUKubeSpawner  # through the gpu-kubespawner entry point
    if authenticator:
        assert hub.authenticator_class.__name__ == authenticator


def service(values: dict[str, Any]) -> dict[str, Any]:
    return values["hub"]["services"]["gpu"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_gpu_service_port_agrees_everywhere(name):
    values = load_values(layered(name))
    url = service(values)["url"]
    assert url.startswith("http://hub:")  # the chart's hub Service
    port = int(url.rsplit(":", 1)[1])
    extra_ports = values["hub"]["service"]["extraPorts"]
    assert {"port": port, "targetPort": port} in [
        {"port": p["port"], "targetPort": p["targetPort"]} for p in extra_ports
    ]
    ingress_ports = [
        p["port"] for rule in values["hub"]["networkPolicy"]["ingress"] for p in rule["ports"]
    ]
    assert port in ingress_ports
    # Helm replaces lists: a cluster file that sets the proxy's egress must keep this rule
    egress = values["proxy"]["chp"]["networkPolicy"]["egress"]
    hub_rules = [
        rule
        for rule in egress
        if any(
            (to.get("podSelector") or {}).get("matchLabels", {}).get("app.kubernetes.io/component")
            == "hub"
            for to in rule["to"]
        )
    ]
    assert port in [p["port"] for rule in hub_rules for p in rule["ports"]]


def test_gpu_service_fields_are_jupyterhub_service_fields():
    spec = service(load_values([BASE]))
    fields = Service.class_traits(input=True)
    # apiToken is the chart's own (it moves it to api_token from its Secret)
    assert sorted(set(spec) - set(fields) - {"apiToken"}) == []
    assert spec["command"] == ["jupyterhub-gpu-service"]


def test_gpu_service_command_is_a_console_script_of_this_package():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert service(load_values([BASE]))["command"][0] in scripts


def test_roles_use_real_scopes_and_name_the_service():
    values = load_values([BASE])
    roles = values["hub"]["loadRoles"]
    for name, role in roles.items():
        _validate_role_name(name)
        assert set(role) <= {"name", "description", "scopes", "users", "groups", "services"}
        _check_scopes_exist(set(role["scopes"]))  # raises for an unknown scope
    assert roles[SERVICE_ROLE]["services"] == ["gpu"]
    # least privilege: lists users and their servers, may stop servers, never start them
    assert roles[SERVICE_ROLE]["scopes"] == list(SERVICE_SCOPES)
    # the default user role keeps 'self' and gains the dashboard
    assert set(roles["user"]["scopes"]) == {"self", "access:services!service=gpu"}


def with_services_and_roles(config, values: dict[str, Any], tmp_path: Path):
    """What the chart's jupyterhub_config.py makes of hub.services and hub.loadRoles.

    Both are dicts in the values and lists in JupyterHub: the key becomes the
    name, and the chart supplies each service's api_token from its Secret.
    """
    config.JupyterHub.services = [
        {"name": key, **{k: v for k, v in spec.items() if k != "apiToken"}}
        | {"api_token": secrets.token_hex(16)}
        for key, spec in values["hub"]["services"].items()
    ]
    config.JupyterHub.load_roles = [
        {"name": key, **role} for key, role in values["hub"]["loadRoles"].items()
    ]
    config.JupyterHub.authenticator_class = "dummy"
    config.JupyterHub.db_url = f"sqlite:///{tmp_path}/jupyterhub.sqlite"
    config.JupyterHub.cookie_secret_file = str(tmp_path / "cookie_secret")
    config.JupyterHub.pid_file = str(tmp_path / "jupyterhub.pid")
    return config


def test_the_service_role_is_one_truth_in_the_values_the_docs_and_the_test_hub():
    base = load_values([BASE])["hub"]["loadRoles"][SERVICE_ROLE]
    docs = (ROOT / "docs" / "service.md").read_text()
    # the first values block is the service's whole set-up
    snippet = re.findall(r"```yaml\n(hub:\n.*?)```", docs, re.S)[0]
    documented = yaml.safe_load(snippet)["hub"]["loadRoles"]
    assert documented[SERVICE_ROLE]["scopes"] == base["scopes"] == list(SERVICE_SCOPES)
    assert documented[SERVICE_ROLE]["services"] == base["services"]
    # the roles other than the default user role are the service's only
    assert set(documented) == set(load_values([BASE])["hub"]["loadRoles"])
    # the docs' scope table names the same role (the test and demo hubs import it)
    assert f"(role `{SERVICE_ROLE}`)" in docs
    # and the walk-through of the base file names the same role with the same scopes
    recipe = (ROOT / "docs" / "recipes" / "base.md").read_text()
    explained = re.search(r"- `hub\.loadRoles\.([^`]+)`:(.*?)\n- ", recipe, re.S)
    assert explained
    assert explained.group(1) == SERVICE_ROLE
    assert re.findall(r"`([a-z]+:[a-z:]+)`", explained.group(2)) == list(SERVICE_SCOPES)


async def test_jupyterhub_initializes_with_the_gpu_service_and_its_roles(tmp_path):
    """JupyterHub's own start-up (no proxy, no server) accepts the service and roles."""
    values = load_values(layered("university"))
    hub = JupyterHub(config=with_services_and_roles(hub_config(values), values, tmp_path))
    await hub.initialize([])
    service_row = orm.Service.find(hub.db, "gpu")
    assert [(r.name, sorted(r.scopes)) for r in service_row.roles] == [
        (SERVICE_ROLE, sorted(SERVICE_SCOPES))
    ]
    assert sorted(orm.Role.find(hub.db, "user").scopes) == ["access:services!service=gpu", "self"]
    assert hub._service_map["gpu"].url == "http://hub:10101"
    assert hub._service_map["gpu"].oauth_no_confirm


async def test_jupyterhub_refuses_a_role_for_a_service_that_does_not_exist(tmp_path):
    values = load_values(layered("university"))
    values["hub"]["loadRoles"][SERVICE_ROLE]["services"] = ["gpu-typo"]
    hub = JupyterHub(config=with_services_and_roles(hub_config(values), values, tmp_path))
    with pytest.raises(ValueError, match="gpu-typo"):
        await hub.initialize([])


def chart_config(paths: list[Path]):
    """hub.config as the chart's jupyterhub_config.py leaves it, profile_list included.

    The chart merges its defaults under the files and writes
    ``singleuser.profileList`` to ``c.KubeSpawner.profile_list`` unless it is null.
    """
    values = merge(CHART_DEFAULTS, load_values(paths))
    config = hub_config(values)
    profile_list = (values.get("singleuser") or {}).get("profileList")
    if profile_list is not None:
        config.KubeSpawner.profile_list = profile_list
    return config


@pytest.mark.parametrize("files", [["university.yaml"], ["base.yaml", "university.yaml"]])
async def test_the_charts_empty_profile_list_does_not_hide_the_policy(files):
    # the chart writes its default singleuser.profileList ([]) unless base.yaml nulls it
    config = chart_config([VALUES / f for f in files])
    spawner = offline_spawner(config, "rita", ["research"])  # an empty cluster of its own
    profiles = await spawner.profile_list(spawner)
    assert [p["slug"] for p in profiles] == [
        "research--research",
        "research--cpu",
        "everyone--cpu",
    ]


def test_enterprise_network_policies_cover_every_team_namespace():
    values = load_values(layered("enterprise"))
    policy = policy_from_config(hub_config(values))
    serving = {
        namespace_for(policy, group.name)
        for group in [*policy.groups.values(), policy.everyone]
        if any(o.group.name == group.name for o in offers(policy, [group.name]))
    }

    def namespaces(rules):
        found = set()
        for rule in rules:
            for to in rule["to"]:
                for expr in (to.get("namespaceSelector") or {}).get("matchExpressions", []):
                    found |= set(expr["values"])
        return found

    assert namespaces(values["hub"]["networkPolicy"]["egress"]) == serving
    assert namespaces(values["proxy"]["chp"]["networkPolicy"]["egress"]) == serving


def billing_example() -> dict[str, Any]:
    """The billing job's values in docs/service.md (Billing and automation tokens)."""
    docs = (ROOT / "docs" / "service.md").read_text()
    (snippet,) = [s for s in re.findall(r"```yaml\n(hub:\n.*?)```", docs, re.S) if "billing:" in s]
    return yaml.safe_load(snippet)


def test_the_usage_scope_is_one_truth_in_the_values_the_docs_and_the_service():
    base = load_values([BASE])["hub"]["config"]["JupyterHub"]["custom_scopes"]
    assert base == CUSTOM_SCOPES
    docs = (ROOT / "docs" / "service.md").read_text()
    first = yaml.safe_load(re.findall(r"```yaml\n(hub:\n.*?)```", docs, re.S)[0])
    assert first["hub"]["config"]["JupyterHub"]["custom_scopes"] == base
    role = billing_example()["hub"]["loadRoles"]["billing"]
    # the service's real name in the values: HubAuth asks for access to it
    assert sorted(role["scopes"]) == sorted(
        [
            USAGE_READ_SCOPE,
            f"access:services!service={next(iter(load_values([BASE])['hub']['services']))}",
        ]
    )


async def test_jupyterhub_initializes_with_the_documented_billing_service(tmp_path):
    """base.yaml declares the custom scope, so the docs' billing role loads (JupyterHub
    refuses a role with an undeclared custom scope at start)."""
    values = merge(load_values(layered("university")), billing_example())
    hub = JupyterHub(config=with_services_and_roles(hub_config(values), values, tmp_path))
    await hub.initialize([])
    billing = orm.Service.find(hub.db, "billing")
    assert [(r.name, sorted(r.scopes)) for r in billing.roles] == [
        ("billing", sorted([USAGE_READ_SCOPE, "access:services!service=gpu"]))
    ]
