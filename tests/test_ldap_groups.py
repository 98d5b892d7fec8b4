"""LDAP logins whose hub groups come from the directory (jupyterhub_gpu.auth.ldap),
against a real OpenLDAP (Debian's slapd, the session's ``ldap_directory``) laid out
as helm-values/university.yaml says, and through a real hub's login page running
that file's authenticator and policy."""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from tornado import web
from traitlets.config import Config

from hub_helpers import running_hub
from jupyterhub_gpu.auth.ldap import DIRECTORY_DOWN, LDAPGroupsAuthenticator
from jupyterhub_gpu.config.values import load_values
from jupyterhub_gpu_dev.ldap import ADMIN_DN, GROUPS, LocalDirectory

ROOT = Path(__file__).resolve().parents[1]
UNIVERSITY = load_values([ROOT / "helm-values/base.yaml", ROOT / "helm-values/university.yaml"])
POLICY = UNIVERSITY["hub"]["config"]["GPUPolicy"]
#: who is in which directory group; each test has people of its own, as it changes them
PEOPLE = {
    # groupOfNames research, and the mailing list every staff member is on
    "alice": ["research", "all-staff"],
    # posixGroup students (memberUid)
    "bob": ["students"],
    # hpc-admins, which the policy's `test` group names in its directory_groups
    "carol": ["hpc-admins", "all-staff"],
    # no group the policy names
    "dave": ["all-staff"],
    "erin": ["research"],
    "frank": ["research"],
    "gina": ["research"],
    "hal": ["research", "cohort-2025", "all-staff"],
    "ivy": ["research"],
}
POSIX_GROUPS = {"students": 5001, "cohort-2025": 5002}
#: the slugs of the spawn form's profiles each policy group offers (with everyone's CPU)
FORM = {
    "research": ["research--research", "research--cpu", "everyone--cpu"],
    "students": ["students--student", "everyone--cpu"],
    "test": ["test--research", "test--student", "test--cpu", "everyone--cpu"],
    None: ["everyone--cpu"],
}


def password(name: str) -> str:
    return f"{name}-secret"


@pytest.fixture(scope="module")
def directory(ldap_directory: LocalDirectory) -> LocalDirectory:
    for name in PEOPLE:
        ldap_directory.add_person(name, password(name))
    for group in sorted({g for groups in PEOPLE.values() for g in groups}):
        members = [n for n, groups in PEOPLE.items() if group in groups]
        if group in POSIX_GROUPS:
            ldap_directory.add_group(group, members, "posixGroup", POSIX_GROUPS[group])
        else:
            ldap_directory.add_group(group, members)
    return ldap_directory


def university_authenticator(directory: LocalDirectory) -> dict:
    """helm-values/university.yaml's authenticator settings, pointed at the test
    directory: its address and port, plain LDAP (TLS is tried in test_ldap_trust), its
    admin as the lookup account, and groups read again before every spawn."""
    settings = dict(UNIVERSITY["hub"]["config"]["LDAPGroupsAuthenticator"])
    settings.update(server_address="127.0.0.1", server_port=directory.port)
    settings["tls_strategy"] = "insecure"
    settings["lookup_dn_search_user"] = ADMIN_DN
    settings["lookup_dn_search_password"] = directory.admin_password
    settings["group_refresh_age"] = 0
    return settings


def authenticator(directory: LocalDirectory, **settings) -> LDAPGroupsAuthenticator:
    config = Config()
    config.GPUPolicy.update(POLICY)
    config.LDAPGroupsAuthenticator.update({**university_authenticator(directory), **settings})
    return LDAPGroupsAuthenticator(config=config)


# ---- the authenticator on its own, against the real directory ------------------------


async def test_groups_come_from_groupofnames_and_posixgroup_members_and_no_others(directory):
    auth = authenticator(directory)
    for name, expected in [
        ("alice", ["research"]),
        ("bob", ["students"]),
        ("carol", ["test"]),
        ("dave", []),
    ]:
        model = await auth.authenticate(None, {"username": name, "password": password(name)})
        assert model["name"] == name
        assert model["groups"] == expected, name


async def test_memberof_counts_by_name_only_within_the_group_search_base(directory, caplog):
    # the memberof overlay keeps memberOf for groupOfNames; posixGroups have none
    auth = authenticator(directory, member_of_attribute="memberOf")
    model = await auth.authenticate(None, {"username": "carol", "password": password("carol")})
    assert model["groups"] == ["test"]

    # with no search base to vouch for the names, a memberOf group counts by its DN only
    auth = authenticator(directory, group_search_base="", member_of_attribute="memberOf")
    with caplog.at_level(logging.INFO):
        model = await auth.authenticate(None, {"username": "carol", "password": password("carol")})
    assert model["groups"] == []
    assert "counts only where a directory_groups entry names its full DN" in caplog.text
    groups = {**POLICY["groups"]}
    groups["test"] = {**groups["test"], "directory_groups": [f"CN=hpc-admins, {GROUPS}"]}
    auth = authenticator(directory, group_search_base="", member_of_attribute="memberOf")
    auth.config.GPUPolicy.groups = groups
    model = await auth.authenticate(None, {"username": "carol", "password": password("carol")})
    assert model["groups"] == ["test"]


async def test_a_posix_gid_named_in_the_policy_makes_a_member(directory):
    policy = {**POLICY, "groups": {**POLICY["groups"]}}
    policy["groups"]["students"] = {**policy["groups"]["students"], "directory_groups": [5002]}
    auth = authenticator(directory)
    auth.config.GPUPolicy.groups = policy["groups"]
    model = await auth.authenticate(None, {"username": "hal", "password": password("hal")})
    assert model["groups"] == ["research", "students"]


async def test_all_directory_groups_brings_the_unnamed_ones(directory):
    auth = authenticator(directory, all_directory_groups=True)
    model = await auth.authenticate(None, {"username": "alice", "password": password("alice")})
    assert model["groups"] == ["research", "all-staff"]


async def test_a_missing_group_search_base_refuses_the_login_and_says_why(directory, caplog):
    auth = authenticator(directory, group_search_base=f"ou=lists,{GROUPS.split(',', 1)[1]}")
    with caplog.at_level(logging.ERROR), pytest.raises(web.HTTPError) as refused:
        await auth.authenticate(None, {"username": "alice", "password": password("alice")})
    assert refused.value.status_code == 503
    assert refused.value.log_message == DIRECTORY_DOWN
    assert "noSuchObject" in caplog.text
    assert f"ldap://127.0.0.1:{directory.port}" in caplog.text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"manage_groups": False}, "manage_groups must be True"),
        ({"group_search_base": "", "member_of_attribute": ""}, "set group_search_base"),
        ({"group_search_base": "groups"}, "'groups' is not a DN"),
        ({"group_search_filter": "(member={user})"}, "must name the user with {userdn}"),
    ],
)
def test_settings_that_cannot_work_are_refused_at_start(directory, settings, message):
    with pytest.raises(Exception, match=re.escape(message)):
        authenticator(directory, **settings)


# ---- through a real hub's login page, with helm-values/university.yaml ---------------


class Browser:
    """A cookie-keeping client that logs in through the hub's login form."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.opener.open(f"{self.url}{path}", timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def log_in(self, user: str, secret: str, **extra: str) -> tuple[int, str]:
        """POST the login form (and any extra fields); the answer's status and page."""
        _, page = self.get("/hub/login")
        xsrf = re.search(r'name="_xsrf"\s+value="([^"]+)"', page)
        form = {"username": user, "password": secret, **extra}
        if xsrf:
            form["_xsrf"] = xsrf.group(1)
        body = urllib.parse.urlencode(form).encode()
        try:
            # next: the home page (the spawn page of a one-profile user may start a server)
            with self.opener.open(f"{self.url}/hub/login?next=%2Fhub%2Fhome", body, 60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def new_token(self, user: str, note: str) -> str:
        """An API token of the logged-in user's own, made as the hub's token page does."""
        xsrf = next(c.value for c in self.cookies if c.name == "_xsrf")
        request = urllib.request.Request(
            f"{self.url}/hub/api/users/{user}/tokens",
            json.dumps({"note": note}).encode(),
            {"X-XSRFToken": xsrf, "Content-Type": "application/json"},
        )
        with self.opener.open(request, timeout=60) as r:
            return json.loads(r.read())["token"]

    def form_profiles(self) -> list[str]:
        """The profiles the spawn form offers (their slugs, in the form's order)."""
        status, page = self.get("/hub/spawn")
        assert status == 200, page[-2000:]
        # KubeSpawner's form: one radio input per profile, value="<group>--<profile>"
        return re.findall(r'value="([\w.-]+--[\w.-]+)"', page)


@pytest.fixture(scope="module")
async def hub(local_cluster, core, directory):
    """A hub as z2jh runs helm-values/university.yaml: its JupyterHub section
    (authenticator_class: ldap-groups), its LDAPGroupsAuthenticator and its policy."""
    sections = UNIVERSITY["hub"]["config"]
    async with running_hub(
        local_cluster,
        core,
        z2jh_layout=True,
        policy=POLICY,
        hub_config={
            "JupyterHub": sections["JupyterHub"],
            "LDAPGroupsAuthenticator": university_authenticator(directory),
        },
    ) as hub:
        yield hub


async def hub_groups(hub, user: str) -> list[str] | None:
    status, model = await asyncio.to_thread(hub.api, "GET", f"/users/{user}")
    return sorted(model["groups"]) if status == 200 else None


async def log_in(hub, user: str, secret: str | None = None, **extra: str):
    browser = Browser(hub.url)
    status, page = await asyncio.to_thread(browser.log_in, user, secret or password(user), **extra)
    return browser, status, page


@pytest.mark.k8s
@pytest.mark.hub
async def test_each_users_groups_and_spawn_form_follow_the_directory(hub):
    for user, group in [("alice", "research"), ("bob", "students"), ("carol", "test")]:
        browser, status, page = await log_in(hub, user)
        assert status == 200, page[-2000:]
        assert await hub_groups(hub, user) == [group]
        assert await asyncio.to_thread(browser.form_profiles) == FORM[group]

    # dave is only on a mailing list, and asks for groups in the login form besides
    browser, status, _ = await log_in(hub, "dave", groups="test", group="research")
    assert status == 200
    assert await hub_groups(hub, "dave") == []
    assert await asyncio.to_thread(browser.form_profiles) == FORM[None]
    # the mailing list everyone is on is no hub group
    _, groups = await asyncio.to_thread(hub.api, "GET", "/groups")
    assert {g["name"] for g in groups} <= {"research", "students", "test"}
    assert "all-staff" not in {g["name"] for g in groups}


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_move_between_groups_shows_at_the_next_login(hub, directory):
    _, status, _ = await log_in(hub, "erin")
    assert status == 200
    assert await hub_groups(hub, "erin") == ["research"]

    directory.set_members("research", ["alice", "frank", "gina", "hal"])  # erin leaves
    directory.set_members("students", ["bob", "erin"])
    assert await hub_groups(hub, "erin") == ["research"]  # until erin logs in again

    browser, status, _ = await log_in(hub, "erin")
    assert status == 200
    assert await hub_groups(hub, "erin") == ["students"]
    assert await asyncio.to_thread(browser.form_profiles) == FORM["students"]


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_wrong_password_is_refused_and_changes_no_groups(hub, directory):
    _, status, _ = await log_in(hub, "frank")
    assert status == 200
    directory.set_members("hpc-admins", ["carol", "frank"])  # would make frank a `test` member

    browser, status, page = await log_in(hub, "frank", "not-franks-password")
    assert status == 403
    assert "Invalid username or password" in page
    assert await hub_groups(hub, "frank") == ["research"]
    assert (await asyncio.to_thread(browser.get, "/hub/home"))[1].count("login_submit") == 1


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_directory_that_is_down_refuses_the_login_and_changes_no_groups(hub, directory):
    _, status, _ = await log_in(hub, "gina")
    assert status == 200
    assert await hub_groups(hub, "gina") == ["research"]
    directory.set_members("research", ["alice", "frank", "hal"])  # gina leaves research

    log_before = hub.log_path.read_text(errors="replace")
    directory.stop()
    try:
        _, status, page = await log_in(hub, "gina")
    finally:
        directory.start()
    log = hub.log_path.read_text(errors="replace")[len(log_before) :]

    # the login page again, with what happened; not an error page
    assert status == 503
    assert 'id="login_submit"' in page
    assert "the directory (LDAP) could not be reached" in page
    assert "Uncaught exception" not in log
    assert "Traceback" not in log
    # the admin reads which server and why
    assert f"ldap://127.0.0.1:{directory.port}" in log
    assert "Connection refused" in log or "LDAPSocketOpenError" in log
    assert await hub_groups(hub, "gina") == ["research"]

    # back up: the next login applies the directory's groups
    _, status, _ = await log_in(hub, "gina")
    assert status == 200
    assert await hub_groups(hub, "gina") == []


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_member_removed_from_the_directory_cannot_start_a_server_with_an_old_token(
    hub, directory
):
    directory.set_members("research", ["alice", "ivy"])
    browser, status, _ = await log_in(hub, "ivy")
    assert status == 200
    assert await hub_groups(hub, "ivy") == ["research"]
    # a token of ivy's, made while she was in research (a script or a notebook keeps one)
    token = await asyncio.to_thread(browser.new_token, "ivy", "ivy's training script")

    directory.set_members("research", ["alice"])  # ivy leaves research
    # her token still works, but the spawn reads her groups from the directory first
    status, body = await asyncio.to_thread(
        hub.api,
        "POST",
        "/users/ivy/server",
        {"profile": "research--research"},
        token,
    )
    assert status == 403, body
    assert body["message"] == (
        "profile 'research--research' is not offered to you: choose one the spawn form shows"
    )
    assert await hub_groups(hub, "ivy") == []
    _, model = await asyncio.to_thread(hub.api, "GET", "/users/ivy")
    assert model["servers"] == {}
