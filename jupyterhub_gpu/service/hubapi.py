"""The hub's REST API as the service uses it: list servers, stop one.

The service's token (``JUPYTERHUB_API_TOKEN``, given by the hub) needs the
scopes ``list:users``, ``read:users:groups`` and ``read:servers`` to list,
``delete:servers`` to stop.
Errors raise ``HubAPIError`` naming the call, the status and the hub's message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .views import Server

PAGE = 200
#: the service's role in the hub (z2jh: hub.loadRoles), the least it needs: list
#: users with their active servers (start time, readiness, options), stop servers
SERVICE_ROLE = "jupyterhub-gpu-service"
SERVICE_SCOPES = ("list:users", "read:users:groups", "read:servers", "delete:servers")


class HubAPIError(Exception):
    def __init__(self, call: str, status: int, message: str) -> None:
        self.status = status
        self.call = call
        hint = ""
        if status == 403:
            hint = (
                f" (the service's role {SERVICE_ROLE} needs {', '.join(SERVICE_SCOPES)};"
                " see docs/service.md)"
            )
        super().__init__(f"{call}: HTTP {status}: {message}{hint}")


class HubUnreachable(HubAPIError):
    """The hub's API did not answer at all (the hub is down, restarting or upgrading)."""


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def servers_from_users(users: list[Mapping[str, Any]]) -> list[Server]:
    """The hub's user models (with ``servers``) as ``Server`` records (pure)."""
    result = []
    for user in users:
        for name, model in (user.get("servers") or {}).items():
            profile = ((model.get("user_options") or {}).get("profile")) or None
            group, _, profile_name = (profile or "").partition("--")
            result.append(
                Server(
                    user=user["name"],
                    name=name,
                    group=group or None if profile_name else None,
                    profile=profile_name or None,
                    started=_parse_time(model.get("started")),
                    ready=bool(model.get("ready")),
                    pending=model.get("pending"),
                    last_activity=_parse_time(model.get("last_activity")),
                )
            )
    return result


@dataclass(frozen=True)
class HubServers:
    """The hub's answer about its servers."""

    servers: list[Server]
    groups: dict[str, list[str]]
    complete: bool


class HubAPI:
    def __init__(self, api_url: str, token: str, timeout: float = 30) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.http = AsyncHTTPClient()

    async def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        request = HTTPRequest(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", **headers},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=self.timeout,
        )
        try:
            response = await self.http.fetch(request)
        except OSError as e:  # refused, reset, no route: nobody answered
            raise HubUnreachable(f"{method} {path}", 0, f"the hub did not answer: {e}") from None
        except HTTPClientError as e:
            if e.code == 599:  # tornado's own: timed out or the connection failed
                raise HubUnreachable(
                    f"{method} {path}", 0, f"the hub did not answer: {e}"
                ) from None
            message = ""
            if e.response is not None and e.response.body:
                try:
                    message = json.loads(e.response.body).get("message", "")
                except ValueError:
                    message = e.response.body.decode(errors="replace")[:200]
            raise HubAPIError(f"{method} {path}", e.code, message or str(e)) from None
        return json.loads(response.body) if response.body else None

    async def active_users(self) -> list[dict[str, Any]]:
        """Every user with a server (running, starting or stopping), page by page."""
        users: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = await self.call(
                "GET",
                f"/users?state=active&offset={offset}&limit={PAGE}",
                Accept="application/jupyterhub-pagination+json",
            )
            users.extend(page["items"])
            following = (page.get("_pagination") or {}).get("next")
            if not following:
                return users
            offset = following["offset"]

    async def servers(self) -> HubServers:
        """The servers, the groups of their users (which servers started before the
        policy are charged to), and whether the answer told every user's servers."""
        users = await self.active_users()
        return HubServers(
            servers=servers_from_users(users),
            groups={u["name"]: list(u.get("groups") or ()) for u in users},
            # a role without read:servers gets users without their servers: such an
            # answer must never make a server pod look unowned
            complete=all("servers" in u for u in users),
        )

    async def server(self, user: str, name: str) -> dict[str, Any] | None:
        """The user's server ``name`` as the hub describes it now (its model: ``started``,
        ``pending``, ...); None when it is not running (or there is no such user)."""
        call = f"/users/{quote(user, safe='')}"
        try:
            model = await self.call("GET", call)
        except HubAPIError as e:
            if e.status == 404:
                return None
            raise
        if "servers" not in model:
            # without read:servers the hub answers without them: nothing can be told
            raise HubAPIError(f"GET {call}", 403, "the answer has no servers")
        return (model.get("servers") or {}).get(name)

    async def stop_server(self, user: str, name: str) -> None:
        path = f"/users/{quote(user, safe='')}/server"
        if name:
            path = f"/users/{quote(user, safe='')}/servers/{quote(name, safe='')}"
        await self.call("DELETE", path)
