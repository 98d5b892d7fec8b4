"""OIDC logins whose hub groups are the provider's, mapped through the policy
(jupyterhub_gpu.auth.oidc), against a real Keycloak (the session's ``keycloak``) and
through a real hub's login flow running helm-values/department.yaml's authenticator
settings and policy, pointed at the test provider."""

from __future__ import annotations

import asyncio
import html
import http.cookiejar
import json
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from loop_helpers import Heartbeat, silent_server
from tornado import web
from traitlets.config import Config

from hub_helpers import Relay, running_hub
from jupyterhub_gpu.auth.oidc import (
    PROVIDER_DOWN,
    PROVIDER_DOWN_AT_SPAWN,
    OIDCGroupsAuthenticator,
    claim_group,
)
from jupyterhub_gpu.config.values import load_values
from jupyterhub_gpu.core.directory import hub_groups as map_groups
from jupyterhub_gpu.core.model import parse_policy
from jupyterhub_gpu_dev.keycloak import LocalKeycloak
from jupyterhub_gpu_dev.localcluster.cluster import free_port

ROOT = Path(__file__).resolve().parents[1]
DEPARTMENT = load_values([ROOT / "helm-values/base.yaml", ROOT / "helm-values/department.yaml"])
POLICY = DEPARTMENT["hub"]["config"]["GPUPolicy"]
REALM = "department"
CLIENT_SECRET = "department-client-secret"
#: who is in which provider group (Keycloak paths)
PEOPLE = {
    "ada": ["/cpsHPCAccess"],
    # the nlp team under research, which the policy's cpsHPCAccess names by path
    "bo": ["/research/nlp"],
    "cy": ["/jupyter_admin", "/mailing-list"],
    # only on a list the policy does not name
    "dee": ["/mailing-list"],
    # the parent of nlp: not named, and membership of a subgroup does not flow up
    "gus": ["/research"],
    "eve": ["/cpsHPCAccess"],
    "fay": ["/cpsHPCAccess"],
    "hal": ["/cpsHPCAccess"],
}
#: the slugs of the spawn form's profiles each policy group offers (with everyone's CPU)
FORM = {
    "cpsHPCAccess": ["cpsHPCAccess--gpu", "cpsHPCAccess--mig", "everyone--cpu"],
    "jupyter_admin": [
        "jupyter_admin--gpu",
        "jupyter_admin--mig",
        "jupyter_admin--cpu",
        "everyone--cpu",
    ],
    None: ["everyone--cpu"],
}
#: seconds after which the hub asks the provider again on an ordinary page
REFRESH_AGE = 3


def password(name: str) -> str:
    return f"{name}-secret"


def realm(callback_url: str) -> dict:
    """The department's realm: its people and groups (nlp a subgroup of research), and
    the hub's client, whose tokens carry the groups claim as full paths."""
    return {
        "realm": REALM,
        "enabled": True,
        "groups": [
            {"name": "cpsHPCAccess"},
            {"name": "jupyter_admin"},
            {"name": "mailing-list"},
            {"name": "research", "subGroups": [{"name": "nlp"}]},
        ],
        "users": [
            {
                "username": name,
                "enabled": True,
                "email": f"{name}@example.org",
                "emailVerified": True,
                "firstName": name,
                "lastName": "Example",
                "credentials": [{"type": "password", "value": password(name), "temporary": False}],
                "groups": groups,
            }
            for name, groups in PEOPLE.items()
        ],
        "clients": [
            {
                "clientId": DEPARTMENT["hub"]["config"]["OIDCGroupsAuthenticator"]["client_id"],
                "enabled": True,
                "protocol": "openid-connect",
                "publicClient": False,
                "secret": CLIENT_SECRET,
                "redirectUris": [callback_url],
                "standardFlowEnabled": True,
                "directAccessGrantsEnabled": False,
                "protocolMappers": [
                    {
                        "name": "groups",
                        "protocol": "openid-connect",
                        "protocolMapper": "oidc-group-membership-mapper",
                        "config": {
                            "full.path": "true",
                            "claim.name": "groups",
                            "id.token.claim": "true",
                            "access.token.claim": "true",
                            "userinfo.token.claim": "true",
                        },
                    }
                ],
            }
        ],
    }


def department_authenticator(keycloak: LocalKeycloak, hub_port: int, backchannel: str) -> dict:
    """helm-values/department.yaml's authenticator settings, pointed at the test realm:
    the browser goes to Keycloak itself, the hub through ``backchannel`` (a relay the
    tests can cut), and the refresh age is seconds rather than minutes."""
    settings = dict(DEPARTMENT["hub"]["config"]["OIDCGroupsAuthenticator"])
    oidc = f"/realms/{REALM}/protocol/openid-connect"
    settings.update(
        authorize_url=f"{keycloak.url}{oidc}/auth",
        token_url=f"{backchannel}{oidc}/token",
        userdata_url=f"{backchannel}{oidc}/userinfo",
        oauth_callback_url=f"http://127.0.0.1:{hub_port}/hub/oauth_callback",
        client_secret=CLIENT_SECRET,
        auth_refresh_age=REFRESH_AGE,
    )
    return settings


# ---- the mapping of claim values, without a provider -----------------------------------


def test_claim_values_map_by_name_top_level_path_subgroup_path_and_object_id():
    policy = parse_policy(
        **{
            **POLICY,
            "groups": {
                **POLICY["groups"],
                "cpsHPCAccess": {
                    **POLICY["groups"]["cpsHPCAccess"],
                    # an Entra ID object ID, beside the names department.yaml lists
                    "directory_groups": [
                        *POLICY["groups"]["cpsHPCAccess"]["directory_groups"],
                        "3f1c2b9e-5a0d-4e7b-9c2a-0d8e6f4a1b2c",
                    ],
                },
            },
        }
    )

    def hub(*claim: str) -> tuple[str, ...]:
        return map_groups(policy, [claim_group(v) for v in claim]).groups

    assert hub("cpsHPCAccess") == ("cpsHPCAccess",)
    assert hub("/cpsHPCAccess") == ("cpsHPCAccess",)  # Keycloak's full path of a top group
    assert hub("/research/nlp") == ("cpsHPCAccess",)
    assert hub("3f1c2b9e-5a0d-4e7b-9c2a-0d8e6f4a1b2c") == ("cpsHPCAccess",)
    # exactly as written: another case is another value (unless the site opts in)
    assert hub("3F1C2B9E-5A0D-4E7B-9C2A-0D8E6F4A1B2C") == ()
    folded = map_groups(
        policy, [claim_group("3F1C2B9E-5A0D-4E7B-9C2A-0D8E6F4A1B2C")], case_insensitive=True
    )
    assert folded.groups == ("cpsHPCAccess",)
    assert hub("/research", "/teaching/nlp", "nlp", "/mailing-list") == ()
    # a subgroup called like a policy group is not that group
    assert hub("/research/jupyter_admin") == ()


# ---- the provider, and a hub running department.yaml's authenticator -------------------


@pytest.fixture(scope="module")
def hub_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def provider(keycloak: LocalKeycloak, hub_port: int) -> LocalKeycloak:
    keycloak.create_realm(realm(f"http://127.0.0.1:{hub_port}/hub/oauth_callback"))
    yield keycloak
    keycloak.admin("DELETE", f"/{REALM}")


@pytest.fixture(scope="module")
async def backchannel(provider: LocalKeycloak):
    """The hub's way to the provider: a relay the tests cut for an outage."""
    relay = await Relay(provider.port).start()
    yield relay
    await relay.ensure_serving()
    await relay.cut()


@pytest.fixture(scope="module")
async def hub(local_cluster, core, provider, backchannel, hub_port):
    """A hub as z2jh runs helm-values/department.yaml: its JupyterHub section
    (authenticator_class: oidc-groups), its OIDCGroupsAuthenticator and its policy;
    the auth state's key is the one z2jh generates."""
    sections = DEPARTMENT["hub"]["config"]
    async with running_hub(
        local_cluster,
        core,
        port=hub_port,
        z2jh_layout=True,
        policy=POLICY,
        hub_config={
            "JupyterHub": sections["JupyterHub"],
            "OIDCGroupsAuthenticator": department_authenticator(
                provider, hub_port, f"http://127.0.0.1:{backchannel.port}"
            ),
            "CryptKeeper": {"keys": [os.urandom(32).hex()]},
        },
    ) as hub:
        yield hub


class Browser:
    """A cookie-keeping client that logs in through the hub's OAuth redirect and
    Keycloak's login form, following redirects as a browser does."""

    def __init__(self, url: str) -> None:
        self.url = url
        # Keycloak's cookies are Secure; a browser sends those to loopback over plain
        # HTTP too (a potentially trustworthy origin), and so does this one
        self.cookies = http.cookiejar.CookieJar(
            http.cookiejar.DefaultCookiePolicy(secure_protocols=("https", "wss", "http"))
        )
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def open(self, url: str, data: dict | None = None, headers: dict | None = None):
        body = urllib.parse.urlencode(data).encode() if isinstance(data, dict) else data
        request = urllib.request.Request(url, data=body, headers=headers or {})
        try:
            with self.opener.open(request, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def get(self, path: str) -> tuple[int, str]:
        return self.open(f"{self.url}{path}")

    def log_in(self, user: str, secret: str) -> tuple[int, str]:
        """Sign in at the hub, which sends the browser to Keycloak; post Keycloak's form;
        the status and page the hub answers at the end."""
        status, page = self.get("/hub/oauth_login?next=%2Fhub%2Fhome")
        form = re.search(r'<form[^>]*id="kc-form-login"[^>]*action="([^"]+)"', page)
        assert status == 200, page[-2000:]
        assert form, f"no Keycloak login form: {page[-2000:]}"
        return self.open(html.unescape(form.group(1)), {"username": user, "password": secret})

    def xsrf(self) -> str:
        return next(c.value for c in self.cookies if c.name == "_xsrf")

    def form_profiles(self) -> list[str]:
        """The profiles the spawn form offers (their slugs, in the form's order)."""
        status, page = self.get("/hub/spawn")
        assert status == 200, page[-2000:]
        return re.findall(r'value="([\w.-]+--[\w.-]+)"', page)

    def start(self, user: str, profile: str) -> tuple[int, dict]:
        """Start a server through the REST API with the hub cookie, as the hub's
        pages do."""
        status, text = self.open(
            f"{self.url}/hub/api/users/{user}/server",
            json.dumps({"profile": profile}).encode(),
            {"X-XSRFToken": self.xsrf(), "Content-Type": "application/json"},
        )
        return status, json.loads(text) if text.strip() else {}


async def groups_of(hub, user: str) -> list[str] | None:
    status, model = await asyncio.to_thread(hub.api, "GET", f"/users/{user}")
    return sorted(model["groups"]) if status == 200 else None


async def log_in(hub, user: str) -> tuple[Browser, int, str]:
    browser = Browser(hub.url)
    status, page = await asyncio.to_thread(browser.log_in, user, password(user))
    return browser, status, page


def log_since(hub, before: str) -> str:
    return hub.log_path.read_text(errors="replace")[len(before) :]


@pytest.mark.k8s
@pytest.mark.hub
async def test_each_users_groups_and_spawn_form_follow_the_provider(hub, provider):
    print(f"Keycloak answered {provider.startup_seconds:.1f} s after its start")
    for user, group in [
        ("ada", "cpsHPCAccess"),
        ("bo", "cpsHPCAccess"),  # /research/nlp, by path
        ("cy", "jupyter_admin"),
        ("dee", None),
        ("gus", None),
    ]:
        browser, status, _ = await log_in(hub, user)
        assert status == 200, hub.log_path.read_text(errors="replace")[-5000:]
        assert await groups_of(hub, user) == ([group] if group else []), user
        assert await asyncio.to_thread(browser.form_profiles) == FORM[group], user

    # admin_groups names the hub group the mapping made
    _, cy = await asyncio.to_thread(hub.api, "GET", "/users/cy")
    assert cy["admin"] is True
    # the provider's groups the policy does not name are no hub groups
    _, groups = await asyncio.to_thread(hub.api, "GET", "/groups")
    assert {g["name"] for g in groups} == {"cpsHPCAccess", "jupyter_admin"}


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_removal_in_the_provider_applies_before_the_next_spawn(hub, provider):
    browser, status, _ = await log_in(hub, "eve")
    assert status == 200
    assert await groups_of(hub, "eve") == ["cpsHPCAccess"]
    assert "cpsHPCAccess--gpu" in await asyncio.to_thread(browser.form_profiles)

    await asyncio.to_thread(provider.remove_from_group, REALM, "eve", "/cpsHPCAccess")
    # her hub cookie is still valid: the spawn itself asks the provider first
    status, body = await asyncio.to_thread(browser.start, "eve", "cpsHPCAccess--gpu")
    assert status == 403, body
    assert body["message"] == (
        "profile 'cpsHPCAccess--gpu' is not offered to you: choose one the spawn form shows"
    )
    assert await groups_of(hub, "eve") == []
    _, server = await asyncio.to_thread(hub.api, "GET", "/users/eve")
    assert server["servers"] == {}

    # and back in: an ordinary page shows it once the last answer is REFRESH_AGE old
    await asyncio.to_thread(provider.add_to_group, REALM, "eve", "/research/nlp")
    await asyncio.sleep(REFRESH_AGE + 0.5)
    assert await asyncio.to_thread(browser.form_profiles) == FORM["cpsHPCAccess"]
    assert await groups_of(hub, "eve") == ["cpsHPCAccess"]


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_provider_that_is_down_refuses_the_login_and_changes_no_groups(
    hub, provider, backchannel
):
    _, status, _ = await log_in(hub, "fay")
    assert status == 200
    assert await groups_of(hub, "fay") == ["cpsHPCAccess"]
    await asyncio.to_thread(provider.remove_from_group, REALM, "fay", "/cpsHPCAccess")

    before = hub.log_path.read_text(errors="replace")
    await backchannel.cut()  # the hub cannot reach the provider; the browser still can
    try:
        _, status, page = await log_in(hub, "fay")
    finally:
        await backchannel.restore()
    log = log_since(hub, before)

    # the login page again, with what happened; not an error page
    assert status == 503, page[-2000:]
    assert "oauth_login" in page  # the sign-in button
    assert PROVIDER_DOWN in html.unescape(page)
    assert "Uncaught exception" not in log
    assert "Traceback" not in log
    # the admin reads which server and why
    assert f"http://127.0.0.1:{backchannel.port}/realms/{REALM}" in log
    assert "ConnectionRefusedError" in log
    assert await groups_of(hub, "fay") == ["cpsHPCAccess"]

    # back up: the next login applies the provider's groups
    _, status, _ = await log_in(hub, "fay")
    assert status == 200
    assert await groups_of(hub, "fay") == []


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_provider_that_is_down_at_a_spawn_refuses_it_and_keeps_the_pages(
    hub, provider, backchannel
):
    browser, status, _ = await log_in(hub, "hal")
    assert status == 200
    before = hub.log_path.read_text(errors="replace")
    await backchannel.cut()
    try:
        status, body = await asyncio.to_thread(browser.start, "hal", "cpsHPCAccess--gpu")
        started = time.monotonic()
        await asyncio.sleep(REFRESH_AGE + 0.5)
        # a page whose refresh is due still answers, with the groups as they were
        page_status, _ = await asyncio.to_thread(browser.get, "/hub/home")
        assert time.monotonic() - started < 30
    finally:
        await backchannel.restore()
    log = log_since(hub, before)
    assert status == 503, body
    assert body["message"] == PROVIDER_DOWN_AT_SPAWN
    assert page_status == 200
    assert "Spawn of hal refused: the identity provider at" in log
    assert "Traceback" not in log
    assert await groups_of(hub, "hal") == ["cpsHPCAccess"]
    _, model = await asyncio.to_thread(hub.api, "GET", "/users/hal")
    assert model["servers"] == {}


@pytest.mark.k8s
@pytest.mark.hub
async def test_nothing_the_user_sends_adds_a_group(hub):
    browser, status, _ = await log_in(hub, "dee")
    assert status == 200
    # a forged callback with groups in it, and the REST API with her cookie
    await asyncio.to_thread(browser.get, "/hub/oauth_callback?groups=cpsHPCAccess&code=x")
    status, _ = await asyncio.to_thread(
        browser.open,
        f"{hub.url}/hub/api/groups/cpsHPCAccess/users",
        json.dumps({"users": ["dee"]}).encode(),
        {"X-XSRFToken": browser.xsrf(), "Content-Type": "application/json"},
    )
    assert status == 403
    status, body = await asyncio.to_thread(browser.start, "dee", "cpsHPCAccess--gpu")
    assert status == 403, body
    assert await groups_of(hub, "dee") == []


# ---- settings that cannot work ------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        # oauthenticator says so first: the groups claim needs manage_groups
        ({"manage_groups": False}, "requires OIDCGroupsAuthenticator.manage_groups"),
        ({"enable_auth_state": False}, "refresh_pre_spawn needs enable_auth_state"),
    ],
)
def test_settings_that_cannot_work_are_refused_at_start(settings, message):
    config = Config()
    config.GPUPolicy.update(POLICY)
    config.OIDCGroupsAuthenticator.update(
        {**DEPARTMENT["hub"]["config"]["OIDCGroupsAuthenticator"], **settings}
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        OIDCGroupsAuthenticator(config=config)


# ---- a provider that hangs, and groups matched exactly --------------------------------


def offline_authenticator(**settings) -> OIDCGroupsAuthenticator:
    """department.yaml's authenticator with ``settings`` (no provider needed)."""
    config = Config()
    config.GPUPolicy.update(POLICY)
    config.OIDCGroupsAuthenticator.update(
        {**DEPARTMENT["hub"]["config"]["OIDCGroupsAuthenticator"], **settings}
    )
    return OIDCGroupsAuthenticator(config=config)


class KnownUser:
    """What refresh_user reads of a hub user: the name and the kept auth state."""

    def __init__(self, name: str, auth_state: dict) -> None:
        self.name = name
        self._auth_state = auth_state

    async def get_auth_state(self) -> dict:
        return self._auth_state


async def test_a_provider_that_never_answers_refuses_the_spawn_and_freezes_nothing(caplog):
    async with silent_server() as port:
        silent = f"http://127.0.0.1:{port}/realms/{REALM}/protocol/openid-connect"
        auth = offline_authenticator(
            token_url=f"{silent}/token",
            userdata_url=f"{silent}/userinfo",
            connect_timeout=1,
            request_timeout=1,
        )
        user = KnownUser(
            "ada",
            {
                "access_token": "an-access-token",
                "token_type": "Bearer",
                "refresh_token": "a-refresh-token",
                "token_response": {"access_token": "an-access-token", "token_type": "Bearer"},
                "oauth_user": {"preferred_username": "ada", "groups": ["/cpsHPCAccess"]},
            },
        )
        spawn = SimpleNamespace(
            request=SimpleNamespace(method="POST", path="/hub/api/users/ada/server")
        )
        loop = asyncio.get_running_loop()
        with caplog.at_level(logging.ERROR), Heartbeat() as heartbeat:
            started = loop.time()
            refreshes = [auth.refresh_user(user, spawn) for _ in range(3)]
            results = await asyncio.wait_for(
                asyncio.gather(*refreshes, return_exceptions=True), timeout=30
            )
            waited = loop.time() - started
    for refused in results:
        assert isinstance(refused, web.HTTPError), refused
        assert refused.status_code == 503
        assert refused.log_message == PROVIDER_DOWN_AT_SPAWN
    assert 1 <= waited < 10
    assert heartbeat.worst < 0.1, f"the event loop stalled for {heartbeat.worst:.3f} s"
    assert f"127.0.0.1:{port}" in caplog.text


@pytest.mark.parametrize(
    "claim",
    [" cpsHPCAccess", "cpsHPCAccess ", "CPSHPCACCESS", "cpsHPCAcce\u017fs", "/CPSHPCACCESS"],
)
async def test_a_look_alike_claim_value_grants_nothing(claim):
    state = {"oauth_user": {"preferred_username": "mallory", "groups": [claim]}}
    assert await offline_authenticator().get_user_groups(state) == set()


async def test_case_insensitive_providers_are_an_opt_in_for_a_to_z():
    auth = offline_authenticator(groups_case_insensitive=True)
    for claim, expected in [
        ("CPSHPCACCESS", {"cpsHPCAccess"}),
        ("/CPSHPCACCESS", {"cpsHPCAccess"}),
        ("cpsHPCAcce\u017fs", set()),  # the long s is no s, even so
        (" cpsHPCAccess", set()),
    ]:
        state = {"oauth_user": {"preferred_username": "ada", "groups": [claim]}}
        assert await auth.get_user_groups(state) == expected, claim
