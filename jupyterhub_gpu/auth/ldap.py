"""``LDAPGroupsAuthenticator``: LDAP logins whose hub groups come from the directory.

ldapauthenticator's ``LDAPAuthenticator`` checks the password (and optionally
``allowed_groups``) but leaves the hub's groups alone. This subclass also reads
the user's groups from the directory at every login, as that user (the
connection their password bound), and returns them with ``manage_groups``, so
JupyterHub adds *and removes* memberships to match:

- a search under ``group_search_base`` with ``group_search_filter`` (by default
  groupOfNames/groupOfUniqueNames ``member``/``uniqueMember`` holding the user's
  DN, or posixGroup ``memberUid`` holding their ``uid``), and/or
- the user entry's own ``member_of_attribute`` (``memberOf``: group DNs).

Only the directory groups the policy names (``GPUPolicy.groups``, by name or
by ``directory_groups``) become hub groups (``jupyterhub_gpu.core.directory``);
``all_directory_groups`` adds the others. A directory that cannot be read
refuses the login with a message on the login page, changes nobody's groups
and logs the server and the cause. Nothing in the login form but the username
and password is read.

z2jh::

    hub:
      config:
        JupyterHub:
          authenticator_class: ldap-groups
        LDAPGroupsAuthenticator:
          server_address: ldap.example.edu
          bind_dn_template: ["uid={username},ou=people,dc=example,dc=edu"]
          group_search_base: ou=groups,dc=example,dc=edu
"""

from __future__ import annotations

import contextvars
import string
from typing import Any

import ldap3
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import parse_dn
from ldapauthenticator import LDAPAuthenticator
from ldapauthenticator.ldapauthenticator import TlsStrategy
from tornado import web
from traitlets import Bool, Unicode, default, validate

from ..core.directory import DirectoryGroup, hub_groups
from .policy_groups import PolicyGroups

#: the connection the user's own password bound, during one login (the parent's
#: ``authenticate`` binds it and does not hand it on); a context variable, so that
#: concurrent logins never see each other's
_user_connection: contextvars.ContextVar[Any] = contextvars.ContextVar("ldap_user_connection")
#: what the login page says when the directory cannot be read; the hub log has the why
DIRECTORY_DOWN = (
    "Cannot log in right now: the directory (LDAP) could not be reached or read, so "
    "no one's login or groups can be checked. Nothing was changed. Try again in a few "
    "minutes; if it keeps happening, tell the hub's administrators."
)
_PAGE_SIZE = 500  # below OpenLDAP's and Active Directory's default size limits


class DirectoryUnavailable(Exception):
    """The directory could not be reached or answered a search with an error."""


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
        ``group_id_attribute``.
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
        memberof overlay). Each DN's first value (``cn=research,...`` gives
        ``research``) is the group's name. Empty: not read. Both this and the
        ``group_search_base`` search may be used; their groups are merged.
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

    @default("manage_groups")
    def _manage_groups_default(self) -> bool:
        # the point of this authenticator: the directory owns group membership
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
                "with {userdn} (their DN) and/or {uid} (their uid), and nothing else, "
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

    @property
    def server_url(self) -> str:
        scheme = "ldaps" if self.tls_strategy == TlsStrategy.on_connect else "ldap"
        return f"{scheme}://{self.server_address}:{self.server_port}"

    def get_connection(self, userdn, password):
        conn = super().get_connection(userdn, password)
        if conn is not None:
            # the parent binds the user last (after any lookup account): the last bound
            # connection of this login is the user's own
            _user_connection.set(conn)
        return conn

    async def authenticate(self, handler, data):
        # only the username and password are read: nothing else the form carries
        # (a forged "groups" field, say) reaches the directory or the hub
        data = {"username": data.get("username", ""), "password": data.get("password", "")}
        token = _user_connection.set(None)
        try:
            try:
                model = await super().authenticate(handler, data)
            except LDAPException as e:
                raise self._refuse(data["username"], "could not be reached", e) from e
            if model is None:
                return None  # a wrong password or an unknown user: the usual refusal
            conn = _user_connection.get()
            if conn is None:
                raise RuntimeError(
                    "LDAPGroupsAuthenticator: ldapauthenticator authenticated "
                    f"{model['name']!r} without binding through get_connection; "
                    "this ldapauthenticator version is not supported"
                )
            try:
                memberships = self.directory_groups(conn, model["name"])
            except (LDAPException, DirectoryUnavailable) as e:
                raise self._refuse(data["username"], "could not be searched", e) from e
            finally:
                conn.unbind()
        finally:
            _user_connection.reset(token)
        mapping = hub_groups(self.gpu_policy, memberships, all_groups=self.all_directory_groups)
        self.log.info(
            "LDAP groups of %s: %d in the directory, hub groups %s%s",
            model["name"],
            len(memberships),
            ", ".join(mapping.groups) or "none",
            f" ({len(mapping.unnamed)} not in the policy, left out)"
            if mapping.unnamed and not self.all_directory_groups
            else "",
        )
        for name in mapping.withheld:
            self.log.warning(
                "LDAP group %r of %s is not made a hub group: the policy's group of that "
                "name is made of the directory groups its directory_groups list",
                name,
                model["name"],
            )
        model["groups"] = list(mapping.groups)
        return model

    def _refuse(self, username: str, what: str, error: Exception) -> web.HTTPError:
        self.log.error(
            "Login of %r refused: the LDAP server %s %s (%s: %s). No one's groups changed; "
            "check that the server is up and reachable from the hub and the "
            "LDAPGroupsAuthenticator settings (server_address, server_port, tls_strategy, "
            "group_search_base)",
            username,
            self.server_url,
            what,
            type(error).__name__,
            error,
        )
        return web.HTTPError(503, DIRECTORY_DOWN)

    # ---- reading the groups ---------------------------------------------------------

    def directory_groups(self, conn, username: str) -> list[DirectoryGroup]:
        """The groups the directory says the user bound on ``conn`` is in; ``{uid}`` in
        the filter is their entry's ``uid``, or ``username`` if it has none."""
        userdn = conn.user
        attributes = ["uid"] + ([self.member_of_attribute] if self.member_of_attribute else [])
        user = self._search(conn, userdn, "(objectClass=*)", ldap3.BASE, attributes)
        if not user:
            raise DirectoryUnavailable(f"the user's own entry {userdn!r} could not be read")
        found: dict[str, DirectoryGroup] = {}
        values = user[0]["attributes"]
        if self.group_search_base:
            uid = _first(values.get("uid")) or username
            search_filter = self.group_search_filter.format(
                userdn=escape_filter_chars(userdn), uid=escape_filter_chars(uid)
            )
            wanted = [a for a in (self.group_name_attribute, self.group_id_attribute) if a]
            for entry in self._search(
                conn, self.group_search_base, search_filter, ldap3.SUBTREE, wanted
            ):
                group = _group(entry["dn"], entry["attributes"], self)
                found[group.aliases[0].casefold()] = group
        for dn in values.get(self.member_of_attribute, []) if self.member_of_attribute else []:
            found.setdefault(str(dn).casefold(), _group(str(dn), {}, self))
        return list(found.values())

    def _search(self, conn, base: str, search_filter: str, scope, attributes) -> list[dict]:
        """Every entry of a search, page by page; an error is raised, never an empty list."""
        entries: list[dict] = []
        cookie = None
        while True:
            conn.search(
                base,
                search_filter,
                scope,
                attributes=attributes,
                paged_size=_PAGE_SIZE if scope != ldap3.BASE else None,
                paged_cookie=cookie,
            )
            result = conn.result
            if result["result"] != 0:
                raise DirectoryUnavailable(
                    f"searching {base!r} for {search_filter} answered "
                    f"{result['description']} ({result['result']}) {result['message']}".rstrip()
                )
            entries += [r for r in conn.response if r.get("type") == "searchResEntry"]
            control = result.get("controls", {}).get("1.2.840.113556.1.4.319")
            cookie = control["value"]["cookie"] if control else None
            if not cookie:
                return entries


def _first(values: Any) -> str | None:
    if isinstance(values, list):
        return str(values[0]) if values else None
    return str(values) if values else None


def _group(dn: str, attributes: dict, settings: LDAPGroupsAuthenticator) -> DirectoryGroup:
    """A directory group: named by its name attribute (or its DN's first value), also
    known by its DN and its IDs."""
    name = _first(attributes.get(settings.group_name_attribute)) or parse_dn(dn)[0][1]
    ids = attributes.get(settings.group_id_attribute, []) if settings.group_id_attribute else []
    ids = ids if isinstance(ids, list) else [ids]
    return DirectoryGroup(name=name, aliases=(dn, *(str(i) for i in ids)))
