"""``LDAPGroupsAuthenticator``: LDAP logins whose hub groups come from the directory.

ldapauthenticator's ``LDAPAuthenticator`` checks the password (and optionally
``allowed_groups``) but leaves the hub's groups alone. This subclass also reads
the user's groups from the directory at every login, as that user (the
connection their password bound), and returns them with ``manage_groups``, so
JupyterHub adds *and removes* memberships to match:

- a search under ``group_search_base`` with ``group_search_filter`` (by default
  groupOfNames/groupOfUniqueNames ``member``/``uniqueMember`` holding the user's
  DN, or posixGroup ``memberUid`` holding their login name), and/or
- the user entry's own ``member_of_attribute`` (``memberOf``: group DNs).

Only the directory groups the policy names (``GPUPolicy.groups``, by name or
by ``directory_groups``) become hub groups (``jupyterhub_gpu.core.directory``),
matched exactly; a ``memberOf`` group outside ``group_search_base`` is known by
its DN only. ``all_directory_groups`` adds the others.

Before each spawn (the form or the REST API, so API tokens too) groups read
longer ago than ``group_refresh_age`` are read again, bound as the lookup
account (``lookup_dn_search_user``); without one such a spawn is refused until
the user logs in again.

The directory is never waited for on the hub's event loop: every bind and
search runs in a worker thread (at most ``max_directory_calls`` at once), with
``connect_timeout`` and ``receive_timeout``, so a directory that hangs refuses
the logins that need it and nobody else notices. TLS (``on_connect``,
``before_bind``) checks the directory's certificate against the system's CAs or
``tls_ca_file``; only ``tls_strategy: insecure`` talks in clear.

A directory that cannot be read refuses the login with a message on the login
page, changes nobody's groups and logs the server and the cause. Nothing in the
login form but the username and password is read.

z2jh::

    hub:
      config:
        JupyterHub:
          authenticator_class: ldap-groups
        LDAPGroupsAuthenticator:
          server_address: ldap.example.edu
          tls_strategy: on_connect
          tls_ca_file: /etc/ldap-ca/ca.crt
          bind_dn_template: ["uid={username},ou=people,dc=example,dc=edu"]
          group_search_base: ou=groups,dc=example,dc=edu
          lookup_dn_search_user: cn=jupyterhub,ou=services,dc=example,dc=edu
          lookup_dn_search_password: ...
"""

from __future__ import annotations

import contextvars
import os
import ssl
import string
import time
from typing import Any

import ldap3
from ldap3.core.exceptions import LDAPBindError, LDAPException
from ldap3.core.tls import Tls
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn, parse_dn
from ldapauthenticator import LDAPAuthenticator
from ldapauthenticator.ldapauthenticator import TlsStrategy
from tornado import web
from traitlets import Bool, Float, Int, Unicode, default, validate

from ..core.directory import DirectoryGroup, dn_within, hub_groups
from .ldap_directory import (
    DirectoryCalls,
    DirectoryUnavailable,
    TLSSettingsError,
    directory_group,
    run_to_end,
    search_all,
)
from .ldap_refusals import (
    DIRECTORY_DOWN,
    DIRECTORY_DOWN_AT_SPAWN,
    DIRECTORY_SLOW,
    DIRECTORY_UNTRUSTED,
    STALE_GROUPS_AT_SPAWN,
    age_words,
    directory_failure,
)
from .policy_groups import PolicyGroups, is_spawn

# what callers import from here: the authenticator, and the words of its refusals
__all__ = [
    "DIRECTORY_DOWN",
    "DIRECTORY_DOWN_AT_SPAWN",
    "DIRECTORY_SLOW",
    "DIRECTORY_UNTRUSTED",
    "STALE_GROUPS_AT_SPAWN",
    "LDAPGroupsAuthenticator",
]

#: the connection the user's own password bound, during one login (the parent's
#: ``authenticate`` binds it and does not hand it on); a context variable, so that
#: concurrent logins never see each other's (each directory call runs in a fresh context)
_user_connection: contextvars.ContextVar[Any] = contextvars.ContextVar("ldap_user_connection")


class LDAPGroupsAuthenticator(PolicyGroups, LDAPAuthenticator):
    """LDAPAuthenticator that also sets the user's hub groups from the directory."""

    group_search_base = Unicode(
        "",
        config=True,
        help="""
        Where the groups are: every group entry below this DN whose
        ``group_search_filter`` matches the user is one of their groups, e.g.
        ``ou=groups,dc=example,dc=edu``.

        Empty: no search; the groups come from ``member_of_attribute`` alone.
        One of the two must be set.
        """,
    )

    group_name_attribute = Unicode(
        "cn",
        config=True,
        help="""
        The group entry's attribute that names it (``cn`` in OpenLDAP and Active
        Directory). A policy group takes the directory group of its own name, or
        those its ``directory_groups`` list by this name, by DN or by
        ``group_id_attribute``. Names match exactly (no case folding, no
        trimming); DNs as RFC 4514 reads them (attribute types and the letters
        A-Z of values without case, spaces around separators ignored). Only
        groups under ``group_search_base`` are known by name.
        """,
    )

    group_id_attribute = Unicode(
        "gidNumber",
        config=True,
        help="""
        A group entry's attribute whose values a policy's ``directory_groups`` may
        list as well (a posixGroup's ``gidNumber``, read as text). Empty: none.
        """,
    )

    member_of_attribute = Unicode(
        "",
        config=True,
        help="""
        The user entry's attribute listing the DNs of their groups, where the
        directory keeps one (``memberOf``: Active Directory, or OpenLDAP with the
        memberof overlay). A group whose DN is below ``group_search_base`` is
        named by its DN's first value (``cn=research,ou=groups,...`` gives
        ``research``); any other counts only where a ``directory_groups`` entry
        names its full DN (anyone allowed to create a group elsewhere in the
        directory could otherwise call it ``research``). Empty: not read. Both
        this and the ``group_search_base`` search may be used; their groups are
        merged.
        """,
    )

    all_directory_groups = Bool(
        False,
        config=True,
        help="""
        Make *every* directory group of the user a hub group, not only those the
        policy names (``GPUPolicy.groups``, by name or ``directory_groups``).

        Off by default: a site's thousands of mailing-list and department groups
        would otherwise all appear in the hub. Even when on, a directory group
        whose name is that of a policy group listing other ``directory_groups``
        (or ``everyone``) is not added by its name.
        """,
    )

    tls_ca_file = Unicode(
        "",
        config=True,
        help="""
        The CA certificates (a PEM file) that the directory's TLS certificate must
        chain to, for ``tls_strategy`` ``on_connect`` (LDAPS) and ``before_bind``
        (StartTLS); e.g. a Secret mounted with ``hub.extraVolumes``. Empty: the
        system's CAs (the hub image's ``ca-certificates``).

        The certificate is always checked (``CERT_REQUIRED``), and so is that it
        names ``server_address``: a login to a directory whose certificate does
        not verify is refused, and the log says why, before the password is
        sent. Only ``tls_strategy: insecure`` (no TLS at all) skips it, and
        ``jupyterhub-gpu check`` warns about it.
        """,
    )

    connect_timeout = Float(
        5.0,
        config=True,
        help="""
        Seconds to wait for the directory to accept a connection (and, for LDAPS,
        to finish the TLS handshake). A login that cannot connect in time is
        refused, and only that login.
        """,
    )

    receive_timeout = Int(
        5,
        config=True,
        help="""
        Seconds (whole, as ldap3 sets them on the socket) to wait for each answer of
        the directory (a bind, each page of a search). A directory that accepts the
        connection and never answers refuses the login after this long; the hub
        keeps serving everyone else meanwhile (directory calls never run on its
        event loop). Also the longest a login waits for one of the
        ``max_directory_calls``.
        """,
    )

    max_directory_calls = Int(
        8,
        config=True,
        help="""
        How many logins (and group re-reads before spawns) may talk to the
        directory at once, each in its own worker thread. More wait for a free
        one, at most ``receive_timeout`` seconds, and are then refused as a
        directory that did not answer: a slow directory costs a bounded number
        of threads, never the hub.
        """,
    )

    group_refresh_age = Int(
        300,
        config=True,
        help="""
        Before a server starts (from the spawn form or the REST API, so with an
        API token too), the user's groups are read from the directory again when
        they were read longer ago than this many seconds; 0: before every spawn.
        A member removed from a directory group thus loses its profiles within
        this time, even without logging in again.

        The hub has no password to bind with then: it binds as the lookup account
        (``lookup_dn_search_user`` and ``lookup_dn_search_password``, which need
        to read the user's entry and the groups). Without one, a spawn whose
        groups are older than this is refused with a message asking the user to
        log in again (a login reads them as the user); API tokens then cannot
        start servers past this age. Groups are remembered per hub process: after
        a hub restart the first spawn reads them again.
        """,
    )

    @default("manage_groups")
    def _manage_groups_default(self) -> bool:
        # the point of this authenticator: the directory owns group membership
        return True

    @default("refresh_pre_spawn")
    def _refresh_pre_spawn_default(self) -> bool:
        # before a spawn, groups older than group_refresh_age are read again
        return True

    @validate("group_search_base")
    def _search_base_is_a_dn(self, proposal) -> str:
        base = proposal["value"].strip()
        if base:
            try:
                parse_dn(base)
            except LDAPException as e:
                raise ValueError(
                    f"LDAPGroupsAuthenticator.group_search_base: {base!r} is not a DN ({e}); "
                    "write it as ou=groups,dc=example,dc=edu"
                ) from None
        return base

    @validate("group_search_filter")
    def _filter_names_the_user(self, proposal) -> str:
        template = proposal["value"]
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as e:
            raise ValueError(
                f"LDAPGroupsAuthenticator.group_search_filter {template!r}: {e} "
                "(a literal brace is written {{ or }})"
            ) from None
        if fields - {"userdn", "uid"} or not fields:
            raise ValueError(
                f"LDAPGroupsAuthenticator.group_search_filter {template!r} must name the user "
                "with {userdn} (their DN) and/or {uid} (their login name), and nothing else, "
                "e.g. (|(member={userdn})(memberUid={uid}))"
            )
        return template

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # rules across settings, checked once all configuration is loaded (a @validate
        # runs only for a value that changes, and sees one setting at a time)
        self.require_manage_groups("the directory", "ldapauthenticator.LDAPAuthenticator")
        if not self.group_search_base and not self.member_of_attribute:
            raise ValueError(
                "LDAPGroupsAuthenticator needs to know where the user's groups are: set "
                "group_search_base (e.g. ou=groups,dc=example,dc=edu) and/or "
                "member_of_attribute (e.g. memberOf)"
            )
        for name in ("connect_timeout", "receive_timeout", "max_directory_calls"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"LDAPGroupsAuthenticator.{name} must be more than 0, "
                    f"got {getattr(self, name)!r}"
                )
        if self.tls_strategy == TlsStrategy.insecure:
            self.log.warning(
                "LDAPGroupsAuthenticator.tls_strategy is insecure: passwords go to %s "
                "unencrypted; use on_connect (LDAPS) or before_bind (StartTLS)",
                self.server_url,
            )
        elif self.tls_kwargs.get("validate", ssl.CERT_REQUIRED) == ssl.CERT_NONE:
            self.log.warning(
                "LDAPGroupsAuthenticator.tls_kwargs turns off the check of %s's certificate: "
                "anyone on the path can pose as the directory; set tls_ca_file instead",
                self.server_url,
            )
        if not self.refresh_pre_spawn:
            self.log.warning(
                "LDAPGroupsAuthenticator.refresh_pre_spawn is off: groups are read at login "
                "only, so a member removed from a directory group keeps its profiles "
                "through API tokens and open sessions until they log in again"
            )
        # the threads directory calls run in, and when each user's groups were last read
        self._directory = DirectoryCalls(self.max_directory_calls, self.receive_timeout)
        self._groups_read: dict[str, float] = {}

    @property
    def server_url(self) -> str:
        scheme = "ldaps" if self.tls_strategy == TlsStrategy.on_connect else "ldap"
        return f"{scheme}://{self.server_address}:{self.server_port}"

    # ---- talking to the directory, off the event loop ---------------------------------

    def _tls(self) -> Tls | None:
        """The certificate check: required, against tls_ca_file or the system's CAs;
        ``tls_kwargs`` (ldapauthenticator's) may still add to or change it. None for
        ``tls_strategy: insecure`` (no TLS at all)."""
        if self.tls_strategy == TlsStrategy.insecure:
            return None
        settings: dict[str, Any] = {"validate": ssl.CERT_REQUIRED}
        if self.tls_ca_file:
            if not os.path.isfile(self.tls_ca_file):
                raise TLSSettingsError(
                    f"LDAPGroupsAuthenticator.tls_ca_file {self.tls_ca_file!r} is not a file "
                    "in the hub pod: mount the CA certificate there (hub.extraVolumes and "
                    "hub.extraVolumeMounts), or leave tls_ca_file empty for the system's CAs"
                )
            settings["ca_certs_file"] = self.tls_ca_file
        return Tls(**{**settings, **self.tls_kwargs})

    def _server(self) -> ldap3.Server:
        return ldap3.Server(
            self.server_address,
            port=self.server_port,
            use_ssl=self.tls_strategy == TlsStrategy.on_connect,
            tls=self._tls(),
            connect_timeout=self.connect_timeout,
        )

    def get_connection(self, userdn, password):
        """A connection bound as ``userdn``, or None for wrong credentials; an unreachable,
        silent or untrusted directory raises. As ldapauthenticator's, with the
        certificate checked and every wait bounded."""
        if self.tls_strategy == TlsStrategy.before_bind:
            auto_bind = ldap3.AUTO_BIND_TLS_BEFORE_BIND
        else:  # on_connect (TLS from the first byte) or insecure
            auto_bind = ldap3.AUTO_BIND_NO_TLS
        try:
            conn = ldap3.Connection(
                self._server(),
                user=userdn,
                password=password,
                auto_bind=auto_bind,
                receive_timeout=self.receive_timeout,
            )
        except LDAPBindError as e:
            self.log.debug("Failed to bind %s: %s", userdn, e)
            return None
        # the parent binds the user last (after any lookup account): the last bound
        # connection of this login is the user's own
        _user_connection.set(conn)
        return conn

    # ---- logging in -----------------------------------------------------------------

    async def authenticate(self, handler, data):
        # only the username and password are read: nothing else the form carries
        # (a forged "groups" field, say) reaches the directory or the hub
        data = {"username": data.get("username", ""), "password": data.get("password", "")}
        try:
            model, memberships = await self._directory.run(lambda: self._log_in(data))
        except (LDAPException, DirectoryUnavailable) as e:
            raise self._refuse(f"Login of {data['username']!r} refused", e) from e
        if model is None:
            return None  # a wrong password or an unknown user: the usual refusal
        model["groups"] = self._hub_groups(model["name"], memberships)
        self._groups_read[model["name"]] = time.monotonic()
        return model

    def _log_in(self, data: dict) -> tuple[dict | None, list[DirectoryGroup]]:
        """In a directory thread: the parent's login, then the user's groups read on
        the connection their password bound."""
        _user_connection.set(None)
        model = run_to_end(LDAPAuthenticator.authenticate(self, None, data))
        if model is None:
            return None, []
        conn = _user_connection.get()
        if conn is None:
            raise RuntimeError(
                "LDAPGroupsAuthenticator: ldapauthenticator authenticated "
                f"{model['name']!r} without binding through get_connection; "
                "this ldapauthenticator version is not supported"
            )
        try:
            return model, self.directory_groups(conn, model["name"])
        finally:
            conn.unbind()

    def _hub_groups(self, username: str, memberships: list[DirectoryGroup]) -> list[str]:
        mapping = hub_groups(self.gpu_policy, memberships, all_groups=self.all_directory_groups)
        self.log.info(
            "LDAP groups of %s: %d in the directory, hub groups %s%s",
            username,
            len(memberships),
            ", ".join(mapping.groups) or "none",
            f" ({len(mapping.unnamed)} not in the policy, left out)"
            if mapping.unnamed and not self.all_directory_groups
            else "",
        )
        for group in memberships:
            if not group.named and group.name in mapping.unnamed:
                self.log.info(
                    "LDAP group %s of %s is outside group_search_base %r: it counts only "
                    "where a directory_groups entry names its full DN",
                    group.name,
                    username,
                    self.group_search_base,
                )
        for name in mapping.withheld:
            self.log.warning(
                "LDAP group %r of %s is not made a hub group: the policy's group of that "
                "name is made of the directory groups its directory_groups list",
                name,
                username,
            )
        return list(mapping.groups)

    def _refuse(self, what: str, error: Exception) -> web.HTTPError:
        """The refusal a login (or a spawn's re-read) gets, with the why in the log."""
        failure = directory_failure(error, self.connect_timeout, self.receive_timeout)
        self.log.error(
            "%s: the LDAP server %s %s (%s). No one's groups changed; %s",
            what,
            self.server_url,
            failure.cause,
            failure.text,
            failure.fix,
        )
        return web.HTTPError(503, failure.message)

    # ---- before a spawn: the groups again -------------------------------------------

    @property
    def lookup_account(self) -> bool:
        return bool(self.lookup_dn_search_user and self.lookup_dn_search_password)

    async def refresh_user(self, user, handler=None, **kwargs):
        """Before a spawn, the user's groups again when older than group_refresh_age,
        read as the lookup account; anything else keeps them as they are.

        A spawn whose groups cannot be read is refused: a POST (the form's submit,
        the REST API) with a message saying why; the spawn page's GET by sending the
        browser to log in again (JupyterHub's answer to False), which reads them."""
        if not is_spawn(handler):
            return True  # pages and API reads keep the groups: no directory call
        page = handler.request.method == "GET"
        read = self._groups_read.get(user.name)
        age = None if read is None else time.monotonic() - read
        if age is not None and age < self.group_refresh_age:
            return True
        if not self.lookup_account:
            self.log.warning(
                "Spawn of %s refused: their groups were read %s (group_refresh_age "
                "%d s) and there is no lookup account (lookup_dn_search_user/password) to "
                "read them again; they must log in again",
                user.name,
                age_words(age),
                self.group_refresh_age,
            )
            if page:
                return False
            raise web.HTTPError(403, STALE_GROUPS_AT_SPAWN.format(when=age_words(age)))
        try:
            memberships = await self._directory.run(lambda: self._reread(user.name))
        except (LDAPException, DirectoryUnavailable) as e:
            self._refuse(f"Spawn of {user.name} refused", e)  # logs the why
            if page:
                return False
            raise web.HTTPError(503, DIRECTORY_DOWN_AT_SPAWN) from e
        if memberships is None:
            self.log.warning(
                "Spawn of %s refused: the directory has no entry for them any more",
                user.name,
            )
            if page:
                return False
            raise web.HTTPError(
                403, "Cannot start a server: the directory no longer knows your account."
            )
        groups = self._hub_groups(user.name, memberships)
        self._groups_read[user.name] = time.monotonic()
        return {"name": user.name, "groups": groups}

    def _reread(self, username: str) -> list[DirectoryGroup] | None:
        """In a directory thread: the user's groups, bound as the lookup account; None
        when the directory has no entry for them."""
        conn = self.get_connection(self.lookup_dn_search_user, self.lookup_dn_search_password)
        if conn is None:
            raise DirectoryUnavailable(
                f"the lookup account {self.lookup_dn_search_user!r} could not bind: check "
                "lookup_dn_search_user and lookup_dn_search_password"
            )
        try:
            userdn = self._user_dn(conn, username)
            return None if userdn is None else self.directory_groups(conn, username, userdn)
        finally:
            conn.unbind()

    def _user_dn(self, conn, username: str) -> str | None:
        """The DN of the user's entry, found as at login (bind_dn_template, or looked up)."""
        if self.lookup_dn:
            attribute = (
                self.lookup_dn_user_dn_attribute
                if self.use_lookup_dn_username
                else self.user_attribute
            )
            entries = search_all(
                conn,
                self.user_search_base,
                f"({attribute}={escape_filter_chars(username)})",
                ldap3.SUBTREE,
                [],
            )
            return entries[0]["dn"] if len(entries) == 1 else None
        for template in self.bind_dn_template:
            dn = template.format(username=escape_rdn(username))
            conn.search(dn, "(objectClass=*)", ldap3.BASE, attributes=[])
            if conn.result["result"] == 0 and conn.response:
                return dn
            if conn.result["result"] != 32:  # noSuchObject: try the next template
                raise DirectoryUnavailable(f"reading {dn!r} answered {conn.result['description']}")
        return None

    # ---- reading the groups ---------------------------------------------------------

    def directory_groups(
        self, conn, username: str, userdn: str | None = None
    ) -> list[DirectoryGroup]:
        """The groups the directory says the user is in (``userdn``: their entry; by
        default the one bound on ``conn``). ``{uid}`` in the filter is ``username``,
        the login name, never a value of the user's own entry."""
        userdn = userdn or conn.user
        attributes = [self.member_of_attribute] if self.member_of_attribute else []
        user = search_all(conn, userdn, "(objectClass=*)", ldap3.BASE, attributes)
        if not user:
            raise DirectoryUnavailable(f"the user's own entry {userdn!r} could not be read")
        found: dict[str, DirectoryGroup] = {}
        values = user[0]["attributes"]
        if self.group_search_base:
            search_filter = self.group_search_filter.format(
                userdn=escape_filter_chars(userdn), uid=escape_filter_chars(username)
            )
            wanted = [a for a in (self.group_name_attribute, self.group_id_attribute) if a]
            for entry in search_all(
                conn, self.group_search_base, search_filter, ldap3.SUBTREE, wanted
            ):
                group = directory_group(entry["dn"], entry["attributes"], self, named=True)
                found[group.aliases[0].lower()] = group
        for dn in values.get(self.member_of_attribute, []) if self.member_of_attribute else []:
            dn = str(dn)
            # a group outside the search base may be anyone's: known by its DN only
            inside = bool(self.group_search_base) and dn_within(dn, self.group_search_base)
            found.setdefault(dn.lower(), directory_group(dn, {}, self, named=inside))
        return list(found.values())
