"""What the LDAP login (jupyterhub_gpu.auth.ldap) trusts, tried against a real OpenLDAP
(Debian's slapd) serving LDAPS and StartTLS with a CA made here, and against a socket
that accepts and never answers:

- a directory that hangs refuses the logins that need it after its timeout, while the
  hub's event loop keeps beating (no gap over 100 ms) and other logins go through;
- the directory's certificate is checked: the right CA logs in, another refuses the
  login, says why, and sends no password;
- look-alike groups (another case, spaces, a long s, the same name elsewhere in the
  directory, a uid planted in one's own entry) grant nothing;
- a member removed from a directory group cannot start that group's profile with the
  groups of an old login, and without a lookup account a stale spawn is refused."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ldap3.utils.dn import escape_rdn
from loop_helpers import Heartbeat, silent_server
from test_ldap_groups import Browser
from tornado import web
from traitlets.config import Config

from hub_helpers import running_hub
from jupyterhub_gpu.auth.ldap import (
    DIRECTORY_DOWN_AT_SPAWN,
    DIRECTORY_SLOW,
    DIRECTORY_UNTRUSTED,
    LDAPGroupsAuthenticator,
)
from jupyterhub_gpu.config.values import load_values
from jupyterhub_gpu_dev.ldap import ADMIN_DN, GROUPS, SUFFIX, LocalDirectory, server_certificate
from jupyterhub_gpu_dev.localcluster.pki import CertificateAuthority

ROOT = Path(__file__).resolve().parents[1]
UNIVERSITY = load_values([ROOT / "helm-values/base.yaml", ROOT / "helm-values/university.yaml"])
POLICY = UNIVERSITY["hub"]["config"]["GPUPolicy"]


def password(name: str) -> str:
    return f"{name}-secret"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> SimpleNamespace:
    """The directory's CA (``ca``: its certificate file) and another CA (``other``)."""
    folder = tmp_path_factory.mktemp("ldap-tls")
    authority = CertificateAuthority()
    certificate, key = server_certificate(authority, folder)
    other = folder / "other-ca.crt"
    other.write_bytes(CertificateAuthority().cert_pem)
    return SimpleNamespace(
        authority=authority, ca=folder / "ca.crt", other=other, certificate=certificate, key=key
    )


@pytest.fixture(scope="module")
def directory(certificates) -> LocalDirectory:
    """slapd serving LDAPS and StartTLS, with the university's layout and some squatters."""
    with LocalDirectory(tls=(certificates.certificate, certificates.key)) as directory:
        for name in ("alice", "bob", "carol", "erin", "mallory", "oscar"):
            directory.add_person(name, password(name))
        directory.add_group("research", ["alice", "erin", "oscar"])
        directory.add_group("hpc-admins", ["carol"])
        directory.add_group("students", ["bob"], "posixGroup", 5001)
        # groups mallory could make: under ou=groups, in sub-OUs where anyone may create
        # lists (one each: slapd itself folds the long s and the spaces away, so the two
        # cannot be siblings), and elsewhere in the directory
        for ou, name in [("clubs", " HPC-Admins "), ("lists", "hpc-admin\u017f")]:
            parent = directory.add_entry(f"ou={ou},{GROUPS}", ["organizationalUnit"], {"ou": ou})
            directory.add_entry(
                f"cn={escape_rdn(name)},{parent}",
                ["groupOfNames"],
                {"cn": name, "member": ["uid=mallory,ou=people," + SUFFIX]},
            )
        selfservice = directory.add_entry(
            f"ou=selfservice,{SUFFIX}", ["organizationalUnit"], {"ou": "selfservice"}
        )
        directory.add_entry(
            f"cn=hpc-admins,{selfservice}",
            ["groupOfNames"],
            {"cn": "hpc-admins", "member": ["uid=mallory,ou=people," + SUFFIX]},
        )
        # trudy writes bob's uid into her own entry, first: the students posixGroup lists bob
        directory.add_entry(
            f"uid=trudy,ou=people,{SUFFIX}",
            ["inetOrgPerson", "posixAccount"],
            {
                "uid": ["bob", "trudy"],
                "cn": "trudy",
                "sn": "trudy",
                "userPassword": password("trudy"),
                "uidNumber": 20001,
                "gidNumber": 20001,
                "homeDirectory": "/home/trudy",
            },
        )
        yield directory


def authenticator(directory: LocalDirectory | None, certificates, **settings):
    """helm-values/university.yaml's authenticator (LDAPS, checked against the test CA),
    pointed at the test directory."""
    config = Config()
    config.GPUPolicy.update(POLICY)
    base = dict(UNIVERSITY["hub"]["config"]["LDAPGroupsAuthenticator"])
    base.update(
        server_address="127.0.0.1",
        server_port=directory.ldaps_port if directory else 0,
        tls_ca_file=str(certificates.ca),
    )
    config.LDAPGroupsAuthenticator.update({**base, **settings})
    return LDAPGroupsAuthenticator(config=config)


async def log_in(auth: LDAPGroupsAuthenticator, name: str) -> dict | None:
    return await auth.authenticate(None, {"username": name, "password": password(name)})


# ---- a directory that never answers -----------------------------------------------


@pytest.mark.parametrize("tls_strategy", ["insecure", "on_connect", "before_bind"])
async def test_a_hung_directory_refuses_those_logins_after_the_timeout_and_freezes_nothing(
    directory, certificates, tls_strategy, caplog
):
    async with silent_server() as port:
        hung = authenticator(
            None,
            certificates,
            server_port=port,
            tls_strategy=tls_strategy,
            connect_timeout=1,
            receive_timeout=1,
        )
        working = authenticator(directory, certificates)
        loop = asyncio.get_running_loop()
        with caplog.at_level(logging.ERROR), Heartbeat() as heartbeat:
            started = loop.time()
            stuck = [asyncio.ensure_future(log_in(hung, "alice")) for _ in range(3)]
            # meanwhile someone else logs in against a directory that works
            assert (await log_in(working, "alice"))["groups"] == ["research"]
            assert not any(task.done() for task in stuck)
            results = await asyncio.wait_for(
                asyncio.gather(*stuck, return_exceptions=True), timeout=30
            )
            waited = loop.time() - started
    for refused in results:
        assert isinstance(refused, web.HTTPError), refused
        assert refused.status_code == 503
        assert refused.log_message == DIRECTORY_SLOW
    assert 1 <= waited < 10
    assert heartbeat.worst < 0.1, f"the event loop stalled for {heartbeat.worst:.3f} s"
    assert f"127.0.0.1:{port} did not answer in time" in caplog.text
    assert "receive_timeout 1 s" in caplog.text


async def test_directory_calls_are_bounded_and_so_is_the_wait_for_one(certificates, caplog):
    async with silent_server() as port:
        hung = authenticator(
            None,
            certificates,
            server_port=port,
            tls_strategy="insecure",
            receive_timeout=1,
            max_directory_calls=2,
        )
        most = 0
        before = set(threading.enumerate())  # earlier tests' authenticators' idle threads

        async def count_threads() -> None:
            nonlocal most
            while True:
                new = [t for t in threading.enumerate() if t not in before]
                most = max(most, sum(t.name.startswith("ldap-directory") for t in new))
                await asyncio.sleep(0.01)

        counter = asyncio.ensure_future(count_threads())
        with caplog.at_level(logging.ERROR), Heartbeat() as heartbeat:
            results = await asyncio.wait_for(
                asyncio.gather(*(log_in(hung, "alice") for _ in range(6)), return_exceptions=True),
                timeout=30,
            )
        counter.cancel()
    assert all(isinstance(r, web.HTTPError) and r.log_message == DIRECTORY_SLOW for r in results)
    assert most <= 2
    assert heartbeat.worst < 0.1
    # those that found both calls taken waited receive_timeout for one, then gave up
    assert "all 2 directory calls (max_directory_calls) were still waiting" in caplog.text


# ---- TLS: the directory's certificate is checked ----------------------------------


@pytest.mark.parametrize("tls_strategy", ["on_connect", "before_bind"])
async def test_the_directorys_own_ca_logs_in(directory, certificates, tls_strategy):
    port = directory.ldaps_port if tls_strategy == "on_connect" else directory.port
    auth = authenticator(directory, certificates, tls_strategy=tls_strategy, server_port=port)
    assert (await log_in(auth, "alice"))["groups"] == ["research"]
    # a name the certificate lists works as well as its address
    auth = authenticator(
        directory, certificates, tls_strategy=tls_strategy, server_port=port,
        server_address="localhost",
    )  # fmt: skip
    assert (await log_in(auth, "carol"))["groups"] == ["test"]


@pytest.mark.parametrize("tls_strategy", ["on_connect", "before_bind"])
@pytest.mark.parametrize("trusted", ["another CA", "the system's CAs"])
async def test_a_certificate_from_an_untrusted_ca_refuses_the_login_and_sends_no_password(
    directory, certificates, tls_strategy, trusted, caplog
):
    port = directory.ldaps_port if tls_strategy == "on_connect" else directory.port
    ca_file = str(certificates.other) if trusted == "another CA" else ""
    auth = authenticator(
        directory, certificates, tls_strategy=tls_strategy, server_port=port, tls_ca_file=ca_file
    )
    binds_before = directory.log_path.read_text(errors="replace").count('BIND dn="uid=erin')
    with caplog.at_level(logging.ERROR), pytest.raises(web.HTTPError) as refused:
        await log_in(auth, "erin")
    assert refused.value.status_code == 503
    assert refused.value.log_message == DIRECTORY_UNTRUSTED
    assert "presented a TLS certificate the hub does not trust" in caplog.text
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert "set LDAPGroupsAuthenticator.tls_ca_file" in caplog.text
    # the directory never saw erin's bind: her password stayed in the hub
    log = directory.log_path.read_text(errors="replace")
    assert log.count('BIND dn="uid=erin') == binds_before


async def test_a_certificate_for_another_name_refuses_the_login(certificates, tmp_path, caplog):
    # signed by the trusted CA, but for ldap.example.edu, not the address the hub uses
    cert, key = certificates.authority.issue("ldap", server_names=["ldap.example.edu"])
    (tmp_path / "ldap.crt").write_bytes(cert)
    (tmp_path / "ldap.key").write_bytes(key)
    with LocalDirectory(tls=(tmp_path / "ldap.crt", tmp_path / "ldap.key")) as elsewhere:
        elsewhere.add_person("alice", password("alice"))
        auth = authenticator(elsewhere, certificates)
        with caplog.at_level(logging.ERROR), pytest.raises(web.HTTPError) as refused:
            await log_in(auth, "alice")
    assert refused.value.log_message == DIRECTORY_UNTRUSTED
    assert "doesn't match any name in ['127.0.0.1']" in caplog.text
    assert "server_address is a name the certificate lists" in caplog.text


# ---- groups matched exactly -------------------------------------------------------


async def test_look_alike_groups_grant_nothing(directory, certificates):
    # mallory is in " HPC-Admins " and "hpc-admin\u017f" under ou=groups, and in a group
    # called hpc-admins outside it; the policy's unlimited `test` is made of hpc-admins
    for settings in [{}, {"member_of_attribute": "memberOf"}, {"all_directory_groups": True}]:
        model = await log_in(authenticator(directory, certificates, **settings), "mallory")
        assert "test" not in model["groups"], settings
    memberof_only = authenticator(
        directory, certificates, group_search_base="", member_of_attribute="memberOf"
    )
    assert (await log_in(memberof_only, "mallory"))["groups"] == []
    # the real member still is one, by the search and by memberOf
    for settings in [{}, {"member_of_attribute": "memberOf"}]:
        assert (await log_in(authenticator(directory, certificates, **settings), "carol"))[
            "groups"
        ] == ["test"]


async def test_uid_in_the_group_filter_is_the_login_name(directory, certificates):
    # trudy's own entry says uid: bob (first) and trudy; bob is in the students posixGroup
    assert (await log_in(authenticator(directory, certificates), "trudy"))["groups"] == []
    assert (await log_in(authenticator(directory, certificates), "bob"))["groups"] == ["students"]


# ---- before a spawn: groups read again --------------------------------------------


def spawn_request(user: str, api: bool = True) -> SimpleNamespace:
    """What refresh_user reads of the hub's request handler: the request's method and
    path (the REST API's server start, or the spawn form's POST)."""
    path = f"/hub/api/users/{user}/server" if api else f"/hub/spawn/{user}"
    return SimpleNamespace(request=SimpleNamespace(method="POST", path=path))


async def test_before_a_spawn_stale_groups_are_read_again_as_the_lookup_account(
    directory, certificates
):
    auth = authenticator(
        directory,
        certificates,
        lookup_dn_search_user=ADMIN_DN,
        lookup_dn_search_password=directory.admin_password,
        group_refresh_age=0,
    )
    assert (await log_in(auth, "oscar"))["groups"] == ["research"]
    oscar = SimpleNamespace(name="oscar")
    # a page that is no spawn asks the directory nothing
    page = SimpleNamespace(request=SimpleNamespace(method="GET", path="/hub/home"))
    assert await auth.refresh_user(oscar, page) is True

    directory.set_members("research", ["alice", "erin"])  # oscar leaves research
    try:
        for api in (True, False):
            refreshed = await auth.refresh_user(oscar, spawn_request("oscar", api))
            assert refreshed == {"name": "oscar", "groups": []}
    finally:
        directory.set_members("research", ["alice", "erin", "oscar"])
    refreshed = await auth.refresh_user(oscar, spawn_request("oscar"))
    assert refreshed == {"name": "oscar", "groups": ["research"]}


async def test_groups_younger_than_the_refresh_age_are_kept(directory, certificates):
    auth = authenticator(
        directory,
        certificates,
        lookup_dn_search_user=ADMIN_DN,
        lookup_dn_search_password=directory.admin_password,
    )
    await log_in(auth, "alice")
    assert await auth.refresh_user(SimpleNamespace(name="alice"), spawn_request("alice")) is True
    # a user the hub has not read since it started is read at their first spawn
    refreshed = await auth.refresh_user(SimpleNamespace(name="bob"), spawn_request("bob"))
    assert refreshed == {"name": "bob", "groups": ["students"]}


async def test_without_a_lookup_account_a_stale_spawn_must_log_in_again(directory, certificates):
    auth = authenticator(directory, certificates, group_refresh_age=0)
    await log_in(auth, "alice")
    with pytest.raises(web.HTTPError) as refused:
        await auth.refresh_user(SimpleNamespace(name="alice"), spawn_request("alice"))
    assert refused.value.status_code == 403
    assert "Log out, log in again, then start the server" in refused.value.log_message
    # the spawn page itself sends the browser to log in again (JupyterHub's answer to False)
    page = SimpleNamespace(request=SimpleNamespace(method="GET", path="/hub/spawn"))
    assert await auth.refresh_user(SimpleNamespace(name="alice"), page) is False


async def test_a_directory_that_is_down_at_a_spawn_refuses_it(directory, certificates, caplog):
    async with silent_server() as port:
        auth = authenticator(
            directory,
            certificates,
            lookup_dn_search_user=ADMIN_DN,
            lookup_dn_search_password=directory.admin_password,
            server_port=port,
            receive_timeout=1,
            connect_timeout=1,
        )
        with caplog.at_level(logging.ERROR), pytest.raises(web.HTTPError) as refused:
            await auth.refresh_user(SimpleNamespace(name="alice"), spawn_request("alice"))
    assert refused.value.status_code == 503
    assert refused.value.log_message == DIRECTORY_DOWN_AT_SPAWN
    assert "Spawn of alice refused" in caplog.text


# ---- jupyterhub-gpu check warns about a directory talked to in clear ------------------


@pytest.mark.parametrize(
    ("settings", "warning"),
    [
        (
            {"tls_strategy": "insecure"},
            "hub.config.LDAPGroupsAuthenticator.tls_strategy: insecure sends every user's "
            "password to the directory unencrypted",
        ),
        (
            {"tls_kwargs": {"validate": 0}},
            "hub.config.LDAPGroupsAuthenticator.tls_kwargs.validate: the directory's "
            "certificate is not checked",
        ),
    ],
)
def test_check_warns_about_an_unverified_directory_and_still_passes(tmp_path, settings, warning):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"hub": {"config": {"LDAPGroupsAuthenticator": settings}}}))
    examples = [ROOT / "helm-values/base.yaml", ROOT / "helm-values/university.yaml"]
    command = [sys.executable, "-m", "jupyterhub_gpu.cli", "check"]
    result = subprocess.run(
        [*command, *map(str, examples), str(site)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert f"warning: {warning}" in result.stderr
    # the example as shipped verifies its directory: no warning
    result = subprocess.run(
        [*command, *map(str, examples)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr


# ---- the same through a real hub --------------------------------------------------


@pytest.mark.k8s
@pytest.mark.hub
async def test_a_hung_directory_refuses_logins_while_the_hub_answers_everyone_else(
    local_cluster, core, certificates
):
    async with silent_server() as port:
        settings = dict(UNIVERSITY["hub"]["config"]["LDAPGroupsAuthenticator"])
        settings.update(
            server_address="127.0.0.1",
            server_port=port,
            tls_ca_file=str(certificates.ca),
            connect_timeout=2,
            receive_timeout=2,
        )
        async with running_hub(
            local_cluster,
            core,
            z2jh_layout=True,
            policy=POLICY,
            hub_config={
                "JupyterHub": UNIVERSITY["hub"]["config"]["JupyterHub"],
                "LDAPGroupsAuthenticator": settings,
            },
        ) as hub:
            loop = asyncio.get_running_loop()
            started = loop.time()
            logins = asyncio.gather(
                *(asyncio.to_thread(Browser(hub.url).log_in, n, password(n)) for n in "abc")
            )
            # while they wait for the directory, the hub answers everyone else at once
            slowest = 0.0
            while not logins.done():
                asked = loop.time()
                status, _ = await asyncio.to_thread(hub.request, "GET", "/hub/api/", None, None, 10)
                assert status == 200
                slowest = max(slowest, loop.time() - asked)
            waited = loop.time() - started
            results = await logins
            log = hub.log_path.read_text(errors="replace")
    for status, page in results:
        assert status == 503
        assert "the directory (LDAP) did not answer in time" in page
        assert 'id="login_submit"' in page
    assert 2 <= waited < 20
    assert slowest < 0.5, f"the hub took {slowest:.2f} s to answer while logins waited"
    assert f"ldaps://127.0.0.1:{port} did not answer in time" in log
