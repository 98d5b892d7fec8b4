"""``jupyterhub-gpu demo --auth``: whose logins the demo runs. ``ldap`` puts the demo
users in a real OpenLDAP (Debian's slapd) whose groups the hub reads; ``values`` keeps
the values' authenticator; the default stays the demo's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets.config import Config

from jupyterhub_gpu.auth.ldap import LDAPGroupsAuthenticator
from jupyterhub_gpu_dev.demo import DemoError, fill_directory, plan_demo
from jupyterhub_gpu_dev.ldap import LocalDirectory
from jupyterhub_gpu_dev.localcluster.hub import LocalHub

ROOT = Path(__file__).resolve().parents[1]
DEPARTMENT = [str(ROOT / "helm-values/base.yaml"), str(ROOT / "helm-values/department.yaml")]
UNIVERSITY = [str(ROOT / "helm-values/base.yaml"), str(ROOT / "helm-values/university.yaml")]


def test_the_default_keeps_the_demo_logins():
    plan = plan_demo(DEPARTMENT)
    assert plan.auth == "demo"
    assert "OIDCGroupsAuthenticator" not in plan.hub_config
    assert "authenticator_class" not in plan.hub_config["JupyterHub"]
    assert any("the demo's password instead of" in n for n in plan.notes)


def test_auth_values_keeps_the_values_authenticator_and_its_settings():
    plan = plan_demo(DEPARTMENT, auth="values")
    assert plan.hub_config["JupyterHub"]["authenticator_class"] == "oidc-groups"
    assert plan.hub_config["OIDCGroupsAuthenticator"]["auth_state_groups_key"] == (
        "oauth_user.groups"
    )
    # the key z2jh would generate for the auth state an OIDC refresh reads
    assert len(plan.hub_config["CryptKeeper"]["keys"][0]) == 64
    assert any("the values' authenticator (oidc-groups)" in n for n in plan.notes)
    assert not any("the demo's password" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (None, "no values files were given"),
        (
            [str(ROOT / "helm-values/base.yaml"), str(ROOT / "helm-values/enterprise.yaml")],
            "they name none",
        ),
    ],
)
def test_auth_values_without_an_authenticator_says_what_to_do(values, message):
    with pytest.raises(DemoError, match=message):
        plan_demo(values, auth="values")


@pytest.mark.parametrize("values", [None, UNIVERSITY], ids=["built-in", "university"])
async def test_auth_ldap_gives_each_demo_user_their_groups_from_a_real_directory(values):
    plan = plan_demo(values, auth="ldap")
    assert any("a local OpenLDAP holds the demo users" in n for n in plan.notes)
    with LocalDirectory() as directory:
        settings = fill_directory(directory, plan, LocalHub.password)
        config = Config()
        config.GPUPolicy.update(plan.policy_values)
        config.LDAPGroupsAuthenticator.update(settings)
        authenticator = LDAPGroupsAuthenticator(config=config)
        for user, groups in plan.users.items():
            model = await authenticator.authenticate(
                None, {"username": user, "password": LocalHub.password}
            )
            assert model is not None, user
            assert model["groups"] == groups, user
        # the wrong password is refused, as on a real directory
        assert (
            await authenticator.authenticate(None, {"username": "nogroup", "password": "x"}) is None
        )
