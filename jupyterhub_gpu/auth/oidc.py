"""``OIDCGroupsAuthenticator``: OIDC logins whose hub groups are the provider's, mapped.

oauthenticator's ``GenericOAuthenticator`` with ``manage_groups`` makes *every*
value of the groups claim a hub group: a site's thousands of directory groups,
Entra ID object IDs and Keycloak paths (``/research/nlp``) all appear in the
hub. This subclass maps the claim through the policy first
(``jupyterhub_gpu.core.directory``): only the groups the policy names
(``GPUPolicy.groups``, by name or by ``directory_groups``) become hub groups,
and JupyterHub adds *and removes* memberships to match, at every login and at
every refresh of the user's authentication.

A refresh asks the provider again with the user's token (the ``userdata_url``,
whose claims the provider computes at that moment); ``refresh_pre_spawn``
makes one before each spawn, so a user removed from a group in the provider
cannot start that group's profile even with a valid hub cookie, and
``auth_refresh_age`` bounds how long the hub pages keep showing the old groups.
Both need ``enable_auth_state`` (on by default here; z2jh provides the
encryption key).

A provider that cannot be reached refuses the login with a message on the
login page, changes nobody's groups, and logs the server and the cause; at a
spawn it refuses the spawn the same way, and elsewhere it keeps the groups as
they were until the provider answers. The groups come from the provider's
answer alone: nothing the user sends reaches them.

z2jh::

    hub:
      config:
        JupyterHub:
          authenticator_class: oidc-groups
        OIDCGroupsAuthenticator:
          authorize_url: https://auth.example.org/application/o/authorize/
          token_url: https://auth.example.org/application/o/token/
          userdata_url: https://auth.example.org/application/o/userinfo/
          auth_state_groups_key: oauth_user.groups
"""

from __future__ import annotations

import html
from functools import reduce
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from jupyterhub.handlers.login import LoginHandler
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthCallbackHandler
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.iostream import StreamClosedError
from traitlets import Bool, Float, Int, default

from ..core.directory import DirectoryGroup, hub_groups
from .policy_groups import PolicyGroups, is_spawn

#: what the login page says when the provider cannot be reached; the hub log has the why
PROVIDER_DOWN = (
    "Cannot log in right now: the identity provider could not be reached, so no one's "
    "login or groups can be checked. Nothing was changed. Try again in a few minutes; "
    "if it keeps happening, tell the hub's administrators."
)
#: what a spawn says when the provider cannot confirm the user's groups
PROVIDER_DOWN_AT_SPAWN = (
    "Cannot start a server right now: the identity provider could not be reached to "
    "check your groups. Nothing was started. Try again in a few minutes; if it keeps "
    "happening, tell the hub's administrators."
)


class ProviderUnreachable(Exception):
    """The identity provider did not answer (no connection, a timeout, a 5xx)."""

    def __init__(self, url: str, cause: BaseException) -> None:
        super().__init__(f"{url}: {type(cause).__name__}: {cause}")
        self.url = url
        self.cause = cause


class ProviderDown(web.HTTPError):
    """A login refused because the provider could not be reached (503)."""


def claim_group(value: Any) -> DirectoryGroup:
    """One value of the groups claim as a directory group: a name, an object ID or a
    path. A top-level path (``/research``, as Keycloak sends full paths) is also known
    by its bare name, so a policy group ``research`` takes it; a subgroup's path
    (``/research/nlp``) is known only by its path, since the same name may sit under
    several parents."""
    name = str(value)
    if name.startswith("/") and name.count("/") == 1 and len(name) > 1:
        return DirectoryGroup(name=name, aliases=(name[1:],))
    return DirectoryGroup(name=name)


def _without_query(url: str) -> str:
    # a token or code may ride in a query string: never log it
    return urlunsplit(urlsplit(url)._replace(query="", fragment=""))


class OIDCCallbackHandler(OAuthCallbackHandler):
    """The OAuth callback; a provider that is down shows the login page with why."""

    async def get(self) -> None:
        try:
            await super().get()
        except ProviderDown as e:
            # the login page again, saying what happened, rather than an error page
            # (the status still says the service is unavailable). The page of a login
            # service shows its button, not login_error: the message is its announcement
            self.set_status(e.status_code)
            page = await LoginHandler._render(
                self,
                login_error=e.log_message,
                announcement_login=html.escape(e.log_message),
            )
            self.finish(page)


class OIDCGroupsAuthenticator(PolicyGroups, GenericOAuthenticator):
    """GenericOAuthenticator whose hub groups are the provider's groups the policy names."""

    callback_handler = OIDCCallbackHandler

    groups_case_insensitive = Bool(
        False,
        config=True,
        help="""
        Match the groups claim's values to ``directory_groups`` (and to policy group
        names) without regard to the case of the letters A-Z, for a provider that
        changes the case of group names between answers. Off by default: a claim
        value matches only the identical string (no case folding beyond A-Z even
        when on, no trimming of spaces), so a group someone may create in the
        provider as ``HPC-Admins`` or `` hpc-admins`` never stands for
        ``hpc-admins``.
        """,
    )

    connect_timeout = Float(
        5.0,
        config=True,
        help="""
        Seconds to wait for the identity provider to accept a connection (token,
        userinfo and refresh requests). The requests run on the hub's event loop
        without blocking it; this bounds how long a login or a spawn's refresh
        waits for a provider that does not answer before it is refused.
        """,
    )

    request_timeout = Float(
        10.0,
        config=True,
        help="""
        Seconds to wait for the identity provider's whole answer to one request.
        A login (or a spawn's group refresh) whose provider has not answered by
        then is refused with a message, and nothing is changed.
        """,
    )

    max_provider_calls = Int(
        10,
        config=True,
        help="""
        How many requests to the identity provider may be open at once; more wait
        in line (within their ``connect_timeout``), so a slow provider ties up a
        bounded number of connections.
        """,
    )

    @default("http_client")
    def _default_http_client(self) -> AsyncHTTPClient:
        # every request to the provider bounded in time and in number (oauthenticator's
        # own client has tornado's 20 s defaults)
        return AsyncHTTPClient(
            force_instance=True,
            max_clients=self.max_provider_calls,
            defaults=dict(
                validate_cert=self.validate_server_cert,
                connect_timeout=self.connect_timeout,
                request_timeout=self.request_timeout,
            ),
        )

    @default("manage_groups")
    def _manage_groups_default(self) -> bool:
        # the point of this authenticator: the provider owns group membership
        return True

    @default("enable_auth_state")
    def _enable_auth_state_default(self) -> bool:
        # a refresh asks the provider with the token kept in the auth state
        return True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # rules across settings, checked once all configuration is loaded
        self.require_manage_groups("the identity provider", "generic-oauth")
        if not self.auth_state_groups_key:
            raise ValueError(
                "OIDCGroupsAuthenticator.auth_state_groups_key must say where the groups "
                "claim is, e.g. oauth_user.groups (the userinfo answer's groups claim)"
            )
        if self.refresh_pre_spawn and not self.enable_auth_state:
            raise ValueError(
                "OIDCGroupsAuthenticator.refresh_pre_spawn needs enable_auth_state: True "
                "(the refresh asks the provider with the token kept there); without it a "
                "user removed from a group keeps its profiles until they log in again"
            )

    # ---- the groups ----------------------------------------------------------------

    async def get_user_groups(self, auth_state: dict) -> set[str]:
        """The hub groups of the user: the groups claim, mapped through the policy.
        ``allowed_groups`` and ``admin_groups`` are checked against these."""
        claim = await self._claim(auth_state)
        memberships = [claim_group(v) for v in claim]
        mapping = hub_groups(
            self.gpu_policy, memberships, case_insensitive=self.groups_case_insensitive
        )
        user = auth_state.get(self.user_auth_state_key) or {}
        who = user.get(self.username_claim) if isinstance(self.username_claim, str) else None
        self.log.info(
            "OIDC groups of %s: %d in the claim, hub groups %s%s",
            who or "the user",
            len(memberships),
            ", ".join(mapping.groups) or "none",
            f" ({len(mapping.unnamed)} not in the policy, left out)" if mapping.unnamed else "",
        )
        return set(mapping.groups)

    async def _claim(self, auth_state: dict) -> list:
        """The groups claim's values; none when the provider sent no such claim."""
        if callable(self.auth_state_groups_key):
            return list(await super().get_user_groups(auth_state))
        value = auth_state
        for key in self.auth_state_groups_key.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            # providers leave the claim out for a user in no group (Entra ID, and any
            # whose mapper omits empty claims): no groups, said in the log
            available = reduce(
                lambda d, k: d.get(k) if isinstance(d, dict) else None,
                self.auth_state_groups_key.split(".")[:-1],
                auth_state,
            )
            self.log.warning(
                "OIDCGroupsAuthenticator: the provider sent no %r (auth_state_groups_key); "
                "the user is in no group. Keys there: %s",
                self.auth_state_groups_key,
                ", ".join(sorted(available)) if isinstance(available, dict) else "none",
            )
            return []
        if isinstance(value, str):
            return [value]  # a provider that sends one group as a string
        if not isinstance(value, list):
            raise ValueError(
                f"OIDCGroupsAuthenticator: the groups claim {self.auth_state_groups_key} "
                f"is a {type(value).__name__}, not a list of groups; point "
                "auth_state_groups_key at the claim holding the group names or IDs"
            )
        return value

    # ---- a provider that does not answer ------------------------------------------------

    async def fetch(self, req, label: str = "fetching", parse_json: bool = True, **kwargs):
        try:
            return await super().fetch(req, label=label, parse_json=parse_json, **kwargs)
        except HTTPClientError as e:
            # 599: no answer in time; 5xx: the provider is broken. A 4xx is an answer
            # (an expired token, a bad code), which the parent handles.
            if e.code == 599 or e.code >= 500:
                raise ProviderUnreachable(_without_query(req.url), e) from e
            raise
        except (OSError, StreamClosedError) as e:  # refused, reset, DNS, TLS
            raise ProviderUnreachable(_without_query(req.url), e) from e

    async def authenticate(self, handler, data=None, **kwargs):
        # the callback's code and state are all the parent reads of the request; the
        # groups come from the provider's answers alone
        try:
            return await super().authenticate(handler, data, **kwargs)
        except ProviderUnreachable as e:
            self._log_unreachable("Login refused", e)
            raise ProviderDown(503, PROVIDER_DOWN) from e

    async def refresh_user(self, user, handler=None, **kwargs):
        try:
            return await super().refresh_user(user, handler, **kwargs)
        except ProviderUnreachable as e:
            if is_spawn(handler):
                # the groups cannot be confirmed: a removed member must not start
                # the group's profile, so nobody starts anything until it answers
                self._log_unreachable(f"Spawn of {user.name} refused", e)
                raise web.HTTPError(503, PROVIDER_DOWN_AT_SPAWN) from e
            # anything else (a page, a server checking its token) keeps the groups as
            # they were; the next spawn asks again
            self.log.warning(
                "Groups of %s not refreshed: the identity provider at %s could not be "
                "reached (%s: %s); they stay as they were until it answers",
                user.name,
                e.url,
                type(e.cause).__name__,
                e.cause,
            )
            return True

    def _log_unreachable(self, what: str, error: ProviderUnreachable) -> None:
        self.log.error(
            "%s: the identity provider at %s could not be reached (%s: %s). No one's groups "
            "changed; check that it is up and reachable from the hub, and the "
            "OIDCGroupsAuthenticator settings (token_url, userdata_url)",
            what,
            error.url,
            type(error.cause).__name__,
            error.cause,
        )
